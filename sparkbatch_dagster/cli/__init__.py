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
- :mod:`.serve_batch`: ``sparkbatch serve-batch``, the OpenAI Files and Batches endpoints and Anthropic's
  Message Batches (uvicorn);
- :mod:`.serve_batch_app`: its FastAPI routes;
- :mod:`.serve_batch_models`: its request and response models;
- :mod:`.serve_batch_guard`: its Host, Origin, API key and body-size checks;
- :mod:`.anthropic_batches`: its Anthropic Message Batches routes;
- :mod:`.anthropic_create`: a Message Batches create checked request by request from the body's bytes;
- :mod:`.anthropic_models`: their request and response models;
- :mod:`.batch_service`: the worker that validates and runs the batches;
- :mod:`.batch_store`: the files and batches on disk;
- :mod:`.batch_validate`: a batch input file's check while it is ``validating``;
- :mod:`.batch_results`: the error lines of requests that never ran (expired, cancelled);
- :mod:`.batch_ending`: what a batch holds once it ends (result files, counts, usage);
- :mod:`.review`: ``sparkbatch review export`` and ``import``: arguments, Label Studio's address and key;
- :mod:`.label_studio`: the review queue's round trip through Label Studio (its SDK): the export;
- :mod:`.label_studio_import`: the reviewers' annotations read back as human labels;
- :mod:`.review_queue`: the rows an export sends, and the note of the last export.

May import: every room; nothing imports it (``python -m sparkbatch_dagster.cli`` runs it).
"""

from .commands import RANGE_END, RANGE_START, summary
from .entry import main
from .locate import load

__all__ = ["RANGE_END", "RANGE_START", "load", "main", "summary"]
