"""A graph break inside a loop over modules resumes inside the loop.

`for block in self.blocks: x = block(x)` where a block call breaks (a module with hooks, FSDP2's sharded
blocks, a print inside the loop): the loop's iterator goes on to the resume code as a tuple of the modules it
has left, so the frame is captured around every break: the embedding before the loop and the head after it
are graphs, not run natively. Other loops (a `while`, a `for` over a range, an iterator also held in a
local) still run the frame natively, named; past MAX_LOOP_RESUMES resumes of a frame the rest of its loop
runs natively. Values, gradients and module state equal eager's."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.capture import resume

OUT = io.StringIO()


class Block(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Model(nn.Module):
    def __init__(self, blocks: int = 4, loop: str = "enumerate"):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(8, 3)
        self.loop = loop

    def forward(self, x):
        x = self.embed(x) * 2
        if self.loop == "enumerate":
            for i, block in enumerate(self.blocks):
                x = block(x) + i
        elif self.loop == "print":
            for block in self.blocks:
                print("block", file=OUT)
                x = block(x)
        elif self.loop == "range":
            for i in range(len(self.blocks)):
                print("block", file=OUT)
                x = self.blocks[i](x)
        elif self.loop == "while":
            i = 0
            while i < len(self.blocks):
                x = self.blocks[i](x)
                print("block", file=OUT)
                i += 1
        elif self.loop == "local":
            it = iter(self.blocks)
            for block in it:
                print("block", file=OUT)
                x = block(x)
        return self.head(x).sin()


def _hooked(model):
    for block in model.blocks:
        block.register_forward_hook(lambda module, args, out: out * 1.5)
    return model


def _check_values_and_grads(model, compiled, x):
    for _ in range(3):
        torch.testing.assert_close(compiled(x), model(x))
    compiled(x).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)


def test_hooked_blocks_in_an_enumerate_loop_resume_and_train_as_eager():
    torch.manual_seed(0)
    model = _hooked(Model())
    x = torch.randn(2, 8)
    kiln.reset()
    compiled = kiln.compile(model)
    _check_values_and_grads(model, compiled, x)
    report = kiln.explain(compiled, x)
    # the frame's own code around the four hooked calls: the embedding, three `+ i`, the head
    assert (report.graph_count, report.graph_break_count) == (5, 4), str(report)
    assert not report.frames_run_natively and all(b.resumed for b in report.breaks), str(report)
    assert "has hooks" in report.breaks[0].reason


@pytest.mark.parametrize("loop,why", [
    ("range", "the break is inside a loop that is not over modules"),
    ("while", "the break is inside a loop that is not over modules"),
    ("local", "kiln cannot pass on"),
])
def test_other_loops_still_run_the_frame_natively(loop, why):
    torch.manual_seed(0)
    model = Model(loop=loop)
    x = torch.randn(2, 8)
    kiln.reset()
    compiled = kiln.compile(model)
    _check_values_and_grads(model, compiled, x)
    report = kiln.explain(compiled, x)
    assert report.frames_run_natively and why in str(report), str(report)


def test_a_loop_longer_than_the_resume_limit_finishes_natively(monkeypatch):
    monkeypatch.setattr(resume, "MAX_LOOP_RESUMES", 3)
    torch.manual_seed(0)
    model = Model(blocks=6, loop="print")
    x = torch.randn(2, 8)
    kiln.reset()
    compiled = kiln.compile(model, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(compiled(x), model(x))
    report = kiln.explain(compiled, x)
    assert "resumed 3 times already (the rest of the loop runs natively)" in str(report), str(report)


def test_the_loop_resumes_for_new_sizes_and_a_changed_module_list():
    torch.manual_seed(0)
    model = _hooked(Model())
    kiln.reset()
    compiled = kiln.compile(model)
    for batch in (2, 5, 3):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(compiled(x), model(x))
    extra = Block()
    extra.register_forward_hook(lambda module, args, out: out * 1.5)
    model.blocks.append(extra)  # one more hooked block: the guards see it
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), model(x))
    del model.blocks[0]
    torch.testing.assert_close(compiled(x), model(x))


class Shapes(nn.Module):
    """Loop bodies around a break: an early exit, a list of outputs, a nested loop, state on the module."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.stages = nn.ModuleList(nn.ModuleList(Block() for _ in range(2)) for _ in range(3))
        self.calls = 0

    def forward(self, x):
        outs = []
        for s, stage in enumerate(self.stages):
            for block in stage:
                print("block", file=OUT)
                x = block(x) * (s + 1)
                self.calls += 1
                if self.kind == "early" and s == 1:
                    break
                if self.kind == "return" and s == 2:
                    return x - 1
            outs.append(x.sum(-1))
            if self.kind == "early" and s == 1:
                break
        return torch.stack(outs), x


