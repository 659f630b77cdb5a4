"""`kiln bench --generate`: greedy token generation at batch 1, eager, torch.compile and kiln side by side.

Each model generates N new tokens (greedy) from the same prompt with each compiler:

    eager           the model itself
    torch.compile   the model's forward compiled by torch.compile (bench/baselines.py), on a shallow copy of
                    the model (the same weights); `generate` calls the compiled forward
    kiln            kiln.compile(model): its `generate` runs the compiled forward

Hugging Face decoders run `model.generate` with the dynamic cache and with `cache_implementation="static"`;
the zoo's hand-written decoders (no cache) run a greedy loop, the whole sequence forward at every step.
A logits processor (the loop itself, for the zoo's) stamps the time after every forward: the prefill is the
time to the first stamp, a decode step the time between two stamps (the mean over one generation's steps).
Before timing, each compiler generates once from a prompt of another length (the second length): the
captures counted after the first and the second length, and after the timed runs, show whether decoding
captures again (it should not). The compilers take turns run by run; the table shows medians and the spread.

The floor of a decode step is reading every weight once: the parameters' bytes divided by the copy bandwidth
(bytes read + written per second by a 128 MB copy) measured in the same run, before and after.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..backends import cpp
from . import machine

COMPILERS = ("eager", "torch.compile", "kiln")
CACHES = ("dynamic", "static")


@dataclass(frozen=True)
class GenerateModel:
    """A decoder to generate with: `build()` makes it (random weights, eval mode); `hf` whether it is a
    Hugging Face model with `generate`; `max_len` the longest sequence it takes (None: no limit)."""
    name: str
    build: Callable[[], torch.nn.Module]
    description: str
    hf: bool = True
    vocab: int = 1000
    max_len: int | None = None


def _hf_llama(**sizes: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers
        config = transformers.LlamaConfig(**sizes)
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config).eval()
    return build


def _zoo(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from ..testing import models as zoo
        torch.manual_seed(0)
        return zoo.ZOO[name].factory().eval()
    return build


MODELS: dict[str, GenerateModel] = {m.name: m for m in (
    GenerateModel("llama_120m", _hf_llama(vocab_size=32000, hidden_size=768, intermediate_size=2304,
                                          num_hidden_layers=12, num_attention_heads=12,
                                          num_key_value_heads=12,
                                          max_position_embeddings=2048, tie_word_embeddings=True),
                  "HF LlamaForCausalLM: hidden 768, 12 layers, 12 heads, MLP 2304, vocab 32000 (tied), "
                  "float32", vocab=32000),
    GenerateModel("llama_hf_tiny", _hf_llama(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2,
                                             max_position_embeddings=256),
                  "HF LlamaForCausalLM: hidden 64, 2 layers, GQA 4q/2kv", vocab=1000),
    GenerateModel("llama", _zoo("llama"), "the zoo's Llama (no cache: the whole sequence each step)",
                  hf=False, vocab=512, max_len=64),
    GenerateModel("nanogpt", _zoo("nanogpt"), "the zoo's NanoGPT (no cache: the whole sequence each step)",
                  hf=False, vocab=512, max_len=64),
)}
DEFAULT_MODELS = ("llama_120m", "llama", "nanogpt")


@dataclass
class Options:
    models: tuple[str, ...] = DEFAULT_MODELS
    compilers: tuple[str, ...] = COMPILERS
    caches: tuple[str, ...] = CACHES
    new_tokens: int = 128
    prompt: int = 8
    repeat: int = 3
    threads: int | None = 1
    out: str | None = "bench_out"
    kiln_backend: str = "auto"
    progress: Callable[[str], None] = field(default=lambda text: None)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once (tied weights are one)."""
    seen: set[int] = set()
    total = 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total


