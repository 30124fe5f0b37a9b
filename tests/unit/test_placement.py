"""How a node option runs a model (sparkbatch_dagster.estimate.placement): engines per option, the
settings the estimate prints, options that cannot hold a model left unpriced."""

from sparkbatch_dagster.estimate.choice import advise
from sparkbatch_dagster.estimate.forecast import predict
from sparkbatch_dagster.estimate.machine import Machine
from sparkbatch_dagster.estimate.placement import gpus_needed, place
from sparkbatch_dagster.estimate.sample import Sample, Timing
from sparkbatch_dagster.spec import EstimateSpec, NodeOption

SPARK = NodeOption(name="1 node", hourly_usd=0.79, hardware="dgx-spark")
SPARK2 = NodeOption(name="2-node cluster", hourly_usd=1.79, nodes=2, hardware="dgx-spark")
H200 = NodeOption(name="1x H200", hourly_usd=3.5, hardware="h200")
H200X2 = NodeOption(name="2x H200", hourly_usd=7.0, gpus_per_node=2, hardware="h200")
H200X8X2 = NodeOption(name="2 nodes of 8 H200", hourly_usd=60.0, nodes=2, gpus_per_node=8, memory_gb=141)
#: Samples as if timed on one H200 / one DGX Spark: options of that kind are priced as measured.
ON_H200, ON_SPARK = Machine("h200", "NVIDIA H200"), Machine("dgx-spark", "NVIDIA GB10")


def test_a_model_that_fits_one_gpu_runs_one_engine_per_gpu():
    one = place(1, SPARK)
    assert one is not None and one.engines == 1 and one.settings == {} and one.runs == 1
    host = place(1, H200X2)  # both GPUs of one host, one run
    assert host is not None and host.engines == 2 and host.runs == 1
    assert host.settings == {"data_parallel_size": 2} and "VLLMResource(data_parallel_size=2)" in host.how
    two = place(1, SPARK2)  # two machines: one Dagster run each, placed by the run launcher
    assert two is not None and two.engines == 2 and two.runs == 2 and "docs/deploy-k8s.md" in two.how


def test_a_model_over_several_gpus_of_one_node_uses_tensor_parallel_there():
    tp2 = place(2, H200X2)
    assert tp2 is not None and tp2.engines == 1 and tp2.nnodes == 1
    assert tp2.settings == {"tensor_parallel_size": 2}
    big = place(4, H200X8X2)  # two engines of 4 GPUs per node, one run per node
    assert big is not None and big.engines == 4 and big.settings == {"tensor_parallel_size": 4, "data_parallel_size": 2}


def test_a_model_larger_than_a_node_spans_nodes_with_vllms_multi_node_mode():
    two = place(2, SPARK2)
    assert two is not None and two.nnodes == 2 and two.engines == 1
    assert two.settings["engine_kwargs"]["nnodes"] == 2 and "--node-rank" in two.how
    sixteen = place(16, H200X8X2)
    assert sixteen is not None and sixteen.nnodes == 2 and sixteen.settings["tensor_parallel_size"] == 16
    assert place(4, SPARK2) is None  # 4 GPUs needed, 2 there
    assert place(4, NodeOption(name="odd", hourly_usd=1.0, nodes=2, gpus_per_node=3)) is None  # 4 does not split 3+3


def test_the_estimate_prices_each_option_by_its_engines_and_leaves_out_what_cannot_hold_the_model():
    sample = Sample(rows=[{}] * 50, warmup=[], total_rows=1000, distinct_prompts=1000)
    timing = Timing(model="m@1", rows=50, requests=50, seconds=10.0, prompt_tokens=5000, output_tokens=500,
                    engine_start_s=30.0, correct=None, errors=0)
    small = predict(sample, timing, [H200, H200X2], weights_gb=16.0, machine=ON_H200)
    one, host = small.options
    assert host.engines == 2 and host.wall_s == round(one.wall_s / 2, 1)
    text = " ".join(advise(small, small, EstimateSpec(), 50, batch=50, on_gpu=True, has_gold=False))
    assert "'2x H200' would finish in" in text and "so more GPUs raise the cost" in text
    seventy = 140.0  # a 70B model in bf16
    assert gpus_needed(seventy, 141) == 2
    big = predict(sample, timing, [SPARK, H200X2, SPARK2], weights_gb=seventy, machine=ON_SPARK)
    spark, host, cluster = big.options
    assert not spark.fits and spark.cost_usd is None and spark.engines == 0
    assert host.fits and host.settings == {"tensor_parallel_size": 2}
    assert cluster.fits and cluster.settings["engine_kwargs"]["nnodes"] == 2
    assert host.speed_basis == "unknown" and host.cost_usd is None  # no model size to project an H200 from
    assert big.best_option == "2-node cluster"
