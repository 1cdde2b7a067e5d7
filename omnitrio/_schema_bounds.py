"""What a client's JSON may cost before anything compiles or parses it: nesting depth
(checked without recursion) and ``$ref`` cycles in a tool's parameters schema.

These run before the grammar engine sees a schema and before a call's arguments go
to the model: a schema that refers to itself compiles lazily and fails only while a
stream is being decoded, and ``"[" * 200000`` makes ``json`` raise ``RecursionError``.
Both are the client's errors, found here up front and named (``omnitrio.tools``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

Path = tuple[str, ...]


def depth_of(value: object, limit: int) -> int:
    """The nesting depth of plain JSON data (a scalar: 0), counted up to ``limit + 1``
    at most, without recursion."""
    deepest = 0
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, Mapping):
            children: Iterator[object] = iter(node.values())
        elif isinstance(node, list | tuple):
            children = iter(node)
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > limit:
            return deepest
        pending.extend((child, depth + 1) for child in children)
    return deepest


def loads_bounded(text: str, max_depth: int) -> object:
    """``json.loads(text)``, refusing nesting deeper than ``max_depth`` with a
    ``ValueError`` (``json`` itself would raise ``RecursionError`` past ~1000 levels)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    if depth_of(value, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    return value


def ref_cycle(schema: Mapping[str, object]) -> str | None:
    """A ``$ref`` cycle of ``schema``, as ``"#/a -> #/b -> #/a"``, or None.

    A local ``$ref`` (``#``, ``#/$defs/x``) points at a sub-schema; the sub-schema
    depends on every ``$ref`` inside it. A cycle among those dependencies (a schema
    that contains a reference to itself or to one of its ancestors included) is a
    recursive type, which the tool-call grammar cannot bound."""
    refs: list[tuple[Path, Path]] = []  # (where the $ref is, what it points at)
    pending: list[tuple[object, Path]] = [(schema, ())]
    while pending:
        node, path = pending.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.append((path, _pointer(ref[1:])))
            pending.extend((v, (*path, str(k))) for k, v in node.items())
        elif isinstance(node, list):
            pending.extend((v, (*path, str(i))) for i, v in enumerate(node))
    targets = {target for _, target in refs}
    edges: dict[Path, set[Path]] = {t: set() for t in targets}
    for where, target in refs:
        for cut in range(len(where) + 1):  # every target that contains this $ref
            if where[:cut] in edges:
                edges[where[:cut]].add(target)
    return _first_cycle(edges)


def _pointer(text: str) -> Path:
    if not text:
        return ()
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in text.lstrip("/").split("/"))


def _first_cycle(edges: Mapping[Path, set[Path]]) -> str | None:
    """A cycle of the directed graph ``edges`` (iterative depth-first search)."""
    done: set[Path] = set()
    for start in sorted(edges):
        if start in done:
            continue
        trail: list[Path] = [start]
        on_trail = {start}
        stack: list[Iterator[Path]] = [iter(sorted(edges[start]))]
        while stack:
            node = next(stack[-1], None)
            if node is None:
                stack.pop()
                done.add(trail[-1])
                on_trail.discard(trail.pop())
            elif node in on_trail:
                loop = [*trail[trail.index(node) :], node]
                return " -> ".join("#/" + "/".join(p) if p else "#" for p in loop)
            elif node not in done:
                trail.append(node)
                on_trail.add(node)
                stack.append(iter(sorted(edges.get(node, ()))))
    return None
