"""The command line: ``sparkbatch estimate / run / status / preview / sql / worker-node /
run-batch / export-batch / serve-batch / prepare-model``, what a shell user sees.

Owns the commands (:mod:`.commands`) and their shell front end (:mod:`.entry`: arguments to a
command), the console contract (:mod:`.console`: one JSON line on stdout, one-line errors on
stderr, ``--debug``), finding the jobs of a definitions file and the
Dagster instance (:mod:`.locate`) and ``sparkbatch preview`` (:mod:`.preview`: a run's plan and
rendered prompts, no engine), and ``sparkbatch run``'s brake flags (:mod:`.budget`:
``--estimate``, ``--max-cost``, ``--deadline`` as ``labeled_outputs``' config), provider batch
files (:mod:`.batch`) and the OpenAI Batch API on the box (:mod:`.serve_batch`, its batches in
:mod:`.batch_service`).

May import: every room; nothing imports it (``python -m sparkbatch_dagster.cli`` runs it).
"""

from .commands import RANGE_END, RANGE_START, summary
from .entry import main
from .locate import load

__all__ = ["RANGE_END", "RANGE_START", "load", "main", "summary"]
