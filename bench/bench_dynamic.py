"""Dynamic shapes: kiln against torch.compile (automatic dynamic) when sizes change from call to call.

Three workloads, each in one process, one run, kiln then torch.compile, each compiler with a fresh cache
directory (cold: kiln's kernel cache and Inductor's caches start empty):

  block    a decoder block (LayerNorm, qkv Linear, causal sdpa, MLP) at 30 (batch, seq) shapes. Per compiler:
           captures (kiln.counters / Dynamo's unique graphs), results equal to eager at every shape, the
           recompile-limit warning, the sum of first-call times over the 30 shapes (each first call minus
           the eager call), and the steady time at the last shape against a graph compiled statically for
           that shape (kiln.compile(dynamic=False) on a fresh cache).
  hf       HF GPT-2 and LLaMA (transformers' defaults, from configs) at 8 sequence lengths: equal to eager,
           captures, first-call times.
  decode   greedy decoding with a growing KV cache on the zoo's nanoGPT weights, 32 new tokens: tokens equal
           eager's, captures of the step function, the loop's time against eager.
  train    SGD steps of the zoo's tiny nanoGPT at 10 (batch, seq) shapes (forward, backward, step): losses
           equal to an eager copy's, captures, first-step time sum, the steady step against eager.

    python bench/bench_dynamic.py [--workloads block,hf,decode,train] [--threads N] [--json PATH]

torch.compile appears only here (bench/) and in tests: kiln never imports it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import torch
import torch._dynamo.utils
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # this checkout's kiln

import kiln  # noqa: E402
from kiln import config  # noqa: E402
from kiln.testing import models as zoo  # noqa: E402

BLOCK_SHAPES = [(1 + (i * 7) % 4, 8 + (i * 13) % 57) for i in range(30)]   # batch 1..4, seq 8..64
HF_LENGTHS = [8, 12, 16, 20, 24, 28, 32, 40]


class DecoderBlock(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


# ---- compilers -------------------------------------------------------------------------------------------

@contextlib.contextmanager
def fresh_caches() -> Any:
    """Empty kiln and Inductor cache directories for the block (cold compiles), reset in-memory caches."""
    with tempfile.TemporaryDirectory(prefix="kiln_dyn_") as tmp:
        old_env = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        old_dir = config.get("cache_dir")
        config.set("cache_dir", os.path.join(tmp, "kiln"))
        kiln.reset()
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # (unique_graphs counts this workload only)
        try:
            yield
        finally:
            config.set("cache_dir", old_dir)
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            kiln.reset()
            torch._dynamo.reset()


def compile_with(name: str, model: Any, **kw: Any) -> Any:
    if name == "kiln":
        return kiln.compile(model, **kw)
    return torch.compile(model, **kw)


def captures(name: str) -> int:
    if name == "kiln":
        return sum(kiln.counters["captures"].values())
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def steady(fn: Callable[[], Any], budget: float = 1.0) -> float:
    """Median seconds per call over about `budget` seconds (at least 5 calls)."""
    times = []
    deadline = time.perf_counter() + budget
    while len(times) < 5 or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if len(times) >= 200:
            break
    return statistics.median(times)


def close(a: Any, b: Any, tol: float = 1e-4) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    return True


# ---- workloads -----------------------------------------------------------------------------------------

def run_block(compilers: list[str]) -> list[dict]:
    torch.manual_seed(0)
    block = DecoderBlock().eval()
    inputs = [torch.randn(b, s, 64) for b, s in BLOCK_SHAPES]
    rows = []
    with torch.no_grad():
        eager_times = [steady(lambda x=x: block(x), 0.05) for x in inputs]
        for name in compilers:
            with fresh_caches(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                compiled = compile_with(name, block)
                firsts, same = [], True
                for x, eager_t in zip(inputs, eager_times):
                    t, out = timed(lambda: compiled(x))
                    firsts.append(max(t - eager_t, 0.0))
                    same &= close(out, block(x))
                n = captures(name)
                late = inputs[-1]
                dyn_t = steady(lambda: compiled(late))
                limit = any("recompile" in str(w.message).lower() and "limit" in str(w.message).lower()
                            for w in caught)
            with fresh_caches():
                static = compile_with(name, block, dynamic=False)
                static(late)
                static_t = steady(lambda: static(late))
            rows.append(dict(workload="block", compiler=name, captures=n, same=same, limit_warning=limit,
                             first_call_sum_s=sum(firsts), steady_ms=dyn_t * 1e3, static_ms=static_t * 1e3,
                             eager_ms=eager_times[-1] * 1e3))
            print(f"  block {name}: {n} captures, same={same}, first calls {sum(firsts):.1f} s, "
                  f"steady {dyn_t * 1e3:.3f} ms vs static {static_t * 1e3:.3f} ms", file=sys.stderr)
    return rows


def run_hf(compilers: list[str]) -> list[dict]:
    rows = []
    for model_name in ("hf_gpt2", "hf_llama"):
        for name in compilers:
            torch.manual_seed(0)
            model = zoo.get(model_name).factory().eval()
            with fresh_caches(), torch.no_grad():
                compiled = compile_with(name, model)
                firsts, same, after_second = [], True, 0
                for i, length in enumerate(HF_LENGTHS):
                    ids = torch.randint(0, 1000, (2, length))
                    ref_t, ref = timed(lambda: model(input_ids=ids))
                    t, out = timed(lambda: compiled(input_ids=ids))
                    firsts.append(max(t - ref_t, 0.0))
                    same &= close(out.last_hidden_state, ref.last_hidden_state)
                    if i == 1:
                        after_second = captures(name)
                n = captures(name)
            rows.append(dict(workload=model_name, compiler=name, captures=n, recaptures_after_second=n -
                             after_second, same=same, first_call_sum_s=sum(firsts)))
            print(f"  {model_name} {name}: {n} captures ({n - after_second} after the 2nd length), "
                  f"same={same}, first calls {sum(firsts):.1f} s", file=sys.stderr)
    return rows


def decode_step(model: Any, idx: torch.Tensor, cache: list, pos: int) -> tuple[torch.Tensor, list]:
    """One step of nanoGPT with a KV cache: the new tokens' logits and the grown cache."""
    x = model.wte(idx) + model.wpe(torch.arange(pos, pos + idx.shape[1]))
    new_cache = []
    for block, (k_past, v_past) in zip(model.blocks, cache):
        attn = block.attn
        h = block.ln1(x)
        b, t, c = h.shape
        q, k, v = attn.qkv(h).split(c, dim=2)
        q, k, v = (z.view(b, t, attn.heads, c // attn.heads).transpose(1, 2) for z in (q, k, v))
        k, v = torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2)
        new_cache.append((k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + attn.proj(y.transpose(1, 2).reshape(b, t, c))
        x = x + block.mlp(block.ln2(x))
    return model.lm_head(model.ln_f(x[:, -1:])), new_cache


def greedy(step: Callable, model: Any, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    heads = model.blocks[0].attn.heads
    dim = model.wte.weight.shape[1]
    empty = torch.zeros(prompt.shape[0], heads, 0, dim // heads)
    cache = [(empty, empty) for _ in model.blocks]
    tokens, idx, pos = [prompt], prompt, 0
    for _ in range(new_tokens):
        logits, cache = step(model, idx, cache, pos)
        pos += idx.shape[1]
        idx = logits.argmax(-1)
        tokens.append(idx)
    return torch.cat(tokens, dim=1)


def run_decode(compilers: list[str]) -> list[dict]:
    torch.manual_seed(0)
    model = zoo.NanoGPT(vocab=512, dim=64, heads=4, layers=2, max_len=64).eval()
    prompt = torch.randint(0, 512, (1, 8))
    rows = []
    with torch.no_grad():
        ref = greedy(decode_step, model, prompt, 32)
        eager_t = steady(lambda: greedy(decode_step, model, prompt, 32), 2.0)
        for name in compilers:
            with fresh_caches():
                step = compile_with(name, decode_step)
                first_t, out = timed(lambda: greedy(step, model, prompt, 32))
                n = captures(name)
                t = steady(lambda: greedy(step, model, prompt, 32), 2.0)
            rows.append(dict(workload="decode", compiler=name, captures=n, same=bool(torch.equal(out, ref)),
                             first_loop_s=first_t, loop_ms=t * 1e3, eager_loop_ms=eager_t * 1e3,
                             speedup=eager_t / t))
            print(f"  decode {name}: {n} captures, tokens equal={torch.equal(out, ref)}, loop {t * 1e3:.1f} ms "
                  f"vs eager {eager_t * 1e3:.1f} ms", file=sys.stderr)
    return rows


TRAIN_SHAPES = [(2 + i % 3, 8 + (i * 11) % 24) for i in range(10)]   # batch 2..4, seq 8..31 (max_len 32)


def run_train(compilers: list[str]) -> list[dict]:
    """SGD steps of the zoo's tiny nanoGPT at 10 (batch, seq) shapes: losses against an eager copy trained
    on the same batches, captures, the sum of step times over the eager step's, and the steady step."""
    import copy
    rows = []
    batches = [torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(i))
               for i, (b, t) in enumerate(TRAIN_SHAPES)]

    def step(m: Any, o: Any, idx: torch.Tensor) -> float:
        loss = m(idx).float().pow(2).mean()
        loss.backward()
        o.step()
        o.zero_grad()
        return loss.item()
    torch.manual_seed(0)
    plain = zoo.get("nanogpt_tiny").factory().train()  # the eager step, timed once before any compiler ran
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.01)
    eager_t = steady(lambda: step(plain, opt_plain, batches[-1]))
    for name in compilers:
        torch.manual_seed(0)
        model = zoo.get("nanogpt_tiny").factory().train()
        ref = copy.deepcopy(model)
        opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, ref))
        with fresh_caches():
            compiled = compile_with(name, model)
            firsts, same = [], True
            for idx in batches:
                ref_t, ref_loss = timed(lambda: step(ref, opt_ref, idx))
                t, loss = timed(lambda: step(compiled, opt, idx))
                firsts.append(max(t - ref_t, 0.0))
                same &= abs(loss - ref_loss) <= 1e-4 * max(1.0, abs(ref_loss))
            n = captures(name)
            late = batches[-1]
            step_t = steady(lambda: step(compiled, opt, late))
            recompiles = list(kiln.counters["recompiles"]) if name == "kiln" else []
        rows.append(dict(workload="train", compiler=name, captures=n, same=same, first_call_sum_s=sum(firsts),
                         steady_ms=step_t * 1e3, eager_ms=eager_t * 1e3, speedup=eager_t / step_t))
        print(f"  train {name}: {n} captures, losses equal={same}, first steps {sum(firsts):.1f} s, step "
              f"{step_t * 1e3:.2f} ms vs eager {eager_t * 1e3:.2f} ms", file=sys.stderr)
        for reason in recompiles:
            print(f"    recompile: {reason}", file=sys.stderr)
    return rows


def table(rows: list[dict]) -> str:
    keys = ["workload", "compiler", "captures", "same", "first_call_sum_s", "steady_ms", "static_ms",
            "first_loop_s", "loop_ms", "eager_loop_ms", "speedup"]
    keys = [k for k in keys if any(k in r for r in rows)]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k, "")
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="block,hf,decode,train")
    parser.add_argument("--compilers", default="kiln,torch.compile")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    compilers = args.compilers.split(",")
    rows: list[dict] = []
    for workload in args.workloads.split(","):
        rows += {"block": run_block, "hf": run_hf, "decode": run_decode, "train": run_train}[workload](compilers)
    print(table(rows))
    for w in sorted({r["workload"] for r in rows}):
        by = {r["compiler"]: r for r in rows if r["workload"] == w}
        if "kiln" in by and "torch.compile" in by and "first_call_sum_s" in by["kiln"]:
            ratio = by["kiln"]["first_call_sum_s"] / max(by["torch.compile"]["first_call_sum_s"], 1e-9)
            print(f"{w}: kiln's first-call time sum is {ratio:.2f}x torch.compile's")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
