"""The scalar op table (kiln.lower.ops.SCALAR_OP_TABLE) and each target's spelling of it: every target
spells every op of the table, on every dtype of the op's domain (the gaps listed with a reason), with the
result kind the table states; float-only ops are refused on other dtypes."""
from __future__ import annotations

import pytest
import torch

from kiln import config
from kiln.codegen import cpp, cpp_ops, triton, triton_ops
from kiln.lower.ops import (BINARY_OPS, COMPARISONS, SCALAR_OP_TABLE, UNARY_OPS, CountHandler, Domain, Result,
                            rounded_once)

FLOATS = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
INTEGERS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
DOMAIN = {Domain.ANY: FLOATS + INTEGERS + [torch.bool], Domain.FLOAT: FLOATS,
          Domain.INTEGER: INTEGERS + [torch.bool]}
# (target, op, dtype) a target does not spell, and why
GAPS = {
    **{("triton", "pow", d): "libdevice's pow is float-only: an integer pow runs with torch on triton"
       for d in INTEGERS},
    ("triton", "pow", torch.bool): "eager has no pow of bools",
    ("cpp", "fmod", torch.bool): "eager has no fmod of bools",
    ("triton", "fmod", torch.bool): "eager has no fmod of bools",
    ("triton", "shift_left", torch.bool): "eager has no shifts of bools",
    ("triton", "shift_right", torch.bool): "eager has no shifts of bools",
}


class _Kernel:  # what a TritonHandler asks of its kernel writer
    libdevice = "libdevice"
    count = 0

    def __init__(self):
        self.round_once = rounded_once()

    def new_name(self):
        self.count += 1
        return f"tmp{self.count}"


def emit(target, name, dtypes):
    """The value a target's handler returns for op `name` on operands of `dtypes` (raises when unspelled)."""
    if target == "cpp":
        return cpp.CppHandler({}, {}, {}, "  ").op(name, *[cpp.CppValue(f"v{i}", d) for i, d in enumerate(dtypes)])
    handler = triton.TritonHandler(_Kernel(), "[XBLOCK, RBLOCK]", "xmask", "  ")
    return handler.op(name, *[triton.TValue(f"v{i}", d) for i, d in enumerate(dtypes)])


def operands(op, dtype):
    return [torch.bool, dtype, dtype] if op.name == "where" else [dtype] * op.arity


def test_the_op_sets_come_from_the_table():
    assert UNARY_OPS == {n for n, op in SCALAR_OP_TABLE.items() if op.arity == 1}
    assert BINARY_OPS == {n for n, op in SCALAR_OP_TABLE.items() if op.arity == 2}
    assert COMPARISONS == {n for n, op in SCALAR_OP_TABLE.items() if op.result is Result.BOOL}
    counter = CountHandler()
    for name, op in SCALAR_OP_TABLE.items():
        counter.ops = 0
        counter.op(name)
        assert counter.ops == op.cost


@pytest.mark.parametrize("table", [cpp_ops.CODE_FOR_OP, triton_ops.CODE_FOR_OP], ids=["cpp", "triton"])
def test_every_target_has_an_entry_for_every_op(table):
    assert set(table) == set(SCALAR_OP_TABLE), (set(SCALAR_OP_TABLE) ^ set(table))


@pytest.mark.parametrize("target", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(SCALAR_OP_TABLE))
def test_every_target_spells_every_op_on_its_domain(target, name):
    op = SCALAR_OP_TABLE[name]
    for dtype in DOMAIN[op.domain]:
        if (target, name, dtype) in GAPS:
            with pytest.raises(NotImplementedError, match=f"{target} codegen: {name} on"):
                emit(target, name, operands(op, dtype))
            continue
        value = emit(target, name, operands(op, dtype))
        assert value.dtype == (torch.bool if op.result is Result.BOOL else dtype), (name, dtype)
    if op.float_only:
        for dtype in INTEGERS + [torch.bool]:
            with pytest.raises(NotImplementedError, match=f"{target} codegen: {name} on {dtype}"):
                emit(target, name, operands(op, dtype))


