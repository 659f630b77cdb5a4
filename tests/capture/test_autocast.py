"""torch.autocast under kiln.compile: its state is guarded (a switch recaptures), its policy becomes explicit
casts in the graph, regions inside compiled code are captured, and results equal eager autocast's.

Each case runs the same program eagerly and compiled, under the same autocast state, and compares values
and dtypes (bit-equal where kiln runs the same arithmetic as eager: casts, mm, and elementwise ops in the
autocast dtype, rounded after every op as eager rounds: config bfloat16_rounding 'op' here; with its
default, 'store', a fused kernel rounds once, and the results are judged by the accuracy rule); models are
judged by the accuracy rule against an fp64 reference.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.ops import autocast as kiln_autocast
from kiln.testing import models as zoo
from kiln.testing.accuracy import check

pytestmark = pytest.mark.usefixtures("kiln_cache")


@pytest.fixture(autouse=True)
def each_op():
    """Half-precision results rounded after every op, as eager rounds (the bit-equal comparisons)."""
    with config.patch(bfloat16_rounding="op", float16_rounding="op"):
        yield

LOW = [torch.bfloat16, torch.float16]
BACKENDS = ["eager", "cpp"]


def _same(eager, compiled):
    """Equal values and dtypes, leaf by leaf."""
    if isinstance(eager, (tuple, list)):
        assert len(eager) == len(compiled)
        for e, c in zip(eager, compiled):
            _same(e, c)
        return
    if isinstance(eager, torch.Tensor):
        assert compiled.dtype == eager.dtype, (compiled.dtype, eager.dtype)
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    else:
        assert compiled == eager


def _relu_mm(x, w):
    return torch.relu(x @ w) + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("first_on", [False, True])
def test_switching_autocast_recaptures(backend, first_on, counters):
    """The issue's repro: a capture made without autocast was reused under it (values ~1e27 off), and the
    other order too. Every call now equals eager's, and each switch is a counted recompile."""
    kiln.reset()
    cf = kiln.compile(_relu_mm, backend=backend)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    states = [True, False, True, False] if first_on else [False, True, False, True]
    for on in states:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            eager, compiled = _relu_mm(x, w), cf(x, w)
        _same(eager, compiled)
        assert compiled.dtype == (torch.bfloat16 if on else torch.float32)
    assert sum(counters["captures"].values()) == 2
    reasons = " ".join(counters["recompiles"])
    assert "torch.autocast is off" in reasons or "torch.autocast state is cpu: bfloat16" in reasons


@pytest.mark.parametrize("dtype", LOW)
def test_autocast_dtype_change_recaptures(dtype):
    kiln.reset()
    cf = kiln.compile(_relu_mm, backend="cpp")
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    for d in (torch.bfloat16, torch.float16, dtype):
        with torch.autocast("cpu", dtype=d):
            _same(_relu_mm(x, w), cf(x, w))


class _ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.flatten(1)).softmax(-1), y.sum()


@pytest.mark.parametrize("dtype", LOW)
def test_conv_batchnorm_linear_model(dtype, counters):
    """A Conv/BatchNorm/Linear model gave values around -4.5e21 or NaN under autocast."""
    kiln.reset()
    model = _ConvNet().eval()
    cm = kiln.compile(model, backend="cpp")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for on in (False, True, False, True):
            with torch.autocast("cpu", dtype=dtype, enabled=on):
                eager, compiled = model(x), cm(x)
            for e, c in zip(eager, compiled):
                assert c.dtype == e.dtype
                torch.testing.assert_close(c.float(), e.float(), rtol=2e-2, atol=2e-2)
    assert not [k for k in counters["fallback"] if "conv" in k or "linear" in k]


