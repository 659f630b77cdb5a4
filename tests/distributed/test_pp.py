"""Pipeline parallelism under kiln, gloo, 2 ranks on this machine (started by ranks.run_ranks).

Each rank's stage module (a decoder split at a block: kiln.testing.pp_models) kiln.compile'd and run by
torch.distributed.pipelining's PipelineStage under the GPipe and 1F1B schedules trains as eager pipelining
does (5 SGD steps: the last stage's losses and every stage's parameters within 1e-4 relative), each stage one
graph with no break and its backward compiled. The stages `pipeline()` cuts from a traced model
(torch.export's unflattened modules) compile the same way.
"""
from __future__ import annotations

import pytest

from ranks import RANK_TESTS, assert_training_matches, run_ranks
from pp_workers import train_pp, train_traced

pytestmark = RANK_TESTS
STEPS = 5
RTOL = 1e-4
CONFIGS = [("nanogpt", "gpipe"), ("llama", "1f1b")]


def _assert_matches(result: dict, reference: dict, what: str) -> None:
    assert len(result["losses"]) == len(reference["losses"])
    assert result["params"].keys() == reference["params"].keys()
    assert_training_matches(result, reference, what, RTOL)


# the embedding's gradient, on the first stage: index_put accumulating rows at the token ids, a scatter
# the loop IR does not write; it runs with torch, counted (as in every training graph with an embedding)
EMBEDDING_GRADIENT = {"prims.index_put": 1}


def _no_fallbacks(counters: dict, what: str, rank: int) -> None:
    assert counters.get("fallback", {}) == (EMBEDDING_GRADIENT if rank == 0 else {}), \
        (what, counters.get("fallback"))
    assert not counters.get("graph_breaks"), (what, counters.get("graph_breaks"))
    assert not {k: v for k, v in counters.get("cpp", {}).items() if k.startswith("ran with torch")}, what


@pytest.fixture(scope="module")
def runs(cache_dir):
    return run_ranks(train_pp, (CONFIGS, STEPS, cache_dir), timeout=170)


@pytest.mark.parametrize("model,schedule", CONFIGS)
def test_stages_train_as_eager_pipelining_one_graph_each(runs, model, schedule):
    for rank, result in enumerate(runs):
        eager = result[(model, schedule, "eager")]
        assert (rank == 1) == bool(eager["losses"])  # the last stage computes the loss
        if rank == 1:
            assert eager["losses"][-1] < eager["losses"][0], eager["losses"]  # (it trains)
        for variant in ("kiln", "kiln_eager"):  # kiln_eager: the captured graph run op by op
            got = result[(model, schedule, variant)]
            what = f"{model} {schedule} {variant} rank {rank}"
            assert got["type"] == "CompiledModule"
            _assert_matches(got, eager, what)
            assert (got["graphs"], got["breaks"]) == (1, 0), got["explain"]
        counters = result[(model, schedule, "kiln")]["counters"]
        _no_fallbacks(counters, f"{model} {schedule} rank {rank}", rank)
        assert counters["autograd"]["backward graphs compiled"] == 1, counters["autograd"]


def test_stages_cut_by_pipeline_tracer_compile_whole(cache_dir):
    """pipeline() hands each rank torch.export's unflattened module: its forward flattens the inputs with
    a TreeSpec and calls InterpreterModules; each was a graph break (the stage ran in pieces)."""
    ranks = run_ranks(train_traced, (STEPS, cache_dir), timeout=170)
    for rank, result in enumerate(ranks):
        assert result["kiln"]["type"] == "CompiledModule"
        _assert_matches(result["kiln"], result["eager"], f"pipeline() stage, rank {rank}")
        counters = result["kiln"]["counters"]
        _no_fallbacks(counters, f"pipeline() stage, rank {rank}", rank)
        assert counters["graphs"]["forward"] == 1 and counters["autograd"]["backward graphs compiled"] == 1, \
            counters
