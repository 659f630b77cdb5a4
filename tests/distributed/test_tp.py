"""Tensor parallelism under kiln, gloo, 2 ranks on this machine (started by ranks.run_ranks).

A model prepared by parallelize_module (ColwiseParallel/RowwiseParallel) and kiln.compile'd trains as eager
TP does (5 SGD steps: losses and full parameters within 1e-4 relative) in one graph per frame with the
layouts' all-reduces inside it (kiln.explain lists them), where before each parallelized Linear's hooks broke
the graph. Layouts kiln does not compile over shards keep the hooks: visible breaks, eager's values.
"""
from __future__ import annotations

import pytest
import torch

from ranks import RANK_TESTS, assert_training_matches, run_ranks
from tp_workers import train_tp

pytestmark = RANK_TESTS
STEPS = 5
RTOL = 1e-4


def _check_run(result: dict, name: str, what: str) -> None:
    kiln_run = result["kiln"]
    assert kiln_run["type"] == "CompiledTP"
    assert_training_matches(kiln_run, result["eager"], what)
    assert result["kiln_eager"]["type"] == "CompiledTP"
    assert_training_matches(result["kiln_eager"], result["eager"], f"{what} (backend eager)")
    assert (kiln_run["graphs"], kiln_run["breaks"]) == (1, 0), kiln_run["explain"]
    assert kiln_run["raw_model_counts"] == (1, 0)
    explain = kiln_run["explain"]
    assert "collectives in graph 1:" in explain and "torch.ops.kiln_tp.all_reduce x2" in explain, explain
    counters = kiln_run["counters"]
    assert counters["autograd"]["backward graphs compiled"] == 1, counters
    # forward: one all-reduce per row-parallel Linear (2); backward: one per replicated input of
    # column-parallel Linears that needs a gradient, the gradients of gate's and up's (wq/wk/wv's) input
    # summed first (eager TP all-reduces each: 2 for the MLP, 5 for the LLaMA block)
    backward = {"mlp": 1, "llama": 2}[name]
    assert counters["extern"]["prims.all_reduce"] == 2 + backward, counters["extern"]
    assert not {k: v for k, v in counters.get("cpp", {}).items() if k.startswith("ran with torch")}


def _check_training(ranks: list, configs: list) -> None:
    for config_ in configs:
        for rank, result in enumerate(ranks):
            _check_run(result[config_], config_[0], f"{config_} rank {rank}")
        assert ranks[0][config_]["kiln"]["losses"] == ranks[1][config_]["kiln"]["losses"]


FAST = [("mlp", False), ("llama", False)]


@pytest.fixture(scope="module")
def fast_runs(cache_dir):
    """The fast tests' rank results, from one set of ranks (spawning and compiling dominate)."""
    return run_ranks(train_tp, (FAST, STEPS, cache_dir, True), timeout=170)


def test_tp_swiglu_mlp_and_llama_block_train_as_eager_tp_in_one_graph(fast_runs):
    # the two-block SwiGLU MLP and a LLaMA-style block (attention + SwiGLU, Colwise/Rowwise plan)
    _check_training(fast_runs, FAST)


def test_unsupported_layout_breaks_visibly_and_matches_eager(fast_runs):
    # ColwiseParallel(output_layouts=Replicate()): an all-gather kiln does not write over shards
    for ranks_result in fast_runs:
        result = ranks_result["unsupported"]
        torch.testing.assert_close(result["actual"], result["expected"], rtol=RTOL, atol=1e-6)
        assert result["type"] == "CompiledModule"
        assert result["breaks"] >= 1 and "has hooks" in result["explain"], result["explain"]


@pytest.mark.slow
def test_tp_with_biases_trains_as_eager_tp(cache_dir):
    # column-parallel biases are sharded, the row-parallel bias replicated (added after the all-reduce)
    configs = [("mlp", True)]
    _check_training(run_ranks(train_tp, (configs, STEPS, cache_dir), timeout=170), configs)


def test_tp_times_dp_on_four_ranks_trains_as_eager(cache_dir):
    """TP x DP on 4 ranks: parallelize_module over a mesh's tp dimension, FSDP2 over its dp dimension. kiln
    does not compile over a 2-D mesh's shards yet: the model compiles as FSDP2's (kiln.compile's
    CompiledFSDP) and each hooked Linear is a graph break named by kiln.explain; steps equal eager 2-D."""
    from tp_workers import train_tp_dp
    ranks = run_ranks(train_tp_dp, (STEPS, cache_dir), world_size=4, timeout=240)
    for rank, result in enumerate(ranks):
        assert_training_matches(result["kiln"], result["eager"], f"tp x dp rank {rank}")
        assert result["kiln"]["type"] == "CompiledFSDP"
        assert "has hooks" in result["kiln"]["explain"], result["kiln"]["explain"]
    # the tp pairs see the same batches, the dp groups different ones
    assert ranks[0]["eager"]["losses"] == ranks[1]["eager"]["losses"]
    assert ranks[0]["eager"]["losses"] != ranks[2]["eager"]["losses"]