class StepClock:
    """Called once per forward of a generation (a logits processor): the time of each call."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return scores


def generate(spec: GenerateModel, run: Callable[..., Any], ids: torch.Tensor, new_tokens: int,
             cache: str) -> tuple[torch.Tensor, float, float]:
    """Greedy generation of `new_tokens` after `ids` by `run` (a model or compiled model): the tokens, the
    prefill's seconds and a decode step's mean seconds."""
    clock = StepClock()
    with torch.no_grad():
        start = time.perf_counter()
        if spec.hf:
            from transformers import LogitsProcessorList
            kwargs: dict[str, Any] = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          do_sample=False, pad_token_id=0, eos_token_id=None,
                                          logits_processor=LogitsProcessorList([clock]))
            if cache == "static":
                kwargs["cache_implementation"] = "static"
            tokens = run.generate(ids, **kwargs)
        else:
            tokens = ids
            for _ in range(new_tokens):
                logits = run(tokens)
                clock(tokens, logits)
                tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    stamps = clock.stamps
    decode = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    return tokens, stamps[0] - start, decode


def _kiln_captures() -> int:
    from ..counters import counters
    return sum(counters["captures"].values())


def _compile(name: str, model: torch.nn.Module, kiln_backend: str) -> Any:
    if name == "eager":
        return model
    if name == "kiln":
        import kiln
        return kiln.compile(model, backend=kiln_backend)
    if name == "torch.compile":
        from .adapters import Unavailable, load_baselines
        baselines = load_baselines()
        if baselines is None or not hasattr(baselines, "torch_compile_forward"):
            raise Unavailable("bench/baselines.py (torch.compile) is not in this checkout")
        return baselines.torch_compile_forward(model, None)
    raise ValueError(f"unknown compiler {name!r}; choose from {', '.join(COMPILERS)}")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def bench_model(spec: GenerateModel, options: Options, bandwidth_gbps: float) -> list[dict[str, Any]]:
    """One row per (cache, compiler) of one model."""
    model = spec.build()
    new_tokens = options.new_tokens
    if spec.max_len is not None:
        new_tokens = min(new_tokens, spec.max_len - options.prompt - 1)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, spec.vocab, (1, options.prompt), generator=generator)
    other = torch.randint(1, spec.vocab, (1, options.prompt + 3), generator=generator)
    nbytes = weight_bytes(model)
    floor_ms = nbytes / (bandwidth_gbps * 1e9) * 1e3
    rows = []
    for cache in options.caches if spec.hf else ("none",):
        rows_of_cache: dict[str, dict[str, Any]] = {}
        runs: dict[str, Any] = {}
        for name in options.compilers:
            row: dict[str, Any] = {"model": spec.name, "cache": cache, "compiler": name,
                                   "params": sum(p.numel() for p in model.parameters()),
                                   "weight_bytes": nbytes,
                                   "floor_ms": floor_ms, "new_tokens": new_tokens, "prefill_ms": [],
                                   "decode_ms": []}
            rows_of_cache[name] = row
            try:
                options.progress(f"{spec.name} {cache} {name}: compile and two lengths")
                run = _compile(name, model, options.kiln_backend)
                before = _kiln_captures()
                began = time.perf_counter()
                tokens, _, _ = generate(spec, run, ids, new_tokens, cache)
                row["first_s"] = time.perf_counter() - began
                first = _kiln_captures()
                generate(spec, run, other, new_tokens, cache)
                second = _kiln_captures()
                row["tokens"] = tokens
                if name == "kiln":
                    row["captures"] = [first - before, second - before]
                    row["captures_before"] = before
                runs[name] = run
                row["status"] = "pass"
            except Exception as e:  # noqa: BLE001 - the row says why; the other compilers still run
                row["status"] = "error"
                row["error"] = f"{type(e).__name__}: {e}"
        for _ in range(options.repeat):   # the compilers take turns, run by run
            for name, run in runs.items():
                row = rows_of_cache[name]
                try:
                    tokens, prefill, decode = generate(spec, run, ids, new_tokens, cache)
                except Exception as e:  # noqa: BLE001
                    row["status"], row["error"] = "error", f"{type(e).__name__}: {e}"
                    continue
                row["prefill_ms"].append(prefill * 1e3)
                row["decode_ms"].append(decode * 1e3)
                if not torch.equal(tokens, row["tokens"]):
                    row["status"] = "tokens changed between runs"
        if "kiln" in runs:   # after the first length, the second, and the timed runs
            kiln_row = rows_of_cache["kiln"]
            kiln_row["captures"].append(_kiln_captures() - kiln_row.pop("captures_before"))
        eager_tokens = rows_of_cache.get("eager", {}).get("tokens")
        for name, row in rows_of_cache.items():
            tokens = row.pop("tokens", None)
            if eager_tokens is not None and tokens is not None and name != "eager":
                row["tokens_equal"] = bool(torch.equal(tokens, eager_tokens))
            prefill, decode = _median(row["prefill_ms"]), _median(row["decode_ms"])
            row.update(prefill_median_ms=prefill, decode_median_ms=decode,
                       tokens_per_s=1e3 / decode if decode else None,
                       floor_ratio=decode / floor_ms if decode else None)
            rows.append(row)
        eager = rows_of_cache.get("eager")
        for row in rows_of_cache.values():
            if eager and eager.get("decode_median_ms") and row.get("decode_median_ms"):
                row["speedup"] = eager["decode_median_ms"] / row["decode_median_ms"]
    return rows


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _spread(values: list[float]) -> str:
    return f"[{min(values):.2f}..{max(values):.2f}]" if values else ""


COLUMNS = ("model", "cache", "compiler", "prefill ms", "decode ms/token [min..max]", "tokens/s", "x eager",
           "x floor", "tokens", "captures", "status")


def table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The terminal table: one line per (model, cache, compiler), the floor of each model below."""
    cells = [list(COLUMNS)]
    for row in rows:
        equal = row.get("tokens_equal")
        captures = row.get("captures")
        cells.append([row["model"], row["cache"], row["compiler"], _cell(row.get("prefill_median_ms"), ".1f"),
                      f"{_cell(row.get('decode_median_ms'), '.2f')} {_spread(row['decode_ms'])}",
                      _cell(row.get("tokens_per_s"), ".1f"), _cell(row.get("speedup"), ".2f"),
                      _cell(row.get("floor_ratio"), ".2f"),
                      "" if equal is None else ("equal" if equal else "DIFFER"),
                      "/".join(str(c) for c in captures) if captures else "",
                      row["status"] if row["status"] == "pass" else
                      f"{row['status']}: {row.get('error', '')}"])
    from .report import _aligned
    lines = _aligned(cells, {0, 1, 2, 8, 10})
    floors = {row["model"]: row for row in rows}
    lines.append("")
    for name, row in floors.items():
        lines.append(f"{name}: {row['params'] / 1e6:.1f}M parameters, {row['weight_bytes'] / 1e6:.1f} MB of "
                     f"weights; floor {row['floor_ms']:.2f} ms/token at {meta['copy_gbps']:.2f} GB/s; "
                     f"{row['new_tokens']} new tokens after {meta['prompt']}")
    lines.append(f"threads {meta['threads']}, load {meta['load_before']} -> {meta['load_after']}, copy GB/s "
                 f"{meta['bandwidth_before']} -> {meta['bandwidth_after']}, {meta['repeat']} runs each "
                 f"(medians). x floor: decode ms/token / floor. captures: kiln's after the first prompt "
                 f"length / the second / the timed runs")
    differ = [f"{r['model']} {r['cache']} {r['compiler']}" for r in rows if r.get("tokens_equal") is False]
    if differ:
        lines.append("tokens differ from eager's: " + ", ".join(differ))
    return "\n".join(lines)


def run(options: Options) -> dict[str, Any]:
    """Every model of `options`: the rows, the run's machine figures, and the files written."""
    unknown = [name for name in options.models if name not in MODELS]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    previous = torch.get_num_threads()
    if options.threads:
        torch.set_num_threads(options.threads)
    cpp.malloc.settle()  # (before any compiler runs: all of them under the same malloc thresholds)
    try:
        before = machine.snapshot(options.threads)
        rows: list[dict[str, Any]] = []
        for name in options.models:
            rows += bench_model(MODELS[name], options, before["copy_gbps"])
        after = machine.snapshot(options.threads)
    finally:
        torch.set_num_threads(previous)
    meta = {"threads": options.threads or previous, "prompt": options.prompt, "repeat": options.repeat,
            "copy_gbps": before["copy_gbps"], "load_before": before["load"], "load_after": after["load"],
            "bandwidth_before": before["copy_gbps_median"], "bandwidth_after": after["copy_gbps_median"],
            "cpu": machine.cpu_name()}
    files = []
    if options.out:
        os.makedirs(options.out, exist_ok=True)
        path = os.path.join(options.out, "generate.json")
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
        files.append(path)
    return {"rows": rows, "meta": meta, "files": files}
