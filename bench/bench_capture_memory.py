"""Peak memory while capturing a large model: kiln against Dynamo (both backend="eager"), and eager's forward.

Issue 41's measure: HF LLaMA from a config (hidden 2048, 8 layers, 16 heads, intermediate 5632, vocab 32000:
2 GiB of float32 weights, random), batch 1, `--tokens` tokens, under torch.no_grad(), one thread. For each
of eager's forward, kiln's capture and Dynamo's capture, in one process and in that order: the peak resident
memory above what the process held before, sampled every millisecond by a thread, from the call until the
backend receives the graph (capture alone: the backend then runs it with torch). Memory the allocator keeps
after a phase lowers the next phase's figure, so each compiler's figure is its own capture's worst case only
roughly; run `--compilers kiln` alone for kiln's figure with nothing before it but eager's forward.

    python bench/bench_capture_memory.py [--tokens 128,512] [--layers 8] [--hidden 2048]
                                         [--compilers kiln,dynamo]

The target: capture's peak at most 0.1x the weights plus one layer's activations above what the process
held (its weights included). torch._dynamo appears only here (bench/) and in tests: kiln never imports it.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # this checkout's kiln

import kiln  # noqa: E402
from kiln.backends import torch_callable  # noqa: E402


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakUntil:
    """Samples resident memory from `start()` until `stop()`: the peak above the start, and the seconds."""

    def start(self) -> None:
        gc.collect()
        self.base = self.peak = rss()
        self.running = True
        self.t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def stop(self) -> None:
        if self.running:
            self.seconds = time.perf_counter() - self.t0
            self.running = False
            self.thread.join()
            self.peak = max(self.peak, rss())

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / 2**20


def build(hidden: int, layers: int) -> torch.nn.Module:
    import transformers
    config = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers,
                                      intermediate_size=hidden * 11 // 4, num_attention_heads=16,
                                      num_key_value_heads=16, vocab_size=32000)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def capture(compiler: str, model: torch.nn.Module, ids: torch.Tensor, meter: PeakUntil) -> None:
    def backend(graph: Any, example_inputs: Any, *rest: Any) -> Callable[..., Any]:
        meter.stop()  # capture is done: what follows is the graph's run
        return torch_callable(graph) if compiler == "kiln" else graph.forward
    if compiler == "kiln":
        kiln.reset()
        compiled = kiln.compile(model, backend=backend)
    else:
        import torch._dynamo
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
    meter.start()
    compiled(ids)
    meter.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="128,512")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--compilers", default="kiln,dynamo")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = build(args.hidden, args.layers)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    print(f"HF LLaMA hidden {args.hidden}, {args.layers} layers: weights {weights:.0f} MiB; the target: "
          f"capture's peak at most +{0.1 * weights:.0f} MiB plus one layer's activations\n")
    print("| tokens | phase | peak above before (MiB) | seconds |")
    print("|---|---|---|---|")
    kiln.compile(lambda x: x + 1, backend="eager")(torch.ones(2))  # (kiln's one-time costs)
    for tokens in (int(t) for t in args.tokens.split(",")):
        ids = torch.randint(0, 32000, (1, tokens), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            meter = PeakUntil()
            meter.start()
            model(ids)
            meter.stop()
            print(f"| {tokens} | eager forward | {meter.mib:.0f} | {meter.seconds:.2f} |", flush=True)
            for compiler in args.compilers.split(","):
                meter = PeakUntil()
                try:
                    capture(compiler, model, ids, meter)
                    print(f"| {tokens} | {compiler} capture | {meter.mib:.0f} | {meter.seconds:.2f} |", flush=True)
                except Exception as e:
                    meter.stop()
                    print(f"| {tokens} | {compiler} capture | error: {type(e).__name__}: {str(e)[:80]} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
