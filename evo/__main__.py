"""``python -m evo``: the command-line interface."""

from evo.cli import main

raise SystemExit(main())
