"""Custom operators (torch.library.custom_op) inside compiled code, against eager.

Libraries plug kernels into compilers this way (transformers' MoE grouped matmul, flash-attention, vLLM).
An operator with a fake kernel is a node of the graph that runs the real op (its sizes from the fake
kernel); its registered autograd formula gives the gradients; one without a fake kernel, or whose sizes
depend on values, runs outside the graph. Found here: a custom op without a fake kernel was a node sized by
its first call, so `x[x > 0]` inside it gave the first call's length for every later call (a wrong result,
then a segfault)."""
from __future__ import annotations

import pytest
import torch

import kiln


@torch.library.custom_op("kiln_test::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


def _backward(ctx, grad):
    x, = ctx.saved_tensors
    return grad * torch.cos(x) * ctx.scale, None


scaled_sin.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("kiln_test::add_into", mutates_args=("acc",))
def add_into(acc: torch.Tensor, x: torch.Tensor) -> None:
    acc.add_(x)


@add_into.register_fake
def _(acc, x):
    return None


@torch.library.custom_op("kiln_test::positives", mutates_args=())
def positives(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0].clone()


@torch.library.custom_op("kiln_test::positives_faked", mutates_args=())
def positives_faked(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0].clone()


@positives_faked.register_fake
def _(x):
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n)


def uses_decorated(x):
    return scaled_sin(x * 2, 3.0).relu() + 1


def uses_torch_ops(x):
    return torch.ops.kiln_test.scaled_sin(x * 2, 0.5) * x


def graphs_and_breaks(fn, *args):
    kiln.reset()
    report = kiln.explain(fn, *args)
    return report.graph_count, report.graph_break_count, report


@pytest.mark.parametrize("fn", [uses_decorated, uses_torch_ops])
@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_custom_op_with_fake_kernel_is_one_graph(fn, backend):
    x = torch.randn(4, 5)
    assert graphs_and_breaks(fn, x)[:2] == (1, 0)
    compiled = kiln.compile(fn, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_custom_op_training_uses_its_autograd_formula(backend):
    x = torch.randn(4, 5, requires_grad=True)
    kiln.reset()
    compiled = kiln.compile(uses_decorated, backend=backend)
    got = compiled(x)
    got.sum().backward()
    grad, x.grad = x.grad.clone(), None
    expected = uses_decorated(x)
    expected.sum().backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad, x.grad)
    assert not kiln.counters["graph_breaks"], dict(kiln.counters["graph_breaks"])


def test_mutating_custom_op_updates_its_argument():
    def f(acc, x):
        add_into(acc, x * 2)
        return acc + 1
    acc, acc_eager, x = torch.zeros(3), torch.zeros(3), torch.arange(3.0)
    assert graphs_and_breaks(f, torch.zeros(3), x)[:2] == (1, 0)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(f)(acc, x), f(acc_eager, x))
    torch.testing.assert_close(acc, acc_eager)


@pytest.mark.parametrize("op", [positives, positives_faked])
def test_value_sized_custom_op_runs_outside_the_graph(op):
    def f(x):
        return op(x) * 2
    graphs, breaks, report = graphs_and_breaks(f, torch.tensor([1.0, -1.0, 2.0]))
    assert breaks == 1, report.breaks
    if op is positives:
        assert "register one with torch.library.register_fake" in report.breaks[0].reason
    kiln.reset()
    compiled = kiln.compile(f)
    for x in (torch.tensor([1.0, -1.0, 2.0]), torch.tensor([1.0, 3.0, 2.0]), torch.tensor([-1.0, -3.0])):
        torch.testing.assert_close(compiled(x), f(x))


def test_moe_training_steps_equal_eager():
    """transformers' Mixtral (small sizes, defaults otherwise): its experts run transformers' grouped-matmul
    custom op with a registered autograd formula. Two SGD steps through kiln: one capture, eager's losses and
    parameters."""
    import copy
    import warnings
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "mixtral", vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=128, num_key_value_heads=2)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config).train()
        reference = copy.deepcopy(model)
        ids = torch.randint(3, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
        kiln.reset()
        compiled = kiln.compile(model)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
        for _ in range(2):
            losses = []
            for run, opt in zip((compiled, reference), opts):
                loss = run(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[0], losses[1])
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    assert dict(kiln.counters["captures"]) == {"MixtralForCausalLM.forward": 1}
    assert not kiln.counters["graph_breaks"], dict(kiln.counters["graph_breaks"])
