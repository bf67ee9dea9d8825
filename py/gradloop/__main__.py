"""`python -m gradloop ...`: the same command line as the installed `gradloop` script."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
