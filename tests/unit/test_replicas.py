"""Several servers (``server_urls``) against local stubs of an OpenAI-compatible server: load
balanced by in-flight count, a dead replica's rows re-sent to the live ones, pending rows only
when every replica is dead, one model on every replica (checked before any row)."""

from __future__ import annotations

from sparkbatch_dagster.engines.server.server_process import MAX_FRONTENDS, batch_server_defaults, serve_args


def test_api_server_count_reaches_vllm_serve():
    assert serve_args({"api_server_count": 4}) == ["--api-server-count", "4"]  # engine_kwargs, as any flag


def test_batch_server_defaults():
    """A server started for a batch job: no access log, no stats (as offline vllm.LLM); on a GPU a
    frontend per 4 cores (up to 4, at least one per data-parallel engine); on the CPU one, its
    cores run the model."""
    quiet = {"disable_uvicorn_access_log": True, "disable_log_stats": True}
    assert batch_server_defaults({}, cpu=False, cores=16) == {**quiet, "api_server_count": 4}
    assert batch_server_defaults({}, cpu=False, cores=128)["api_server_count"] == MAX_FRONTENDS == 4
    assert batch_server_defaults({}, cpu=False, cores=6)["api_server_count"] == 1
    assert batch_server_defaults({}, cpu=False, cores=4, engines=2)["api_server_count"] == 2
    assert batch_server_defaults({}, cpu=True, cores=64) == quiet
    assert batch_server_defaults({}, cpu=False, cores=20, nodes=2) == quiet
    given = {"api_server_count": 2, "disable_uvicorn_access_log": False, "disable_log_stats": False, "max_num_seqs": 8}
    assert batch_server_defaults(given, cpu=False, cores=64) == given


def test_a_switch_vllm_serve_has_no_negation_for_is_left_out_when_false():
    """``disable_log_stats`` is a plain switch of `vllm serve` (no ``--no-`` form): False, its
    default, is no flag at all; a flag that has both forms still gets ``--no-``."""
    assert serve_args({"disable_log_stats": False, "enable_prefix_caching": False}) == ["--no-enable-prefix-caching"]
    assert serve_args({"disable_log_stats": True}) == ["--disable-log-stats"]