@pytest.mark.parametrize("kind", ["plain", "early", "return"])
def test_loop_bodies_around_a_break_match_eager(kind):
    torch.manual_seed(0)
    model = Shapes(kind)
    twin = Shapes(kind)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 8)
    kiln.reset()
    compiled = kiln.compile(model)
    for _ in range(3):
        got, want = compiled(x), twin(x)
        torch.testing.assert_close(got, want)
    assert model.calls == twin.calls
    report = kiln.explain(compiled, x)
    assert not report.frames_run_natively, str(report)


@pytest.mark.parametrize("name", ["hf_llama", "hf_gpt2"])
def test_hugging_face_decoder_with_a_hook_on_every_layer(name):
    """Third-party code: a forward hook on each of a transformers decoder's layers (how users read
    activations). The model's forward resumes in its layer loop: its embeddings and final norm are graphs
    (transformers' own wrappers around it, a `with` block, still run natively, their callee captured).
    Outputs and what the hooks saw equal eager's."""
    pytest.importorskip("transformers")
    from kiln.testing import models as zoo
    torch.manual_seed(0)
    model, (args, kwargs) = zoo.build(name, batch=2)
    model.eval()
    layers = [m for n, m in model.named_modules()
              if type(m).__name__.endswith(("DecoderLayer", "Block")) and n.count(".") <= 2]
    assert len(layers) >= 2
    seen = []
    for layer in layers:
        layer.register_forward_hook(
            lambda module, args_, out: seen.append((out[0] if isinstance(out, tuple) else out).clone()))

    def first(out):
        return out[0] if isinstance(out, tuple) else out.last_hidden_state

    with torch.no_grad():
        want = first(model(*args, **kwargs))
        want_seen, seen[:] = list(seen), []
        kiln.reset()
        compiled = kiln.compile(model)
        for _ in range(2):
            got = first(compiled(*args, **kwargs))
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert len(seen) == len(want_seen)
            for a, b in zip(seen, want_seen):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            seen[:] = []
        report = kiln.explain(compiled, *args, **kwargs)
    model_frame = type(model).__name__ + ".forward"
    assert not any(f.startswith(model_frame + " (") and "modeling_" in f for f in report.frames_run_natively), \
        str(report)
    assert any(k.startswith(model_frame + " (resumed at line") for k in kiln.counters["captures"]), \
        dict(kiln.counters["captures"])
    assert report.graph_count >= 2, str(report)



class IteratorKept(nn.Module):
    """The loop's iterator is also held by an attribute: a second loop continues it after the first left."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        self.it = iter(self.blocks)
        n = 0
        for block in self.it:
            x = block(x)
            n += 1
            if n == 2:
                break
        for block in self.it:
            x = block(x) * 3
        return x


class Walker:
    def __init__(self, modules):
        self.modules = modules

    def __iter__(self):
        self.it = iter(self.modules)  # (kept: a second loop could continue it)
        return self.it


class IteratorInContainer(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        if self.kind == "list":
            its = [iter(self.blocks)]
            for block in its[0]:
                x = block(x)
                if block is self.blocks[1]:
                    break
            rest = its[0]
        else:
            walker = Walker(self.blocks)
            for block in walker:
                x = block(x)
                if block is self.blocks[1]:
                    break
            rest = walker.it
        for block in rest:
            x = block(x) * 3
        return x


@pytest.mark.parametrize("make", [IteratorKept, lambda: IteratorInContainer("list"),
                                  lambda: IteratorInContainer("walker")], ids=["attribute", "list", "walker"])
def test_a_loop_iterator_held_elsewhere_is_not_passed_on(make):
    """Found in review: the iterator also stored in an attribute, a list or by a user __iter__ was rebuilt
    apart from the loop's tuple, so a second loop over it ran blocks the first had already run."""
    torch.manual_seed(0)
    model = _hooked(make())
    x = torch.randn(2, 8)
    kiln.reset()
    compiled = kiln.compile(model)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), model(x))


class Swapping(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.spare = Block()

        def swap(module, args, out):
            self.blocks[1], self.spare = self.spare, self.blocks[1]  # the same key, a new module
            return out
        self.blocks[0].register_forward_hook(swap)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_a_module_the_breaking_call_puts_in_the_list_runs_next():
    """Found in review: the hook on blocks[0] replaces blocks[1]; eager's iterator over the ModuleList's
    modules yields the new one, so the loop's rest is read from the container after the call."""
    torch.manual_seed(0)
    model, twin = Swapping(), Swapping()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 8)
    kiln.reset()
    compiled = kiln.compile(model)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), twin(x))
