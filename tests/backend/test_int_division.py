"""Integer division by a constant (`perm // top_k` in transformers' MoE routing) runs in a kernel, with
eager's floor and trunc rounding for every sign; a tensor divisor (maybe zero: eager raises), -1 (the minimum
integer overflows) and uint8 stay with torch."""
from __future__ import annotations

import pytest
import torch

import kiln

VALUES = torch.cat([torch.arange(-40, 41), torch.tensor([-2 ** 62, 2 ** 62 + 3, -(2 ** 31) + 5, 2 ** 31 - 7])])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8])
@pytest.mark.parametrize("divisor", [2, 3, 7, -2, -5, 1000])
def test_integer_division_by_a_constant_is_a_kernel(dtype, divisor):
    info = torch.iinfo(dtype)
    p = VALUES.clamp(info.min, info.max).to(dtype)

    def f(p):
        return (p // divisor, torch.div(p, divisor, rounding_mode="trunc"),
                torch.div(p, divisor, rounding_mode="floor"), p % divisor, torch.fmod(p, divisor))
    kiln.reset()
    got = kiln.compile(f)(p)
    for g, e in zip(got, f(p)):
        assert g.dtype == e.dtype and torch.equal(g, e), (g, e)
    if info.min < divisor <= info.max:  # (a constant the dtype cannot hold wraps in eager: torch computes it)
        assert not kiln.counters["fallback"], dict(kiln.counters["fallback"])


def test_divisors_that_can_raise_or_overflow_stay_with_torch():
    def f(p, q):
        return p // q, p // -1, p.to(torch.uint8) // 3
    p, q = torch.arange(-5, 6), torch.tensor(3)
    kiln.reset()
    got = kiln.compile(f)(p, q)
    for g, e in zip(got, f(p, q)):
        assert g.dtype == e.dtype and torch.equal(g, e)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        kiln.compile(f)(p, torch.tensor(0))