def test_half_types_compute_in_float():
    """C++ and Triton hold half-type values in float registers; rounded after every op, an op's result is
    rounded back to the half type's values (an exact op, such as maximum, is not rounded); rounded once,
    only a conversion to a dtype other than float32 rounds inside the kernel."""
    with config.patch(bfloat16_rounding="store", float16_rounding="store"):
        h = cpp.CppHandler({}, {}, {}, "  ")
        out = h.op("add", cpp.CppValue("a", torch.bfloat16), cpp.CppValue("b", torch.bfloat16))
        wide = h.to_dtype(out, torch.float32)
        h.to_dtype(out, torch.int32)
        assert h.lines == ["  float t1 = a + b;", "  float t2 = kiln_round_bf16(t1);",
                           "  int32_t t3 = static_cast<int32_t>(t2);"] and out.dtype == torch.bfloat16
        assert wide.name == "t1" and wide.dtype == torch.float32
        h = triton.TritonHandler(_Kernel(), "[XBLOCK, RBLOCK]", "xmask", "  ")
        h.op("exp", triton.TValue("a", torch.float16))
        assert h.lines == ["  tmp1 = libdevice.exp(a)"]
    with config.patch(bfloat16_rounding="op", float16_rounding="op"):
        _rounded_after_every_op()


def _rounded_after_every_op():
    h = cpp.CppHandler({}, {}, {}, "  ")
    out = h.op("add", cpp.CppValue("a", torch.bfloat16), cpp.CppValue("b", torch.bfloat16))
    h.op("maximum", cpp.CppValue("a", torch.float16), cpp.CppValue("b", torch.float16))
    assert h.lines == ["  float t1 = a + b;", "  float t2 = kiln_round_bf16(t1);",
                       "  float t3 = kiln_max<float>(a, b);"] and out.dtype == torch.bfloat16
    h = triton.TritonHandler(_Kernel(), "[XBLOCK, RBLOCK]", "xmask", "  ")
    h.op("exp", triton.TValue("a", torch.float16))
    h.op("maximum", triton.TValue("a", torch.float16), triton.TValue("b", torch.float16))
    assert h.lines == ["  tmp1 = kiln_round_fp16(libdevice.exp(a))", "  tmp2 = kiln_maximum(a, b)"]


def test_signed_integers_wrap_in_cpp():
    h = cpp.CppHandler({}, {}, {}, "  ")
    h.op("mul", cpp.CppValue("a", torch.int64), cpp.CppValue("b", torch.int64))
    h.op("neg", cpp.CppValue("a", torch.int32))
    h.op("add", cpp.CppValue("a", torch.uint8), cpp.CppValue("b", torch.uint8))  # unsigned: plain
    assert "std::make_unsigned<int64_t>::type" in h.lines[0] and "int32_t(0)" in h.lines[1]
    assert h.lines[2] == "  uint8_t t3 = a + b;"


ERFINV_VALUES = [0.0, -0.0, 1e-30, -0.3, 0.5, 0.7, -0.95, 0.999999, 1 - 2 ** -24, 1.0, -1.0, 1.5, -3.0, float("nan")]


@pytest.mark.parametrize("dtype", FLOATS)
def test_erfinv_is_a_scalar_op_of_the_cpp_backend(dtype):
    """erfinv, added as one row of the table, one entry per target and its C++ helper (it ran as a torch
    call between kernels): eager's values within an ulp or two (the tails solved with erfc, where erf's
    residual cancels), its infinities at +-1, NaN past them, signed zeros; no fallback."""
    import kiln
    from kiln.counters import counters
    x = torch.cat([torch.rand(4000, dtype=torch.float64) * 2 - 1, 1 - torch.rand(1000, dtype=torch.float64) * 1e-6,
                   torch.tensor(ERFINV_VALUES, dtype=torch.float64)]).to(dtype)
    kiln.reset()
    counters.clear()
    got = kiln.compile(lambda x: torch.erfinv(x) * 2, backend="cpp")(x)
    want = torch.erfinv(x) * 2
    assert not counters["fallback"], dict(counters["fallback"])
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got[torch.isinf(want)], want[torch.isinf(want)])
    assert torch.equal(torch.signbit(got[-14:-12]), torch.signbit(want[-14:-12]))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=2 * torch.finfo(dtype).eps, atol=0)
