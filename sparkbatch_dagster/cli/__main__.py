"""``python -m sparkbatch_dagster.cli``: the ``sparkbatch`` command."""

from .commands import main

raise SystemExit(main())
