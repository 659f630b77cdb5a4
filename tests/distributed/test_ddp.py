"""kiln under torch.distributed with gloo, 2 ranks on this machine (started by ranks.run_ranks).

- DDP training of the zoo's nanoGPT, both wrappings (DDP(kiln.compile(m)) and kiln.compile(DDP(m))):
  losses and final parameters equal single-process eager on the full batch (each rank an equal half).
- kiln.compile(DDP(m)) with a small bucket_bytes_cap: the graph is cut into one piece per bucket, explain
  and the counters say so, a bucket's all-reduce starts before the backward ends, and the result is DDP's.
- torch.distributed collectives inside compiled code break the graph and run in program order.
- FSDP2 (fully_shard per block) on nanoGPT and the LLaMA-style model: kiln equals eager FSDP2.
"""
from __future__ import annotations

import pytest
import torch

from ddp_workers import collectives_in_compiled_code, eager_reference, train, train_fsdp
from ranks import RANK_TESTS, assert_training_matches, run_ranks

pytestmark = RANK_TESTS
STEPS = 5


def _handed_to_torch(counters: dict) -> dict:
    return {k: v for k, v in counters.get("cpp", {}).items() if k.startswith("ran with torch")}


def test_nanogpt_ddp_training_both_wrappings_match_full_batch_eager(cache_dir):
    wrappings = ["ddp_of_compiled", "compiled_ddp"]
    ranks = run_ranks(train, ("nanogpt", 4, STEPS, wrappings, cache_dir, {}), timeout=150)
    reference = eager_reference("nanogpt", 4, STEPS)
    for wrapping in wrappings:
        for rank, result in enumerate(ranks):
            assert_training_matches(result[wrapping], reference, f"{wrapping} rank {rank}")
            counters = result[wrapping]["counters"]
            assert counters["autograd"]["backward graphs compiled"] >= 1, counters
            assert not _handed_to_torch(counters), counters["cpp"]
    # nanoGPT's parameters fit DDP's first bucket (1 MiB): one piece
    assert ranks[0]["compiled_ddp"]["piece_counts"] == [1]


def test_small_buckets_split_the_graph_and_overlap_the_backward(cache_dir):
    cap_mb = 0.01  # 10485 bytes: nanogpt_tiny's ~70 KB of parameters make 4 buckets
    ranks = run_ranks(train, ("nanogpt_tiny", 4, 3, ["compiled_ddp", "ddp_of_compiled"], cache_dir,
                              {"bucket_cap_mb": cap_mb}, True), timeout=150)
    reference = eager_reference("nanogpt_tiny", 4, 3)
    for rank, result in enumerate(ranks):
        split = result["compiled_ddp"]
        assert_training_matches(split, reference, f"split rank {rank}")
        assert split["piece_counts"] == [4], split["splits"]
        assert split["counters"]["ddp"]["pieces"] == 4
        assert split["counters"]["ddp"]["graphs split at bucket boundaries"] == 1
        assert not _handed_to_torch(split["counters"]), split["counters"]["cpp"]
        # the first piece holds the embeddings; the last, the last block's MLP output and ln_f
        params = split["piece_params"][0]
        assert params[0][:2] == ["wte.weight", "wpe.weight"]
        assert params[-1][-2:] == ["ln_f.weight", "ln_f.bias"]
        assert sorted(p for piece in params for p in piece) == sorted(reference["params"])
        assert split["explain_pieces"] == [4] and "DDP bucket split" in split["explain"]
        # after DDP rebuilds its buckets (step 2 on): an all-reduce is launched while backwards remain
        for log in split["events"][1:]:
            assert log.count("backward") == 4, log
            assert log.index("allreduce") < len(log) - 1 - log[::-1].index("backward"), log
        # one compiled graph: every gradient arrives when the whole backward is done
        whole = result["ddp_of_compiled"]
        assert_training_matches(whole, reference, f"unsplit rank {rank}")
        for log in whole["events"][1:]:
            assert log.index("allreduce") > log.index("backward"), log


def test_collectives_inside_compiled_code_break_the_graph_in_program_order(cache_dir):
    ranks = run_ranks(collectives_in_compiled_code, (cache_dir,), timeout=90)
    for rank, result in enumerate(ranks):
        torch.testing.assert_close(result["actual"], result["expected"], msg=f"rank {rank}")
        torch.testing.assert_close(result["second"], result["expected_second"], msg=f"rank {rank}")
        comm = [k for k in result["breaks"] if "torch.distributed communication" in k]
        assert any("all_reduce" in k for k in comm) and any("broadcast" in k for k in comm), result["breaks"]
        assert result["explain_breaks"] >= 2, result["explain"]


@pytest.mark.parametrize("name", ["nanogpt", "llama"])
def test_fsdp2_blocks_compile_and_match_eager_fsdp2(name, cache_dir):
    ranks = run_ranks(train_fsdp, (name, 4, STEPS, cache_dir), timeout=150)
    for rank, result in enumerate(ranks):
        eager, mine = result["eager"], result["kiln"]
        assert mine["type"] == "CompiledFSDP"
        assert_training_matches(mine, eager, f"fsdp2 {name} rank {rank}")
        counters = mine["counters"]
        # each block's forward is a graph of its own, compiled with its backward
        blocks = counters["graphs"].get("GPTBlock.forward", 0) + counters["graphs"].get("LlamaBlock.forward", 0)
        assert blocks >= 1, counters["graphs"]
        assert counters["autograd"]["backward graphs compiled"] >= 1, counters
        assert not _handed_to_torch(counters), counters["cpp"]
        # the model's own frame breaks where it calls a sharded block (FSDP's hooks run there), named, and
        # resumes inside its loop over the blocks: its embeddings and head are graphs, it never runs natively
        assert any("has hooks" in k for k in counters["graph_breaks"]), counters["graph_breaks"]
        assert "has hooks" in mine["explain"]
        assert "frame run natively" not in mine["explain"], mine["explain"]
        model_graphs = {k: v for k, v in counters["graphs"].items() if "Block" not in k}
        assert sum(model_graphs.values()) >= 2, counters["graphs"]


def test_compiling_a_plain_module_imports_no_distributed_wrapper():
    # kiln.compile checks for DDP and FSDP2 wrappers without importing them: the import alone took ~0.7 s
    # of every first kiln.compile
    import subprocess
    import sys
    code = ("import sys, torch, kiln\n"
            "kiln.compile(torch.nn.Linear(2, 2))\n"
            "print('torch.distributed.fsdp' in sys.modules, 'torch.distributed._shard' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
