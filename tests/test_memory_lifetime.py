"""A compiled model's memory is freed when the user drops the model and the compiled object, without
kiln.reset(): nothing process-wide keeps cache entries (and the modules and parameters their guards hold)
alive. Compiling models in a loop (a notebook, a sweep, a test suite) must not grow memory. A kept model
still hits its cache, and a new model of the same class hits the disk caches."""
from __future__ import annotations

import gc
import weakref

import torch

import kiln


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


class _Printing(torch.nn.Module):
    """A graph break in forward: the entry runs a graph, the print, and a resume function."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(16, 16)
        self.second = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x).relu()
        print("", end="")
        return self.second(x)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


class _LoopPrinting(torch.nn.Module):
    """A graph break inside a loop: the frame runs natively, its calls to the blocks captured as their own
    frames (callees)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            print("", end="")
            x = block(x)
        return x


def _assert_freed(refs: list[weakref.ref]) -> None:
    gc.collect()
    alive = [tuple(r().shape) for r in refs if r() is not None]
    count = len(alive)
    assert count == 0, (f"{count} of {len(refs)} parameters are alive after the model and its compiled "
                        f"object were dropped: {alive}")


def _weights(model: torch.nn.Module) -> list[weakref.ref]:
    return [weakref.ref(p) for p in model.parameters()]


def _compile_call_drop(build, compile_, train: bool = False) -> list[weakref.ref]:
    model = build()
    compiled = compile_(model)
    out = compiled(torch.randn(2, 16))
    if train:
        out.sum().backward()
    out = compiled(torch.randn(2, 16))  # (a second call: through the cache)
    refs = _weights(model)
    del model, compiled, out
    return refs


def test_module_compiled_with_the_eager_backend_is_freed():
    _assert_freed(_compile_call_drop(_mlp, lambda m: kiln.compile(m, backend="eager")))


def test_module_compiled_with_the_default_backend_is_freed():
    _assert_freed(_compile_call_drop(_mlp, kiln.compile))


def test_function_closing_over_a_module_is_freed():
    def compile_closure(model):
        return kiln.compile(lambda x: model(x), backend="eager")

    _assert_freed(_compile_call_drop(_mlp, compile_closure))


def test_module_with_a_graph_break_is_freed():
    _assert_freed(_compile_call_drop(_Printing, lambda m: kiln.compile(m, backend="eager")))


def test_module_with_a_graph_break_compiled_with_the_default_backend_is_freed():
    _assert_freed(_compile_call_drop(_Printing, kiln.compile))


def test_module_run_natively_with_captured_callees_is_freed():
    _assert_freed(_compile_call_drop(_LoopPrinting, lambda m: kiln.compile(m, backend="eager")))


def test_a_dropped_model_is_freed_while_another_of_its_class_lives():
    # callees (here each _Block.forward) are captured per compiled model: a live model's callee caches
    # hold nothing of a dropped one
    kept = _LoopPrinting()
    compiled_kept = kiln.compile(kept, backend="eager")
    compiled_kept(torch.randn(2, 16))
    _assert_freed(_compile_call_drop(_LoopPrinting, lambda m: kiln.compile(m, backend="eager")))
    x = torch.randn(2, 16)
    torch.testing.assert_close(compiled_kept(x), kept(x))


def test_training_step_is_freed():
    _assert_freed(_compile_call_drop(_mlp, lambda m: kiln.compile(m, backend="eager"), train=True))


def test_training_step_with_the_default_backend_is_freed():
    _assert_freed(_compile_call_drop(_mlp, kiln.compile, train=True))


def test_models_compiled_in_a_loop_are_freed():
    refs = []
    for _ in range(3):
        refs += _compile_call_drop(_Printing, lambda m: kiln.compile(m, backend="eager"))
    _assert_freed(refs)


def test_explain_keeps_nothing():
    model = _mlp()
    kiln.explain(model, torch.randn(2, 16))
    refs = _weights(model)
    del model
    _assert_freed(refs)


def test_a_kept_model_hits_its_cache(counters):
    model = _Printing()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 16)
    torch.testing.assert_close(compiled(x), model(x))
    captures = sum(counters["captures"].values())
    gc.collect()
    for _ in range(3):
        torch.testing.assert_close(compiled(x), model(x))
    assert sum(counters["captures"].values()) == captures
    # a second compile of the live model shares the first one's cache
    torch.testing.assert_close(kiln.compile(model, backend="eager")(x), model(x))
    assert sum(counters["captures"].values()) == captures


def test_a_new_model_of_the_same_class_hits_the_disk_caches(counters):
    x = torch.randn(2, 16)
    model = _mlp()
    compiled = kiln.compile(model)
    torch.testing.assert_close(compiled(x), model(x))
    del model, compiled
    gc.collect()
    hits = counters["cache"]["graph hits"]
    model = _mlp()  # (maybe at the dropped model's address: its guards must not match)
    compiled = kiln.compile(model)
    torch.testing.assert_close(compiled(x), model(x))
    assert counters["cache"]["graph hits"] > hits
