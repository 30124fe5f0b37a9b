"""A built job: its spec, home and assets, and what code outside Dagster needs from it (the
output version, the estimate, which partitions are done, the current outputs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetKey, AssetsDefinition, DynamicPartitionsDefinition

from ..errors import SparkbatchError
from ..estimate.records import EstimateReport, Prediction
from ..home import JobHome
from ..spec import EstimateSpec, JobSpec, fingerprint
from .resource import VLLMResource


@dataclass
class BatchJob:
    """What :func:`build_batch_assets` returns: the assets plus what a CLI needs to drive them."""

    spec: JobSpec
    home: JobHome
    partitions_def: DynamicPartitionsDefinition
    assets: list[AssetsDefinition] = field(default_factory=list)
    keys: dict[str, AssetKey] = field(default_factory=dict)
    resource_key: str = "vllm"
    #: The concurrency pool of the assets that start an engine (``build_batch_assets(pool=)``).
    pool: str | None = "gpu"

    def output_version(self, resource: VLLMResource) -> str:
        """Fingerprint of prompt + sampling + model (a cascade's stages) + input shards: the output folder's name."""
        from .cascade import model_identity

        return self.version_for(model_identity(self.spec, resource))

    def version_for(self, model_id: str) -> str:
        """:meth:`output_version` for a model identity already known (a server asked once, not twice)."""
        manifest = self.home.read_manifest()
        if manifest is None:
            shards = self.keys["input_shards"].to_user_string()
            raise SparkbatchError(f"{self.home.root} has no shards yet: materialize {shards} first")
        return fingerprint({"prompt": self.spec.prompt_fingerprint(), "model": model_id,
                            "input": manifest["signature"]})

    def estimate(self, resource: VLLMResource, est: EstimateSpec | None = None,
                 log: Callable[[str], None] = lambda _: None) -> EstimateReport:
        """Time a sample on the configured model and on each candidate in ``est.models`` (one
        engine at a time, open only while that model samples; a model whose accuracy interval
        straddles the bar samples more rows first); count the rows the result store already
        answers; predict duration and cost of the whole job (engine start included) per node
        option; name the best buy; write JSON + chart; return the report.

        Example::

            report = job.estimate(VLLMResource(), EstimateSpec(models=["gemma-3-270m"], accuracy_bar=0.2))
            report.primary.predicted_wall_s, report.chosen, report.chart   # report.to_json(): estimate.json

        ``log`` hears each step (sample drawn, each model's engine start and sample), so a
        Dagster run's log is not silent for the minutes an estimate takes.
        """
        from .estimating import estimate

        return estimate(self, resource, est or self.spec.estimate, log)

    def estimate_in_run(self, resource: VLLMResource, engine: Any, model_id: str,
                        log: Callable[[str], None] = lambda _: None) -> EstimateReport:
        """:meth:`estimate` for the configured model alone (no candidates), timed on ``engine``, the
        run's own (a ``LazyEngine``: it starts here and stays for the run, one start for both);
        writes the same report and prediction file, so ``run_metrics`` compares predicted and actual.

        Example::

            report = job.estimate_in_run(resource, engine, engine.model_id)   # then label on the same engine
            report.primary.predicted_wall_s, report.primary.engine_start_s
        """
        from .estimating import estimate_in_run

        return estimate_in_run(self, resource, engine, model_id, log)

    def done_partitions(self, resource: VLLMResource) -> list[str]:
        """Partitions committed under the resource's version (with a bucket home: in the bucket)."""
        self.home.refresh()
        manifest = self.home.read_manifest() or {"keys": []}
        if not manifest["keys"]:
            return []
        version = self.output_version(resource)
        return [k for k in manifest["keys"] if self.home.is_done(version, k)]

    def check_partitions(self, keys: list[str]) -> None:
        """Stop before any engine starts when a key is not a shard of the current manifest (a
        partition added by hand in the UI, or one from before the input was re-sharded)."""
        manifest = self.home.read_manifest()
        shards = self.keys["input_shards"].to_user_string()
        if manifest is None:
            raise SparkbatchError(f"{self.home.root} has no shards yet: materialize {shards} first")
        unknown = sorted(set(keys) - set(manifest["keys"]))
        if unknown:
            have = manifest["keys"]
            span = f"{have[0]} .. {have[-1]}" if have else "none"
            raise SparkbatchError(
                f"partition(s) {unknown[:5]} are not shards of {self.home.root} (it has {len(have)}: {span}): "
                f"pick partitions that {shards} registered, or materialize {shards} again if the input or "
                "shard_count changed"
            )

    def current_version(self) -> str:
        """The output version the latest ``labeled_outputs`` run wrote (no engine resource needed)."""
        current = self.home.read_current()
        if current is None:
            raise SparkbatchError(f"{self.home.root} has no labeled outputs yet: materialize "
                                  f"{self.keys['labeled_outputs'].to_user_string()} first")
        return current.version

    def read_outputs(self, partitions: list[str] | None = None, require: bool = False) -> Any:
        """The current labeled rows (every committed partition, or ``partitions``) as a pyarrow
        Table: what a downstream asset reads, without an engine resource, as the ``labeled`` view
        shows them: reviewers' labels over the model's and the newest calibrated confidence. ``require``: each of
        ``partitions`` must be committed (else an error naming them); without it one that is not
        is left out.

        Example::

            @asset(deps=[job.keys["labeled_outputs"]])
            def label_counts() -> dict:
                table = job.read_outputs()
                return dict(Counter(table.column("output").to_pylist()))

        (Or ``ins={"labeled": AssetIn(key=job.keys["labeled_outputs"])}``: the job's IO manager
        reads it the same way, ``outputs_io.py``.)
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ..run.checkpoint import OUTPUT_SCHEMA
        from ..run.review_marks import Marks, marked

        version, keys = self._committed(partitions, require)
        # With the schema: files written before a column existed read with it null.
        tables = [pq.read_table(self.home.labeled_path(version, k), schema=OUTPUT_SCHEMA) for k in keys]
        # What the views show: reviewers' labels and the newest calibration (run/review_marks.marked).
        return marked(pa.concat_tables(tables), Marks.of(self.spec, self.home)) if tables \
            else OUTPUT_SCHEMA.empty_table()

    def read_run_metrics(self, partitions: list[str] | None = None, require: bool = False) -> Any:
        """The current version's per-partition statistics (rows, errors, tokens, seconds, cost:
        ``run_metrics``' columns) as a pyarrow Table, one row per committed partition (or of
        ``partitions``, as :meth:`read_outputs` takes them).

        Example::

            stats = job.read_run_metrics()
            sum(stats.column("cost_usd").to_pylist())
        """
        import pyarrow as pa

        from ..run.metrics import METRIC_COLUMNS, committed_stats

        version, keys = self._committed(partitions, require)
        stats = committed_stats(self.home, version)
        arrow = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64()}  # run_metrics' DuckDB types
        schema = pa.schema([(c, arrow[t]) for c, t in METRIC_COLUMNS])
        rows = [stats[k].to_json() for k in keys]
        return pa.Table.from_pylist([{c: r.get(c) for c in schema.names} for r in rows], schema=schema)

    def _committed(self, partitions: list[str] | None, require: bool) -> tuple[str, list[str]]:
        """The current output version and those of ``partitions`` (None: every shard) it has
        committed; with ``require``, an error naming the ones it has not."""
        self.home.refresh()  # a bucket home: the bucket's current version and commits
        version = self.current_version()
        keys = partitions if partitions is not None else (self.home.read_manifest() or {"keys": []})["keys"]
        done = [k for k in keys if self.home.is_done(version, k)]
        missing = [k for k in keys if k not in done]
        if require and missing:
            raise SparkbatchError(
                f"partition(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} of "
                f"{self.keys['labeled_outputs'].to_user_string()} have no committed output in the current version "
                f"{version} ({self.home.location}): materialize {self.keys['labeled_outputs'].to_user_string()} "
                "for them first")
        return version, done

    @property
    def duckdb_path(self) -> str:
        """The job's DuckDB file (table ``run_metrics``, views ``labeled``, ``label_distribution``,
        ``review``, ``reliability``, refreshed by the ``analytics`` asset), for dagster-duckdb.

        Example::

            @asset(deps=[job.keys["analytics"]])
            def top_label(duckdb: DuckDBResource) -> str:
                with duckdb.get_connection() as con:
                    return con.execute("FROM label_distribution LIMIT 1").fetchone()[0]

            Definitions(assets=[*job.assets, top_label],
                        resources={"vllm": vllm, "duckdb": DuckDBResource(database=job.duckdb_path)})
        """
        return str(self.home.metrics_db)

    @property
    def io_manager_key(self) -> str:
        """The resource key of the IO manager the job's assets carry (``outputs_io.py``)."""
        return "__".join([*self.keys["labeled_outputs"].path[:-1], "sparkbatch_outputs_io_manager"])

    def table(self) -> Any:
        """The job's Delta Lake table (``spec.sink``) as delta-rs reads it, or None before its first
        sync: what a downstream asset or a notebook reads instead of the home's files.

        Example::

            rows = job.table().to_pyarrow_table(columns=["row_id", "output"])
        """
        from ..run.table_sink import open_table

        return open_table(self.spec)

    def sync_table(self) -> dict[str, Any]:
        """Bring the table in step with the committed shards now (``analytics`` does it on each
        materialization); a no-op when it already is. Returns what it did.

        Example::

            job.sync_table()["shards_added"]
        """
        from ..run.table_sink import sync_table

        self.home.refresh()
        return sync_table(self.spec, self.home, self.current_version())

    def prediction(self, version: str) -> Prediction | None:
        """The estimate's prediction file for this version (written by every estimate), or None."""
        return Prediction.read(self.home.prediction_path(version))

    def expected_rows_per_s(self, version: str, pred: Prediction | None = None) -> float | None:
        """The estimate's generation rate for this version (``pred``: its prediction, when the
        caller has it read), to quote an ETA before the run has its own."""
        pred = pred or self.prediction(version)
        if pred is None or not pred.predicted_wall_s:
            return None
        return (pred.total_rows - pred.stored_rows) / pred.predicted_wall_s

