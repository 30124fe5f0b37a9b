"""How a downstream asset takes a job's outputs as an input (``AssetIn``), the Dagster way.

    @asset(ins={"labeled": AssetIn(key=job.keys["labeled_outputs"])})
    def label_counts(labeled: pa.Table) -> dict[str, int]: ...

Every asset of a job carries this IO manager under its own key (``job.io_manager_key``), bound
to the assets themselves (``resource_defs``): a ``Definitions`` of ``job.assets`` has it with no
wiring, and a user's own ``"io_manager"`` is left alone.

Nothing is stored through it: ``labeled_outputs`` commits its own shards as they finish (one
atomic commit per shard, possibly in a bucket) and yields no output for Dagster to hand over, and
``run_metrics`` keeps its rows in the stats files and ``metrics.duckdb``. So ``handle_output``
does nothing, and ``load_input`` reads the committed files of the current output version, through
the same code as :meth:`BatchJob.read_outputs` (a bucket home is refreshed first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagster import DagsterInvariantViolationError, InputContext, IOManager, IOManagerDefinition, OutputContext

from ..errors import SparkbatchError

if TYPE_CHECKING:
    from .job import BatchJob

#: What each asset loads as; the others are read another way (the message says how).
LOADABLE = ("labeled_outputs", "run_metrics")


class JobOutputsIOManager(IOManager):
    """Loads a job's committed outputs for ``AssetIn``; stores nothing (the assets commit their own).

    ``labeled_outputs`` loads as a pyarrow Table of the labeled rows, ``run_metrics`` as a pyarrow
    Table of the per-partition statistics (one row per committed partition), both of the current
    output version only. Which partitions:

    - an unpartitioned downstream asset: every committed partition (one not yet committed is not
      there, as with :meth:`BatchJob.read_outputs`);
    - a partitioned one: the partitions Dagster maps its own to (identity with
      ``partitions_def=job.partitions_def``; another ``AssetIn(partition_mapping=...)`` as Dagster
      resolves it), each of which must be committed, else the step fails naming them.

    Example::

        @asset(partitions_def=job.partitions_def, ins={"rows": AssetIn(key=job.keys["labeled_outputs"])})
        def per_shard(rows: pa.Table) -> int:
            return rows.num_rows
    """

    def __init__(self, job: BatchJob) -> None:
        self.job = job

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        """Nothing to store: the asset has committed its shards (or rows) itself."""

    def load_input(self, context: InputContext) -> Any:
        """The committed rows the downstream asset asks for (see the class)."""
        name = self._asset_name(context)
        partitions = self._partitions(context)
        if name == "labeled_outputs":
            return self.job.read_outputs(partitions, require=partitions is not None)
        return self.job.read_run_metrics(partitions, require=partitions is not None)

    def _asset_name(self, context: InputContext) -> str:
        key = context.asset_key
        name = next((n for n, k in self.job.keys.items() if k == key), None)
        if name in LOADABLE:
            return str(name)
        db = "DuckDBResource(database=job.duckdb_path) (views labeled, label_distribution, review, reliability)"
        raise SparkbatchError(
            f"{key.to_user_string()} has no value to load as an input: name it in deps=[...] instead of ins=, and "
            f"read its results with {db}, or take {self.job.keys['labeled_outputs'].to_user_string()} or "
            f"{self.job.keys['run_metrics'].to_user_string()} as the input (docs/assets.md)")

    @staticmethod
    def _partitions(context: InputContext) -> list[str] | None:
        """The upstream partitions a partitioned downstream asset maps to; None for an
        unpartitioned one (it reads every committed partition)."""
        if not context.has_asset_partitions or not _downstream_partitioned(context):
            return None
        return list(context.asset_partition_keys)


def _downstream_partitioned(context: InputContext) -> bool:
    """Whether the asset that loads the input is partitioned (Dagster maps an unpartitioned one
    to every registered partition, committed or not: it wants what is committed instead)."""
    try:
        assets_def = context.step_context.assets_def
    except DagsterInvariantViolationError:  # a context built by hand (build_input_context): its partition key says
        return context.has_partition_key
    return assets_def is not None and assets_def.partitions_def is not None


def io_manager_def(job: BatchJob) -> IOManagerDefinition:
    """The job's IO manager as a definition the assets carry (``resource_defs``)."""
    return IOManagerDefinition.hardcoded_io_manager(
        JobOutputsIOManager(job), description=f"Loads {job.spec.name}'s committed outputs (docs/assets.md)")
