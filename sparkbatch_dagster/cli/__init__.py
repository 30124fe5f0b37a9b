"""The command line: ``sparkbatch estimate / run / status / preview / sql / worker-node /
run-batch / export-batch / serve-batch / review / prepare-model``, what a shell user sees.

Modules:

- :mod:`.commands`: the commands;
- :mod:`.early_start`: ``run``'s engine, started before it shards;
- :mod:`.entry`: the shell front end: arguments to a command;
- :mod:`.__main__`: ``python -m sparkbatch_dagster.cli``;
- :mod:`.console`: one JSON line on stdout, one-line errors on stderr, ``--debug``;
- :mod:`.locate`: finding the jobs of a definitions file and the Dagster instance;
- :mod:`.preview`: ``sparkbatch preview``: a run's plan and rendered prompts, no engine;
- :mod:`.budget`: ``run``'s brake flags (``--estimate``, ``--max-cost``, ``--deadline``);
- :mod:`.batch`: ``sparkbatch run-batch`` and ``export-batch``;
- :mod:`.serve_batch`: ``sparkbatch serve-batch``: the server's start (uvicorn) on ``..serve``'s app;
- :mod:`.review`: ``sparkbatch review export`` and ``import``: arguments, Label Studio's address and key
  (the round trip itself is ``..review``'s).

May import: every room; nothing imports it (``python -m sparkbatch_dagster.cli`` runs it).
"""

from .commands import RANGE_END, RANGE_START, summary
from .entry import main
from .locate import load

__all__ = ["RANGE_END", "RANGE_START", "load", "main", "summary"]
