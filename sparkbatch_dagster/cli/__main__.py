"""``python -m sparkbatch_dagster.cli``: the ``sparkbatch`` command."""

from .entry import main

raise SystemExit(main())
