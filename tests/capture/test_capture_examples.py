"""What capture runs ops on: a graph input's own memory, never a copy of a model's weights, and never
written. Capture used to copy every input under 16M elements, a second copy of the weights while tracing
(1.6 GiB more for a 2 GiB LLaMA); now an input is copied only where another input shares its memory, and
every run that could write a user's tensor runs on a copy."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.capture import state as capture_state
from kiln.graph import Graph, Proxy, TensorMeta
from kiln.ops import standins
from kiln.ops.overlap import borrow, borrowed


@pytest.fixture
def copies(monkeypatch):
    """The tensors capture copied to make examples of."""
    seen: list[torch.Tensor] = []
    original = capture_state.strided_copy

    def spy(t):
        seen.append(t)
        return original(t)
    monkeypatch.setattr(capture_state, "strided_copy", spy)
    return seen


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)
        self.register_buffer("scale", torch.full((32,), 0.5))

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)))) * self.scale


@pytest.mark.parametrize("grad", [False, True])
def test_capture_copies_no_weight(copies, grad):
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(4, 32)
    expected = model(x)
    with torch.set_grad_enabled(grad):
        got = kiln.compile(model, backend="eager")(x)
    torch.testing.assert_close(got, expected)
    weights = {t.data_ptr() for t in [*model.parameters(), *model.buffers()]}
    assert not [t for t in copies if t.data_ptr() in weights]
    assert not copies  # (x has its own memory too)


def test_inputs_sharing_memory_stay_apart_as_in_eager(copies):
    def f(a, b):
        b.mul_(2)  # b is a view of a: eager's a changes too
        return a + 1, b.sum()

    base = torch.arange(12.0).reshape(3, 4)
    ea, eb = base.clone(), None
    eb = ea[1]
    expected = f(ea, eb)
    ka = base.clone()
    got = kiln.compile(f, backend="eager")(ka, ka[1])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(ka, ea)
    assert len(copies) == 1  # the second input, over the first one's memory


def test_a_fallback_writing_a_buffer_writes_it_once():
    """An op kiln records as a fallback may write arguments kiln does not know of: capture runs it on a
    copy of the user's buffer, and the buffer changes once, when the graph runs (as in eager)."""

    class Stats(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("running_mean", torch.zeros(8))
            self.register_buffer("running_var", torch.ones(8))

        def forward(self, x):
            # the same buffer twice: the decomposition declines, the op runs as a fallback
            return torch.nn.functional.batch_norm(x, self.running_mean, self.running_mean, training=True,
                                                  momentum=0.5)

    torch.manual_seed(0)
    x = torch.randn(16, 8)
    eager, compiled = Stats(), Stats()
    expected = eager(x)
    got = kiln.compile(compiled, backend="eager")(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled.running_mean, eager.running_mean)


def _proxy(graph: Graph, name: str, example: torch.Tensor) -> Proxy:
    return Proxy(graph.placeholder(name, TensorMeta.of(example)), example=example)


def _writes_into(x, *, into):
    into.add_(1)
    return x + 1


def test_a_run_on_examples_never_writes_a_borrowed_tensor():
    graph = Graph("g")
    mine = torch.zeros(3)
    x = _proxy(graph, "x", torch.ones(3))
    into = _proxy(graph, "into", borrow(mine.detach()))
    out = standins.run_on(_writes_into, (x,), {"into": into}, "example")  # (protected: a copy is written)
    assert torch.equal(out, torch.full((3,), 2.0)) and torch.equal(mine, torch.zeros(3))
    with pytest.raises(AssertionError, match="wrote a user's tensor"):
        standins.run_on(_writes_into, (x,), {"into": into}, "example", protect=False)


def test_a_view_of_a_borrowed_tensor_is_borrowed():
    graph = Graph("g")
    weight = _proxy(graph, "w", borrow(torch.randn(4, 3)))
    view = standins.run_on(torch.Tensor.t, (weight,), {}, "example", protect=False)
    copy = standins.run_on(torch.Tensor.contiguous, (_proxy(graph, "v", view),), {}, "example",
                           protect=False)
    assert borrowed(view) and not borrowed(copy)


# ---- tensors that reach the graph through code torch ran, not through a source capture guards ------------

def _checkpointed(m, x):
    def inner(t):  # a closure over m: torch.utils.checkpoint runs it, kiln does not interpret it
        return m[1](m[0](t))
    h = torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)
    return m[2](h).sum()


def _sequential():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def test_parameters_reached_inside_checkpoint_keep_their_gradients():
    """Regression: the closure's parameters became constants of the graph, and their gradients were None."""
    import torch.utils.checkpoint  # noqa: F401
    x = torch.randn(3, 4)
    eager, compiled = _sequential(), _sequential()
    _checkpointed(eager, x).backward()
    kiln.compile(_checkpointed)(compiled, x).backward()
    for a, b in zip(eager.parameters(), compiled.parameters()):
        assert b.grad is not None
        torch.testing.assert_close(b.grad, a.grad)


def test_a_parameter_reached_inside_checkpoint_and_replaced_is_seen():
    import torch.utils.checkpoint  # noqa: F401
    m, x = _sequential(), torch.randn(3, 4)
    fn = kiln.compile(_checkpointed)
    with torch.no_grad():
        fn(m, x)
        m[0].weight = torch.nn.Parameter(torch.zeros(8, 4))
        torch.testing.assert_close(fn(m, x), _checkpointed(m, x))
