"""``python -m omnitrio``: the ``omnitrio`` command line (``_cli.py``)."""

from ._cli import main

raise SystemExit(main())
