"""`kiln bench --distributed N --strategy pp|fsdp` on 2 gloo ranks, a few steps: every variant runs, each
step is timed on the slowest rank, and the table shows kiln's graphs (the shared timing loop of the
distributed benches: kiln.bench.distributed.time_variants)."""
from __future__ import annotations

from kiln.bench import distributed, distributed_pp

from ranks import RANK_TESTS

pytestmark = RANK_TESTS
STEPS = 3


def _check(results: dict, variants: tuple) -> None:
    assert list(results) == list(variants)
    for variant, entry in results.items():
        assert entry["status"] == "ok", (variant, entry["status"])
        assert len(entry["times"]) == STEPS and all(t > 0 for t in entry["times"]), entry
        assert entry["first"] > 0


def test_pipeline_bench_times_eager_and_kiln_stages():
    variants = ("eager PP", "kiln PP")
    results = distributed_pp.run(2, "nanogpt", "1f1b", variants, steps=STEPS, warmup=1, timeout_s=170)
    _check(results, variants)
    assert results["kiln PP"]["graphs"] == (1, 0)
    text = distributed_pp.table(results, 2, "nanogpt", "1f1b", STEPS)
    assert "kiln PP" in text and "1 graphs, 0 breaks" in text and "vs eager PP" in text


def test_fsdp_bench_times_eager_and_kiln():
    variants = ("eager FSDP2", "kiln FSDP2")
    results = distributed.run(2, "nanogpt", variants, steps=STEPS, warmup=1, timeout_s=170)
    _check(results, variants)
    assert results["kiln FSDP2"]["graphs"][0] >= 1
    assert "vs eager FSDP2" in distributed.table(results, 2, "nanogpt", STEPS, "fsdp")
