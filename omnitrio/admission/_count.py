"""The most streams a stage keeps in real time, found in a few questions.

``StepModel.realtime_streams`` asks a stage's model, count by count, whether ``n``
streams keep their factor, and a ``/metrics`` scrape asks it of every stage up to
``max_streams`` (256 by default; a model that keeps all of them is asked 256 times, each
question a round's cost and a margin, on the trio thread). The answer holds for every
count below it and for none above it (a round's cost grows with its streams), so it is
found by doubling from one stream to the first count that fails, then halving between:
about ``2 log2(n)`` questions.
"""

from __future__ import annotations

from collections.abc import Callable


def largest_holding(holds: Callable[[int], bool], cap: int) -> int:
    """The largest ``n`` in ``1..cap`` for which ``holds(n)`` (0: not even one), taking it
    to hold for every count below one that holds and for none above one that fails."""
    if cap < 1 or not holds(1):
        return 0
    good, n = 1, 2
    while n <= cap and holds(n):
        good, n = n, 2 * n
    bad = min(n, cap + 1)  # fails there, or lies past the cap
    while bad - good > 1:
        middle = (good + bad) // 2
        if holds(middle):
            good = middle
        else:
            bad = middle
    return good