def _regions(x, w):
    y = x @ w  # outside: float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = torch.relu(x @ w) + 1
        enabled = torch.is_autocast_enabled("cpu")
        with torch.autocast("cpu", enabled=False):
            q = z.float() @ w.t()  # a disabled region nested in an enabled one: float32
        with torch.autocast("cpu", dtype=torch.float16):
            h = x @ w  # nested with another dtype
        e = torch.einsum("ij,jk->ik", x, w)  # a composite whose inner bmm autocast reaches
    return y, z, q, h, e, enabled, torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_regions_inside_compiled_code(backend, counters):
    """with torch.autocast(...) in compiled code is captured (one graph, no break); nested regions, a
    disabled region, torch.is_autocast_enabled() inside; the state after the call is eager's."""
    kiln.reset()
    cf = kiln.compile(_regions, backend=backend)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    for _ in range(2):
        _same(_regions(x, w), cf(x, w))
        assert not torch.is_autocast_enabled("cpu")
    assert sum(counters["graphs"].values()) == 1
    assert not counters["graph_breaks"]


def test_regions_rounded_once_by_the_accuracy_rule():
    """bfloat16 rounded once in fused kernels (the default): the regions' results within bfloat16's
    tolerance of eager autocast's, by the accuracy rule against float64, in one graph."""
    kiln.reset()
    with config.patch(bfloat16_rounding="store"):
        cf = kiln.compile(_regions, backend="cpp")
        x, w = torch.randn(8, 16), torch.randn(16, 4)
        got, want = cf(x, w), _regions(x, w)
    xd, wd = x.double(), w.double()
    z = torch.relu(xd @ wd) + 1   # (_regions in float64)
    fp64 = (xd @ wd, z, z @ wd.t(), xd @ wd, xd @ wd) + want[-2:]
    verdict = check(got, want, fp64, tol=1e-2)
    assert verdict.passed, verdict.reason


def test_region_entered_outside_and_inside(counters):
    """A region around the compiled call and another inside it."""
    kiln.reset()
    cf = kiln.compile(_regions, backend="cpp")
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("cpu", dtype=torch.float16):
        _same(_regions(x, w), cf(x, w))
        assert torch.get_autocast_dtype("cpu") == torch.float16 and torch.is_autocast_enabled("cpu")


_DECORATOR = torch.autocast("cpu", dtype=torch.bfloat16)


@_DECORATOR
def _decorated(x, w):
    return F.linear(x, w.t()).softmax(-1), F.cross_entropy(x @ w, torch.tensor([0, 1, 2, 3] * 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_decorator_form(backend):
    kiln.reset()
    cf = kiln.compile(_decorated, backend=backend)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    for _ in range(2):
        _same(_decorated(x, w), cf(x, w))
    assert not torch.is_autocast_enabled("cpu")


class _Custom(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a.mm(b)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g.mm(b.t()), a.t().mm(g)


def _custom(x, w):
    return _Custom.apply(x @ w, w.t()).relu()


def test_custom_fwd_bwd():
    kiln.reset()
    cf = kiln.compile(_custom, backend="cpp")
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _same(_custom(x, w), cf(x, w))


# ops of each cast policy, and ops autocast leaves alone
_OPS = {
    "addmm": lambda b, x, w: torch.addmm(b, x, w),
    "baddbmm": lambda b, x, w: torch.baddbmm(b.expand(2, 8, 4), x.expand(2, 8, 16), w.expand(2, 16, 4)),
    "matmul_bias": lambda b, x, w: F.linear(x, w.t(), b),
    "mixed_inputs": lambda b, x, w: x.to(torch.bfloat16) @ w,  # mm of a bf16 and an f32 operand
    "fp32_policy": lambda b, x, w: F.mse_loss(x.to(torch.bfloat16) @ w, (x @ w).to(torch.bfloat16)),
    "cat_promote": lambda b, x, w: torch.cat([x @ w, b.expand(8, 4)]),
    "stack_low": lambda b, x, w: torch.stack([x @ w, x @ w]),
    "double_not_cast": lambda b, x, w: x.double() @ w.double(),
    "passthrough": lambda b, x, w: (x @ w).float().exp().sum(-1),
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", sorted(_OPS))
def test_policy_ops(case, dtype, counters):
    kiln.reset()
    fn = _OPS[case]
    cf = kiln.compile(fn, backend="cpp")
    b, x, w = torch.randn(4), torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("cpu", dtype=dtype):
        eager, compiled = fn(b, x, w), cf(b, x, w)
    assert compiled.dtype == eager.dtype
    torch.testing.assert_close(compiled.double(), eager.double(), rtol=1e-2, atol=1e-2)
    assert not counters["fallback"], dict(counters["fallback"])


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("grad", [False, True])
def test_grad_mode(dtype, grad):
    kiln.reset()
    cf = kiln.compile(_relu_mm, backend="cpp")
    x, w = torch.randn(8, 16), torch.randn(16, 4, requires_grad=True)
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=dtype):
        eager, compiled = _relu_mm(x, w), cf(x, w)
    _same(eager.detach(), compiled.detach())
    assert compiled.requires_grad == eager.requires_grad


@pytest.mark.parametrize("backward_inside", [False, True])
@pytest.mark.parametrize("name", ["mlp", "resnet_tiny", "nanogpt_tiny"])
def test_training_step(name, backward_inside):
    """A training step under autocast: gradients by the accuracy rule against fp64, as eager's. With
    backward() inside the region, the compiled backward's externs once cast again (NaN gradients)."""
    kiln.reset()
    model, (args, kwargs) = zoo.build(name)
    model.train()
    compiled_model, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    cm = kiln.compile(compiled_model, backend="cpp")
    for m, on in ((model, True), (cm, True), (ref, False)):
        torch.manual_seed(0)
        inputs = [a.double() if a.is_floating_point() and not on else a for a in args]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            loss = m(*inputs, **kwargs).float().pow(2).mean()
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
    grads = [[p.grad for p in m.parameters()] for m in (model, compiled_model, ref)]
    verdict = check(grads[1], grads[0], grads[2])
    assert verdict.passed, verdict.reason
    assert all(g1.dtype == g0.dtype for g0, g1 in zip(grads[0], grads[1]))


_LIBRARY_PRIMS = ("linear", "matmul", "mm", "sdpa", "scaled_dot_product", "conv", "addmm")


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", ["mlp", "resnet_tiny", "nanogpt_tiny", "llama", "hf_gpt2", "hf_bert"])
def test_zoo_under_autocast(name, dtype, counters):
    """Zoo and Hugging Face models under autocast: right by the accuracy rule, no linear, matmul,
    convolution or attention running with torch, and the next call without autocast right too."""
    spec = zoo.get(name)
    if not spec.available():
        pytest.skip(f"needs {spec.requires}")
    kiln.reset()
    model, (args, kwargs) = zoo.build(name)
    ref_model = copy.deepcopy(model).double()
    cm = kiln.compile(model, backend="cpp")
    with torch.no_grad():
        ref = ref_model(*[a.double() if a.is_floating_point() else a for a in args], **kwargs)
        with torch.autocast("cpu", dtype=dtype):
            eager, compiled = model(*args, **kwargs), cm(*args, **kwargs)
        verdict = check(compiled, eager, ref)
        assert verdict.passed, verdict.reason
        verdict = check(cm(*args, **kwargs), model(*args, **kwargs), ref)
        assert verdict.passed, verdict.reason
    assert not [k for k in counters["fallback"] if any(w in k for w in _LIBRARY_PRIMS)], \
        dict(counters["fallback"])


def test_policy_table_against_dispatcher():
    """Every op kiln casts to the autocast dtype or to the widest input has an autocast kernel of that
    kind in some torch release; those the installed torch registers for the CPU include the matmuls,
    convolutions and attention (the ops that decide a model's speed)."""
    registered = kiln_autocast._registered("cpu")
    for name in ("mm", "bmm", "addmm", "baddbmm", "linear", "matmul", "conv2d", "scaled_dot_product_attention",
                 "cat", "stack"):
        assert name in registered, name
    assert "einsum" not in kiln_autocast._registered("cpu")  # a composite: runs with torch under a region


def test_state_after_failed_capture_is_restored():
    """A region the capture entered is left as eager leaves it even when the frame breaks inside it."""
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            print_ = str(y.sum().item())  # a graph break inside the region (the frame runs natively)
        return y, print_
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(4, 4)
    eager, compiled = f(x), cf(x)
    _same(eager[0], compiled[0])
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_explain_names_the_autocast_guard():
    kiln.reset()
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = kiln.explain(_relu_mm, x, w)
    assert "torch.autocast state is cpu: bfloat16" in report.guards_text()  # (str counts the guards)


def _reads_state(x):
    return x.to(torch.get_autocast_dtype("cpu")), torch.is_autocast_enabled("cpu")


def test_reading_the_state_guards_it():
    """Code that reads autocast's dtype while it is off: changing the dtype recaptures."""
    kiln.reset()
    cf = kiln.compile(_reads_state, backend="eager")
    x = torch.randn(3)
    before = torch.get_autocast_dtype("cpu")
    try:
        for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
            torch.set_autocast_dtype("cpu", dtype)
            _same(_reads_state(x), cf(x))
    finally:
        torch.set_autocast_dtype("cpu", before)


def _grid_sample(a, grid):
    return F.grid_sample(a, grid, align_corners=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cpu_grid_sampler_casts_to_float32(backend):
    """The CPU's autocast casts grid_sampler's inputs to float32 (CUDA's promotes them): kiln used CUDA's
    policy on the CPU, bf16 inputs gave a bf16 result where eager's is float32."""
    kiln.reset()
    cf = kiln.compile(_grid_sample, backend=backend)
    a, grid = torch.randn(1, 2, 4, 4).bfloat16(), (torch.rand(1, 3, 3, 2) * 2 - 1).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, compiled = _grid_sample(a, grid), cf(a, grid)
    assert eager.dtype == torch.float32
    _same(eager, compiled)


def _cat(a, b):
    return torch.cat([a, b])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float16), (torch.float16, torch.float32),
                                    (torch.float16, torch.float16), (torch.float64, torch.float16)])
def test_promote_raises_as_eager(backend, dtypes):
    """Eager's widest-type cast (cat, stack, index_copy) fails on a floating type other than float32 and the
    autocast dtype met before any float32 input; kiln cast them all to float32 and returned a result."""
    kiln.reset()
    cf = kiln.compile(_cat, backend=backend)
    a, b = torch.randn(2, 3).to(dtypes[0]), torch.randn(2, 3).to(dtypes[1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="prioritize"):
            _cat(a, b)
        with pytest.raises(RuntimeError, match="prioritize"):
            cf(a, b)
        _same(_cat(b.float(), a), cf(b.float(), a))  # a float32 first: the widest is float32


def _default_dtype_region(x, w):
    with torch.autocast("cpu"):
        return x @ w


@pytest.mark.parametrize("backend", BACKENDS)
def test_region_without_dtype_guards_the_dtype(backend):
    """torch.autocast("cpu") with no dtype takes autocast's dtype when it is made: a capture made under
    bfloat16 was reused after the dtype was set to float16 (autocast off at entry, so unguarded)."""
    kiln.reset()
    cf = kiln.compile(_default_dtype_region, backend=backend)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype, enabled=False):  # sets the dtype, autocast stays off
            eager, compiled = _default_dtype_region(x, w), cf(x, w)
        assert eager.dtype == dtype
        _same(eager, compiled)


def _enter_only(x, w):
    torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    return x @ w


def _enter_and_exit(x, w):
    region = torch.autocast("cpu", dtype=torch.float16)
    region.__enter__()
    y = x @ w
    region.__exit__(None, None, None)
    return y, x @ w


def _leave_all(saved):
    """Back to `saved`, the nesting a region left open undone too."""
    kiln_autocast.restore(saved)
    torch.autocast_increment_nesting()
    for _ in range(torch.autocast_decrement_nesting()):
        torch.autocast_decrement_nesting()


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_enter_and_exit(backend):
    """__enter__ called directly (not a with-block) ran natively while tracing: the graph had the casts
    but the call left autocast off where eager leaves it on."""
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    before = kiln_autocast.saved()
    for fn in (_enter_only, _enter_and_exit):
        kiln.reset()
        cf = kiln.compile(fn, backend=backend)
        for _ in range(2):
            try:
                eager = fn(x, w)
                after_eager = kiln_autocast.saved()
            finally:
                _leave_all(before)
            try:
                compiled = cf(x, w)
                after_compiled = kiln_autocast.saved()
            finally:
                _leave_all(before)
            _same(eager, compiled)
            assert after_compiled == after_eager
