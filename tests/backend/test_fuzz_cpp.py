"""Adversarial programs against eager through `kiln.compile(fn, backend="cpp")`: hand-written cases (views
with offsets, aliasing inputs, in-place updates, recycled output buffers, odd dtypes and reductions) and a
seeded random program generator. Each program runs eagerly and compiled on equal inputs; outputs, the
inputs afterwards (mutations) and outputs kept from an earlier call must match.

The generator's default sweep is small (KILN_FUZZ_SEEDS, default 40 programs); the `slow` test runs
KILN_FUZZ_SLOW_SEEDS (default 400) more: `python -m pytest -m slow tests/backend/test_fuzz_cpp.py`.
A failing random program prints its source, ready to paste into a repro.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import weakref

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]

FUZZ_SEEDS = int(os.environ.get("KILN_FUZZ_SEEDS", "40"))
FUZZ_SLOW_SEEDS = int(os.environ.get("KILN_FUZZ_SLOW_SEEDS", "400"))


def cpp(fn, fullgraph=True):
    """`fn` compiled by the cpp backend; internal errors raise, and so do graph breaks unless allowed."""
    return kiln.compile(fn, backend="cpp", fullgraph=fullgraph, options={"raise_on_error": fullgraph})


def _clone(value, scale=None):
    """A deep copy of a structure of tensors that keeps each tensor's strides and storage offset, and keeps
    tensors that shared a storage sharing one (so aliasing inputs stay aliased). With `scale`, floating
    storages are multiplied by it (new values, same layout and aliasing)."""
    storages: dict = {}

    def copy(t):
        if not isinstance(t, torch.Tensor):
            return t
        key = t.untyped_storage().data_ptr()
        if key not in storages:
            storage = t.untyped_storage().clone()
            if scale is not None and t.dtype.is_floating_point:
                flat = torch.empty(0, dtype=t.dtype).set_(storage)
                flat.mul_(scale)
            storages[key] = storage
        return torch.empty(0, dtype=t.dtype).set_(storages[key], t.storage_offset(), t.shape, t.stride())

    def walk(v):
        if isinstance(v, (list, tuple)):
            return type(v)(walk(a) for a in v)
        return copy(v)
    return walk(value)


_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 1e-4, torch.float64: 1e-5}


def _close(actual, expected, what):
    """Equal structures; tensors equal in dtype, shape and values (NaN equal to NaN) within a tolerance
    that allows reassociated sums and low-precision rounding at a different point."""
    assert type(actual) is type(expected), f"{what}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{what}: {len(actual)} != {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _close(a, e, f"{what}[{i}]")
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"
        return
    tol = _TOLERANCE.get(expected.dtype, 0)
    torch.testing.assert_close(actual, expected, equal_nan=True, atol=tol, rtol=tol,
                               msg=lambda m: f"{what}: {m}")


def check(fn, *inputs, calls=2, fullgraph=True):
    """Run `fn` eagerly and compiled on copies of `inputs` `calls` times (later calls' floating inputs
    scaled, so values change); compare outputs, inputs after each call, and the outputs of the first call
    (held by the caller while later calls run: the wrapper must not recycle their buffers)."""
    compiled = cpp(fn, fullgraph)
    first = None
    for call in range(calls):
        args = _clone(list(inputs), scale=None if call == 0 else 1.5 + call)
        eager_args, kiln_args = _clone(args), _clone(args)
        expected = fn(*eager_args)
        actual = compiled(*kiln_args)
        _close(actual, expected, f"call {call}: outputs")
        _close(kiln_args, eager_args, f"call {call}: inputs after the call")
        if first is None:
            first = (actual, _clone([actual])[0])
        else:
            _close(first[0], first[1], f"call {call}: outputs kept from call 0")
    return compiled


# ---------------------------------------------------------------------------------------------------------
# Hand-written adversarial programs


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _randint(*shape, low=-9, high=10, dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


def _alias(base, *views):
    """Inputs that share `base`'s memory: each view is a function of base."""
    return [v(base) for v in views]


def _setitem_slice_from(x, y):
    x[1:3] = y
    return x.sum()


def _setitem_index(x, i):
    x[i] = 1.0
    return x + 1


def _index_put_accumulate(x, i, v):
    x.index_put_((i,), v, accumulate=True)
    return x


def _intermediate_setitem(x):
    y = x * 2
    y[0] = 5
    y.mul_(3)
    return y


def _mutate_after_read(x):
    s = x.sum(0)
    x.mul_(2)
    return s, x


def _copy_flipped_self(x):
    x.copy_(x.flip(0))
    return x


def _masked_nan_then_reduce(x):
    x.masked_fill_(x < 0, float("nan"))
    return x.amax(1), x.argmax(1), x.max(0)


def _fallback_view_then_reuse(x):
    y = x.exp()
    z = y.detach()  # run by torch: aliases y's buffer
    s = (z * 2).sum()
    return y.flip(0).flip(1) + s


def _fallback_view_then_reduce(x):
    y = x + 1
    z = y.as_strided(y.shape, y.stride())  # run by torch: aliases y
    a = z.amax(1, keepdim=True)
    return (y.t() - a).exp().sum(1), y


T = torch.tensor
NAN, INF = float("nan"), float("inf")

CASES = {
    # aliasing inputs, views with offsets, expanded (stride 0) inputs
    "same_input_twice": (lambda x, y: x + y * 2, *_alias(_randn(8, 8), lambda b: b, lambda b: b)),
    "same_input_inplace": (lambda x, y: x.add_(y), *_alias(_randn(8, 8), lambda b: b, lambda b: b)),
    "overlapping_inputs": (lambda x, y: (x * 2 + y).sum(1), *_alias(_randn(9, 8), lambda b: b[:-1],
                                                                     lambda b: b[1:])),
    "input_and_its_transpose": (lambda x, y: x @ y + x, *_alias(_randn(8, 8), lambda b: b, lambda b: b.t())),
    "mutate_input_read_alias": (lambda x, y: (x.mul_(2), y + 1)[1],
                                *_alias(_randn(10, 5), lambda b: b[:5], lambda b: b[5:])),
    "offset_input_pointwise": (lambda x: x * 2 + 1, _randn(10, 7)[3:, 1:]),
    "offset_input_mm": (lambda x, w: (x @ w).relu(), _randn(10, 7)[3:, 1:], _randn(6, 4, seed=1)),
    "offset_input_mm_transposed": (lambda x, w: x.t() @ w, _randn(10, 7)[3:, 1:], _randn(7, 4, seed=1)),
    "expanded_input_reduce": (lambda x: x * 2 + x.sum(), _randn(1, 7).expand(5, 7)),
    "expanded_input_into_inplace": (lambda x, y: y.add_(x), _randn(1, 7).expand(5, 7), _randn(5, 7, seed=1)),
    "expanded_inputs_ops": (lambda x, y: (x + y, (x * y).sum(0), x @ y.t(), x.cumsum(0), x.softmax(0)),
                            _randn(1, 6).expand(5, 6), _randn(5, 1, seed=1).expand(5, 6)),
    # in-place updates of inputs and intermediates
    "mutate_then_read": (lambda x: (x.mul_(2), x.sum())[1], _randn(5, 7)),
    "read_then_mutate": (_mutate_after_read, _randn(5, 7)),
    "mutate_return_view": (lambda x: x.add_(1)[1:], _randn(5, 7)),
    "setitem_slice_from": (_setitem_slice_from, _randn(5, 7), _randn(2, 7, seed=1)),
    "setitem_index_repeated": (_setitem_index, _randn(5, 7), T([0, 3, 3])),
    "index_put_accumulate": (_index_put_accumulate, _randn(5, 7), T([0, 3, 3]), _randn(3, 7, seed=1)),
    "intermediate_setitem": (_intermediate_setitem, _randn(5, 7)),
    "copy_flipped_self": (_copy_flipped_self, _randn(5, 7)),
    "masked_nan_then_reduce": (_masked_nan_then_reduce, _randn(6, 7)),
    # outputs that alias inputs or each other
    "return_same_twice": (lambda x: ((y := x * 2), y), _randn(5, 7)),
    "return_input": (lambda x: x, _randn(5, 7)),
    "return_input_views": (lambda x: (x.t(), x[1:], x, x[0]), _randn(5, 7)),
    "return_views_of_result": (lambda x: ((y := x.exp()), y[1:], y.t(), y.reshape(-1)), _randn(5, 7)),
    "return_fallback_view": (lambda x: (x + 1).detach(), _randn(5, 7)),
    "fallback_view_then_reuse": (_fallback_view_then_reuse, _randn(8, 8)),
    "fallback_view_then_reduce": (_fallback_view_then_reduce, _randn(8, 8)),
    # dtypes
    "promotion_0d": (lambda x, s, h, u: (x + s, x * T(2.5, dtype=torch.float64), h + T(1.5), u + 200, u - 1,
                                         x.to(torch.int8) * 100),
                     _randint(5, 7, dtype=torch.int32), T(3), _randn(5, 7, dtype=torch.float16),
                     _randint(5, 7, low=0, high=255, dtype=torch.uint8)),
    "int_division_modes": (lambda x, y: (torch.div(x, y, rounding_mode="floor"), x / y, x % y,
                                         torch.fmod(x, y),
                                         torch.div(x, y, rounding_mode="trunc"), x // y),
                           _randint(6, 7), _randint(7, low=1, high=5) * T([1, -1, 1, -1, 1, -1, 1])),
    "float_division_modes": (lambda x, y: (torch.div(x, y, rounding_mode="floor"), x // y, x % y,
                                           torch.fmod(x, y), torch.remainder(x, -0.7)),
                             _randn(6, 7) * 5, _randn(7, seed=1)),
    "float_to_int": (lambda x: (x.to(torch.int64), x.to(torch.int32), x.to(torch.int8), x.to(torch.uint8),
                                x.to(torch.bool), x.long().float()), _randn(6, 7) * 50),
    "int_pow_and_bits": (lambda x: (x ** 2, 2 ** x.clamp(0, 10), x << 2, x >> 1, x & 5, x | -3, ~x),
                         _randint(6, 7)),
    "bool_and_int_reductions": (lambda b, x: (b.sum(), b.sum(0), b.prod(1), x.sum(1), x.cumsum(0), b.any(),
                                              b.all(1)),
                                _randint(6, 7) > 0, _randint(6, 7, dtype=torch.int32)),
    "half_and_bfloat16": (lambda x, y: ((x @ y).float(), (x * y.t()).sum(1), x.softmax(1),
                                        x.to(torch.bfloat16).sum(0)),
                          _randn(5, 6, dtype=torch.float16), _randn(6, 5, dtype=torch.float16, seed=1)),
    # reductions: NaN, ties, empty and size-1 dims, all dims
    "nan_reductions": (lambda x: (x.amax(1), x.amin(0), x.max(1), x.min(0), x.argmax(1), x.argmin(0), x.max(),
                                  x.argmax(), torch.maximum(x, x.flip(1)), torch.fmax(x, x.flip(1)),
                                  x.clamp(-0.5, 0.5), x.relu(), x.nansum(1), x.logsumexp(1)),
                       T([[1., NAN, 3., NAN], [NAN, NAN, NAN, NAN], [2., 2., -INF, INF],
                          [-INF, -INF, -INF, -INF]])),
    "argmax_ties": (lambda x: (x.argmax(), x.argmin(1), x.max(dim=1), x.min(0)),
                    _randint(6, 70, low=0, high=3).float()),
    "softmax_infinities": (lambda x: (x.softmax(1), x.log_softmax(1), x.softmax(0)),
                           T([[-INF, -INF, -INF], [0., -INF, 1.], [INF, 0., 1.]])),
    "size0_reductions": (lambda x: (x.sum(0), x.prod(0), x.mean(0), x.sum(1), x.softmax(0), x.cumsum(0),
                                    x.amax(1), x + 1, x.sum()), _randn(0, 3)),
    "size1_reductions": (lambda x: (x.sum(0), x.amax(1, keepdim=True), x.mean(), x.prod(0), x.var(0),
                                    x.std(1), torch.var_mean(x, 1)), _randn(1, 1)),
    "empty_dim_lists": (lambda x: (x.sum(dim=[]), x.amax(dim=()), x.mean(dim=[]), x.var(())), _randn(3, 4)),
    "zero_d": (lambda x, s: (x * s + s, s.sum(), s.cumsum(0), s.argmax(), s.unsqueeze(0).expand(3)),
               _randn(6, 7), T(2.5)),
    "cumulative": (lambda x: (x.cumsum(1), x.cumprod(0), x.cummax(0), x.cummin(1), torch.logcumsumexp(x, 1),
                              x.cumsum(-1, dtype=torch.float64)), _randn(5, 7)),
    "layer_norm_odd": (lambda x, w, b: (F.layer_norm(x, (3, 5), w, b), F.layer_norm(x, (5,)),
                                        F.layer_norm(x[:, :1], (1, 5)), F.rms_norm(x, (5,))),
                       _randn(7, 3, 5), _randn(3, 5, seed=1), _randn(3, 5, seed=2)),
    # shape ops
    "cat_pad_flip_roll": (lambda x: (torch.cat([x, x.t()[:1].t()], 1), F.pad(x, (1, 2, 0, 3)), x.flip(1),
                                     x.roll(2, 0), torch.cat([x.reshape(-1), torch.empty(0)]),
                                     F.pad(x, (-1, 2)), F.pad(x[None], (2, 1), mode="reflect")),
                          _randn(6, 7)),
    "unfold_diagonal_reshape": (lambda x: (x.unfold(1, 3, 2).sum(-1), x.diagonal() * 2 + x.diagonal(1).sum(),
                                           x.t().reshape(-1) * 2, x[:, 1:].reshape(-1, 5) @ x[:, :5].t()),
                                _randn(6, 6)),
    "where_and_masks": (lambda x: (torch.where(x > 0, x, 0.0), x.masked_fill(x > 1, 3),
                                   torch.where(x > 0, 1.0, -1), torch.where(x > 0, x.long(), 0.5),
                                   x.masked_fill(x > 0, T(3.0))), _randn(6, 7)),
    "indexing": (lambda x, i: (x[i], x[:, i[:2]], x[i, i], x.gather(1, i.expand(5, 3)),
                               x.scatter(1, i.expand(5, 3), 0.0), x.index_add(0, i, x[:3]), torch.take(x, i)),
                 _randn(5, 7), T([1, 1, 4])),
    # externs on views
    "linear_conv_views": (lambda x, w, b, c, k: (F.linear(x[1:], w.t(), b), F.conv2d(c[:, :, 1:], k),
                                                 F.conv2d(c.contiguous(memory_format=torch.channels_last), k,
                                                          stride=2, padding=1)),
                          _randn(5, 6), _randn(6, 4, seed=1), _randn(4, seed=2), _randn(2, 3, 9, 8, seed=3),
                          _randn(4, 3, 3, 3, seed=4)),
    "matmul_broadcast_views": (lambda a, b, v: (v[:4] @ a, a @ v[:5], a @ b[1:].t(),
                                                torch.matmul(a.expand(3, 4, 5), b[:5, :4].unsqueeze(0)),
                                                torch.addmm(v[:4], a, b[:5, :4], beta=0.5, alpha=2)),
                               _randn(4, 5), _randn(6, 5, seed=1), _randn(5, seed=2)),
    "sdpa_views": (lambda q, k, v, m: (F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                      v.transpose(1, 2)),
                                       F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0, scale=0.3)),
                   _randn(2, 5, 3, 4), _randn(2, 5, 3, 4, seed=1), _randn(2, 5, 3, 4, seed=2),
                   _randn(3, 3, seed=3)),
    # over the parallel threshold, odd sizes (SIMD tails, thread splits)
    "large_rows_and_columns": (lambda x: ((x.exp() + 1).sum(1), (x.sin() * 2).sum(0), x.t().softmax(1),
                                          x.argmax(0), x.amax(1)), _randn(257, 131)),
    "large_1d": (lambda x: ((x.sin() * 2).sum(), x.cumsum(0), x.argmax(), x.amax()), _randn(40003)),
    "large_argmax_ties_across_threads": (lambda x: (x.argmax(), x.argmin(), x.max(0),
                                                    x.view(37, -1).argmax(0),
                                                    x.view(37, -1).argmax(1)), torch.zeros(37 * 1111)),
    "large_nan_across_threads": (lambda x: (x.argmax(), x.amax(), x.max(0), x.sum()),
                                 torch.zeros(40003).index_fill_(0, T([30001, 35000]), NAN)),
    "large_int_sum": (lambda x: (x.sum(), x.sum(0), x.cumsum(0)[-5:], (x * x).sum(1)),
                      _randint(5714, 7, low=-1000, high=1000)),
    "large_bfloat16": (lambda x: (x.sum(), x.float().sum(1), x.mean(0), x.softmax(1)),
                       _randn(200, 203, dtype=torch.bfloat16)),
    "large_softmax_row": (lambda x: (x.softmax(-1), x.log_softmax(-1), F.layer_norm(x, (40003,))),
                          _randn(2, 40003)),
    "large_column_reductions": (lambda x: (x.sum(0), x.amax(0), x.argmax(0), x.var(0), x.cumsum(0)),
                                _randn(40003, 3)),
}


# kiln runs these eagerly on purpose (in-place updates of aliased memory): values are still compared
BREAKS = {"same_input_inplace", "mutate_input_read_alias"}


@pytest.mark.parametrize("name", list(CASES))
def test_adversarial_program(name):
    fn, *inputs = CASES[name]
    check(fn, *inputs, fullgraph=name not in BREAKS)


def test_layout_changes_between_calls():
    fn = lambda x, w: ((x * 2) @ w + x.sum()).relu()  # noqa: E731
    compiled = cpp(fn)
    w = _randn(6, 3, seed=1)
    for x in [_randn(5, 6), _randn(6, 5).t(), _randn(7, 6)[2:], _randn(1, 6).expand(5, 6), _randn(5, 6)]:
        _close(compiled(x, w), fn(x, w), f"x strides {x.stride()} offset {x.storage_offset()}")
    _close(compiled(_randn(5, 6), _randn(8, 3)[2:]), fn(_randn(5, 6), _randn(8, 3)[2:]), "w with an offset")


def test_globals_parameters_and_scalars_between_calls():
    weight = torch.nn.Parameter(_randn(4, 6))
    layer = torch.nn.Linear(6, 4)
    compiled = cpp(layer)
    x = _randn(5, 6)
    with torch.no_grad():
        compiled(x)
        layer.weight.mul_(2)  # an optimizer step
        _close(compiled(x), layer(x), "after an in-place parameter update")
        layer.weight = weight
        _close(compiled(x), layer(x), "after rebinding the parameter")
    scaled = cpp(lambda x, a: x * a + a)
    for a in [2.0, 3.0, 3, T(5.0)]:
        _close(scaled(x, a), x * a + a, f"a={a!r}")


def test_kept_outputs_survive_later_calls():
    """The wrapper recycles an output buffer the caller dropped; any live reference must keep it."""
    compiled = cpp(lambda x: x * 2 + 1)
    x = _randn(300, 300)
    whole = lambda t: t  # noqa: E731
    holders = {  # how the caller keeps the output: (hold, read back as a tensor, the part it sees)
        "tensor": (whole, whole, whole),
        "view": (lambda o: o[1:], whole, lambda t: t[1:]),
        "row": (lambda o: o[0], whole, lambda t: t[0]),
        "numpy": (lambda o: o.numpy(), torch.from_numpy, whole),
        "list": (lambda o: [o], lambda k: k[0], whole),
        "data": (lambda o: o.data, whole, whole),
        "detach": (lambda o: o.detach(), whole, whole),
        "dlpack": (torch.utils.dlpack.to_dlpack, torch.utils.dlpack.from_dlpack, whole),
    }
    for how, (hold, read, part) in holders.items():
        out = compiled(x)
        expected = part(out.clone())
        kept = hold(out)
        del out
        for scale in (3.0, 5.0):
            compiled(x * scale)
        _close(read(kept), expected, f"output kept as {how}")


# ---------------------------------------------------------------------------------------------------------
# Known miscompiles and internal errors, minimized (strict: a fix makes them pass, then drop the mark)


def test_fill_of_expanded_input():
    def fn(x):
        x.zero_()
        return x + 1
    check(fn, _randn(1).expand(4))


def _setitem_2d_mask(x):
    x[x > 0] = 0.0
    return x


def test_setitem_with_2d_mask_in_one_graph():
    check(_setitem_2d_mask, _randn(5, 7))


def test_recycled_output_held_by_its_storage():
    compiled = cpp(lambda x: x * 2)
    out = compiled(torch.ones(4))
    storage = out.untyped_storage()
    del out
    compiled(torch.full((4,), 5.0))
    kept = torch.empty(0).set_(storage)
    _close(kept, torch.full((4,), 2.0), "output kept through its storage")


def test_recycled_output_held_by_weakref():
    compiled = cpp(lambda x: x * 2)
    out = compiled(torch.ones(4))
    ref = weakref.ref(out)
    del out
    compiled(torch.full((4,), 5.0))
    assert ref() is None or torch.equal(ref(), torch.full((4,), 2.0))


def test_int_min_floor_divide_by_minus_one(tmp_path):
    import subprocess
    import sys
    code = ("import torch, kiln\n"
            "from kiln import config\n"
            f"with config.patch(cache_dir={str(tmp_path)!r}, raise_on_error=True):\n"
            "    x = torch.tensor([-2**63, -1, 7])\n"
            "    out = kiln.compile(lambda x: x // -1, backend='cpp', fullgraph=True)(x)\n"
            "    assert torch.equal(out, x // -1), out\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"


def _item_then_data_then_update(x):
    z = x.sum().item()
    w = x.data
    x.add_(1)
    return x


def test_resume_of_a_resume_with_a_stack_value():
    try:
        check(_item_then_data_then_update, _randn(3), fullgraph=False)
    except UnboundLocalError as e:
        # re-raised without its traceback: the resume function's frame has no line number, which pytest's
        # traceback printer cannot handle (INTERNALERROR)
        raise AssertionError(f"UnboundLocalError: {e}") from None


def test_maximum_of_signed_zeros():
    check(lambda x, y: (1 / torch.maximum(x, y), 1 / torch.minimum(x, y)), T([0.0, -0.0]), T([-0.0, 0.0]))


def _view_of_updated_input(x):
    x.add_(1)
    return x[1]


def test_view_of_updated_input_aliases_the_input():
    x = _randn(2, 3)
    eager_x, kiln_x = x.clone(), x.clone()
    _view_of_updated_input(eager_x).mul_(0)
    cpp(_view_of_updated_input)(kiln_x).mul_(0)
    _close(kiln_x, eager_x, "input after writing through the returned view")


def _update_view_after_break(x):
    x.add_(1)
    y = x[1]
    x.sum()  # y lives past the graph break below
    y.mul_(0)  # breaks: an in-place update of an aliased tensor


def test_update_through_view_of_updated_input_after_break():
    check(_update_view_after_break, _randn(2, 3), fullgraph=False)


# ---------------------------------------------------------------------------------------------------------
# The random program generator
#
# A program is Python source: `def inputs()` builds the inputs (views with offsets, transposes, expands,
# inputs aliasing each other), `def program(...)` is a straight line of torch calls drawn from the op table
# below, each kept only if it runs eagerly on the inputs. Values that compare or round (>, floor, argmax,
# float -> int) are only drawn on *exact* values — computed without a rounding step whose result a fused
# kernel may legitimately change (a reassociated sum, an fma, a vectorized exp) — so a mismatch is a bug.

# ops whose low-precision results are exact however a kernel rounds its intermediates (they select)
_SELECTS = re.compile(r"^[a-z0-9_]+(\.(flip|unsqueeze|reshape|flatten|narrow|roll|repeat|contiguous|expand|"
                      r"unfold|movedim|clone|permute|t|mT|diagonal|squeeze|transpose|amax|amin|index_select|"
                      r"detach)\(.*\)|\[.*\])$")
_INPLACE = re.compile(r"^[a-z0-9_]+\.[a-z_]+_\(")
_SIZES = [1, 1, 2, 3, 4, 5, 7, 8, 16, 17, 33]
_FLOATS = [torch.float32] * 8 + [torch.float64, torch.float16, torch.bfloat16]


class _Value:
    def __init__(self, name, value, exact):
        self.name, self.value, self.exact = name, value, exact

    @property
    def is_float(self):
        return self.value.dtype.is_floating_point


def _literal(x):
    return repr(x) if not isinstance(x, float) or x == x else "float('nan')"


class ProgramGenerator:
    """Random straight-line torch programs; `source()` prints one, runnable."""

    def __init__(self, seed: int, steps: int | None = None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.input_lines: list[str] = []
        self.body: list[str] = []
        self.values: list[_Value] = []
        self.params: list[str] = []
        self.env: dict = {"torch": torch, "F": F}
        self.updated_inputs: set[int] = set()  # storages of inputs updated in place
        self._make_inputs()
        self._make_body(steps if steps is not None else self.rng.randint(2, 12))

    # ---- inputs
    def _shape(self):
        r = self.rng
        if r.random() < 0.08:
            return r.choice([(130, 257), (40003,), (3, 129, 97), (257, 131)])  # over the parallel threshold
        return tuple(r.choice(_SIZES) for _ in range(r.choice([0, 1, 1, 2, 2, 2, 3, 3, 4])))

    def _make_input(self, name):
        """Statements that bind input `name`."""
        r = self.rng
        kind = r.random()
        if self.params and kind < 0.12:  # an alias of an earlier input: itself, a slice, a transpose
            other = r.choice([v for v in self.values if v.name in self.params])
            t = other.value
            options = [other.name]
            if t.ndim >= 1 and t.shape[0] > 1:
                options.append(f"{other.name}[1:]")
            if t.ndim >= 2:
                options.append(f"{other.name}.transpose(0, 1)")
            return [f"{name} = {r.choice(options)}"]
        shape = self._shape()
        dtype = r.choice(_FLOATS) if kind < 0.8 else r.choice([torch.int64, torch.int32, torch.bool])
        n = len(shape)
        base_shape = list(shape)
        suffix = ""
        layout = r.random()
        if n and layout < 0.2:  # a slice of a larger tensor: nonzero storage offset
            d = r.randrange(n)
            base_shape[d] += 2
            suffix = "[" + ", ".join(":" if i != d else "2:" for i in range(d + 1)) + "]"
        elif n and layout < 0.3:  # every other element
            d = r.randrange(n)
            base_shape[d] = 2 * shape[d]
            suffix = "[" + ", ".join(":" if i != d else "::2" for i in range(d + 1)) + "]"
        elif n >= 2 and layout < 0.45:  # transposed
            base_shape = list(reversed(shape))
            suffix = f".permute({', '.join(str(i) for i in reversed(range(n)))})"
        elif n and layout < 0.55:  # expanded from a size-1 dim (stride 0)
            d = r.randrange(n)
            base_shape[d] = 1
            suffix = f".expand({tuple(shape)})"
        base_shape = tuple(base_shape)
        if dtype.is_floating_point:
            make = f"torch.randn({base_shape}, generator=g, dtype={dtype})"
            if r.random() < 0.15:
                make += ".round()"  # ties for max/argmax, exact small integers
        elif dtype == torch.bool:
            make = f"(torch.randn({base_shape}, generator=g) > 0)"
        else:
            make = f"torch.randint(-9, 10, {base_shape}, generator=g, dtype={dtype})"
        lines = [f"{name} = {make}"]
        if dtype.is_floating_point and r.random() < 0.1:
            lines.append(f"{name}[torch.rand({base_shape}, generator=g) < 0.2] = float('nan')")
        if suffix:
            lines.append(f"{name} = {name}{suffix}")
        return lines

    def _make_inputs(self):
        self.input_lines.append(f"g = torch.Generator().manual_seed({self.seed})")
        exec(self.input_lines[0], self.env)
        for i in range(self.rng.choice([1, 1, 2, 2, 3])):
            name = f"a{i}"
            for line in self._make_input(name):
                self.input_lines.append(line)
                exec(line, self.env)
            self.params.append(name)
            self.values.append(_Value(name, self.env[name], exact=True))

    # ---- the body
    def _pick(self, pred=lambda v: True):
        cands = [v for v in self.values if pred(v)]
        return self.rng.choice(cands) if cands else None

    def _dim(self, v):
        return self.rng.randrange(-v.value.ndim, v.value.ndim) if v.value.ndim else 0

    def _candidates(self):
        """(expression, exact) pairs to try, drawn around a random value."""
        r = self.rng
        v = self._pick()
        t = v.value
        x, n, fl, ex = v.name, t.ndim, v.is_float, v.exact
        low = t.dtype in (torch.float16, torch.bfloat16)
        d = self._dim(v)
        out = []
        # pointwise
        if fl:
            out += [(f"{x}.{op}()", False) for op in r.sample(
                ["exp", "sin", "tanh", "sigmoid", "rsqrt", "log", "sqrt", "erf", "expm1", "log1p",
                 "reciprocal",
                 "atan"], 2)]
            out += [(f"torch.relu({x})", ex), (f"{x}.abs()", ex), (f"-{x}", ex), (f"{x} * {x}", False),
                    (f"F.gelu({x})", False), (f"F.silu({x})", False), (f"{x}.clamp(-0.5, 0.7)", ex),
                    (f"torch.nan_to_num({x}, nan=0.5, posinf=2.0)", ex), (f"{x} ** 2", False),
                    (f"{x}.pow(0.5)", False), (f"{x} + 1", ex), (f"{x} - 0.25", ex), (f"2.5 * {x}", False),
                    (f"{x} / 3", False), (f"torch.sign({x})", ex)]
            if ex:
                out += [(f"{x}.floor()", True), (f"{x}.round()", True), (f"{x}.trunc()", True),
                        (f"({x} > 0)", True), (f"({x} <= {x}.flip(-1))", True),
                        (f"{x}.to(torch.int64)", True),
                        (f"{x}.to(torch.int32)", True), (f"{x}.to(torch.bool)", True),
                        (f"{x} // 0.75", True), (f"torch.remainder({x}, -1.5)", True), (f"{x}.isnan()", True),
                        (f"torch.where({x} > 0, {x}, 0.0)", True), (f"{x}.masked_fill({x} < 0, -2.0)", True)]
            out += [(f"{x}.to(torch.float64)", ex), (f"{x}.to(torch.float16)", False),
                    (f"{x}.to(torch.bfloat16)", False), (f"{x}.float()", ex)]
        elif t.dtype == torch.bool:
            out += [(f"~{x}", True), (f"{x}.logical_not()", True), (f"{x}.long()", True),
                    (f"{x}.float()", True),
                    (f"{x}.sum({d})", True), (f"{x}.any({d})", True), (f"{x}.all()", True),
                    (f"torch.where({x}, 1.5, -2.0)", True), (f"{x}.int() * 3", True)]
        else:
            out += [(f"{x} // 3", True), (f"{x} % 3", True), (f"{x} // -2", True),
                    (f"torch.remainder({x}, -3)", True),
                    (f"torch.fmod({x}, 3)", True), (f"{x}.float()", True), (f"{x} * 2 + 1", True),
                    (f"{x}.abs()", True), (f"-{x}", True), (f"{x} / 2", True), (f"{x}.clamp(-2, 3)", True),
                    (f"{x} > 0", True), (f"{x}.to(torch.float16)", True), (f"{x} + 0.5", True),
                    (f"{x}.sum({d})", True), (f"{x}.cumsum({d})", True), (f"{x}.bitwise_and(6)", True),
                    (f"{x} << 1", True), (f"{x}.to(torch.int8)", True), (f"{x}.sign()", True)]
        # binary, with a partner of a broadcastable shape
        w = self._pick(lambda u: u is not v and self._broadcasts(u.value, t))
        if w is not None:
            y, both = w.name, ex and w.exact
            out += [(f"{x} + {y}", both), (f"{x} - {y}", both), (f"{x} * {y}", False),
                    (f"torch.maximum({x}, {y})", both), (f"torch.minimum({x}, {y})", both),
                    (f"torch.add({x}, {y}, alpha=2)", False), (f"torch.where({x} > {y}, {x}, {y})", both),
                    (f"({x} == {y})", both), (f"torch.lerp({x}, {y}, 0.3)", False)]
            if both:
                out += [(f"({x} < {y})", True), (f"torch.where({y} > 0, {x}, {y})", True)]
            if fl or w.is_float:
                out += [(f"{x} / {y}", False), (f"torch.atan2({x}, {y})", False)]
        out.append((f"{x} + torch.tensor(1.5)", ex))
        out.append((f"{x} * torch.tensor(3)", False if fl else True))
        # reductions and scans
        if n:
            kd = r.choice([False, True])
            out += [(f"{x}.sum({d}, keepdim={kd})", not fl), (f"{x}.amax({d}, keepdim={kd})", ex),
                    (f"{x}.amin({d})", ex), (f"{x}.max({d})[0]", ex), (f"{x}.mean({d})", False),
                    (f"{x}.var({d})", False), (f"{x}.std({d}, correction=0)", False),
                    (f"{x}.logsumexp({d})", False), (f"{x}.softmax({d})", False),
                    (f"{x}.log_softmax({d})", False), (f"{x}.cumsum({d})", not fl),
                    (f"{x}.sum()", not fl), (f"{x}.amax()", ex), (f"{x}.norm(dim={d})", False),
                    (f"torch.count_nonzero({x}, {d})", ex), (f"{x}.sum(({d}, -1))", not fl),
                    (f"{x}.mean(dim=-1, keepdim=True)", False), (f"{x}.sum(dim=[])", not fl)]
            if ex:  # indices: a tie or an order decided by a rounding would differ legitimately
                out += [(f"{x}.min({d}).indices", True), (f"{x}.argmax({d}, keepdim={kd})", True),
                        (f"{x}.argmin()", True), (f"{x}.cummax({d})[1]", True)]
            if fl and not low:  # products overflow (half precision, computed wider by kiln; integers wrap)
                out += [(f"{x}.prod({d})", False), (f"{x}.cumprod({d})", False)]
            if fl:
                out += [(f"F.layer_norm({x}, {tuple(t.shape[-1:])})", False),
                        (f"F.layer_norm({x}, {tuple(t.shape[-2:])})", False), (f"{x}.cummax({d})[0]", ex),
                        (f"F.rms_norm({x}, {tuple(t.shape[-1:])})", False)]
                if not low:
                    out.append((f"F.normalize({x}, dim={d})", False))
        # views and layout
        if n:
            out += [(f"{x}.flip({d})", ex), (f"{x}[1:]", ex), (f"{x}[..., ::2]", ex), (f"{x}[-1]", ex),
                    (f"{x}.unsqueeze({d})", ex), (f"{x}.reshape(-1)", ex), (f"{x}.flatten()", ex),
                    (f"{x}.narrow({d}, {min(1, t.shape[d] - 1)}, {max(1, t.shape[d] // 2)})", ex),
                    (f"{x}.roll(1, {d})", ex), (f"torch.cat([{x}, {x}.flip({d})], {d})", ex),
                    (f"torch.stack([{x}, {x} + 1], {d})", ex),
                    (f"{x}.repeat({', '.join(['2'] + ['1'] * (n - 1))})", ex),
                    (f"{x}.contiguous()", ex), (f"{x}[None].expand(2, *{x}.shape)", ex),
                    (f"{x}.unfold({d}, 2, 1)", ex), (f"{x}.movedim(0, -1)", ex), (f"{x}.clone()", ex),
                    # views run by torch (no decomposition): their results alias kiln's buffers
                    # (not .data: with a graph break before it, test_resume_of_a_resume_with_a_stack_value)
                    (f"{x}.detach()", ex), (f"{x}.requires_grad_(False)", ex),
                    (f"{x}.as_strided({tuple(t.shape)}, {tuple(t.stride())})", ex),
                    (f"{x}.sum({d}, dtype=torch.float64)", not fl)]
            if ex:
                out += [(f"{x}.sort({d}, stable=True)[{r.randint(0, 1)}]", True),
                        (f"{x}.scatter({d}, {x}.argsort({d}, stable=True), {x})", True)]
            if t.dtype == torch.float32:
                out.append((f"{x}.view(torch.int32).view(torch.float32) + 1", ex))
            if w is not None and t.ndim == w.value.ndim and n:
                out += [(f"torch.cat([{x}, {w.name}], {d})", ex and w.exact)]
            if t.dtype.is_floating_point or t.dtype == torch.int64:
                pad = tuple(r.choice([0, 1, 2]) for _ in range(2 * min(n, 2)))
                out += [(f"F.pad({x}, {pad})", ex), (f"F.pad({x}, {pad[:2]}, value=-1)", ex)]
        if n >= 2:
            out += [(f"{x}.t()" if n == 2 else f"{x}.transpose(0, 1)", ex), (f"{x}.mT", ex),
                    (f"{x}.diagonal()", ex), (f"{x}.diagonal(1, 0, -1)", ex), (f"{x}[:, 1:-1]", ex),
                    (f"{x}.permute(*reversed(range({n})))", ex), (f"{x}.reshape({t.shape[0]}, -1)", ex),
                    (f"{x}.transpose(0, -1).reshape(-1)", ex), (f"{x}[1:].transpose(0, 1).contiguous()", ex),
                    (f"{x}.squeeze()", ex), (f"{x}.sum(0).expand({tuple(t.shape)})", not fl)]
            if fl:
                out += [(f"{x} @ {x}.mT", False), (f"{x}.mT @ {x}", False),
                        (f"F.linear({x}, {x}[..., :3, :])", False), (f"torch.tril({x})", ex),
                        (f"torch.triu({x}, 1)", ex)]
        if n >= 1 and t.shape[0] >= 1:
            idx = [r.randrange(t.shape[0]) for _ in range(r.choice([1, 3]))]
            out += [(f"{x}[torch.tensor({idx})]", ex), (f"{x}.index_select(0, torch.tensor({idx}))", ex),
                    (f"{x}.gather({d}, {x}.argmax({d}, keepdim=True))", ex) if ex else (f"{x}", ex)]
        # in-place updates (of intermediates and of inputs); a read-modify-write of a tensor whose elements
        # share memory (unfold, expand) has an order-dependent result in eager itself: fills only
        out += [(f"{x}.zero_()", True), (f"{x}.fill_(3)", True)]
        if torch._debug_has_internal_overlap(t) != 0:
            return out
        out += [(f"{x}.add_(1)", ex), (f"{x}.mul_(2)", False if fl else ex)]
        if fl:
            out += [(f"{x}.clamp_(min=-0.25)", ex), (f"{x}.relu_()", ex), (f"{x}.exp_()", False),
                    (f"{x}.sigmoid_()", False)]
            if ex:
                out.append((f"{x}.masked_fill_({x} > 0.5, 0.5)", True))
        if n:
            out += [(f"{x}.__setitem__(0, 7)", ex),
                    (f"{x}.__setitem__((slice(None), slice(1, None, 2)), 0)", ex),
                    (f"{x}.index_put_((torch.tensor([0, 0]),), torch.tensor(1).to({x}.dtype), "
                     "accumulate=True)",
                     ex if not fl else False), (f"{x}.index_fill_({d}, torch.tensor([0]), -1)", ex)]
            if w is not None:
                out += [(f"{x}.copy_({w.name})", w.exact), (f"{x}.add_({w.name})", ex and w.exact),
                        (f"{x}.__setitem__(..., {w.name})", w.exact)]
        return out

    @staticmethod
    def _broadcasts(a, b):
        try:
            return torch.broadcast_shapes(a.shape, b.shape) == b.shape and a.numel() > 0 or a.shape == b.shape
        except RuntimeError:
            return False

    def _graph_break(self, name):
        """(statement lines, exact) binding `name` past a graph break: a branch on a tensor's value, or a
        Python number read from a tensor, or None."""
        v = self._pick(lambda u: u.exact and u.value.numel() > 0 and u.value.dtype != torch.bool)
        w = self._pick()
        if v is None or w is None or not (w.is_float or w.value.dtype == torch.int64):
            return None
        if self.rng.random() < 0.5:
            return [f"if {v.name}.amax() > 0.5:", f"    {name} = {w.name} + 1", "else:",
                    f"    {name} = {w.name} * -{w.name}"], False
        return [f"{name} = {w.name} * float({v.name}.sum().item())"], False

    def _make_body(self, steps):
        import warnings
        made = 0
        tries = 0
        while made < steps and tries < 20 * steps:
            tries += 1
            name = f"v{len(self.values)}"
            lines = None
            if self.rng.random() < 0.04:
                found = self._graph_break(name)
                if found is None:
                    continue
                lines, exact = found
                expr = None
            else:
                expr, exact = self.rng.choice(self._candidates())
            saved = {v.name: v.value.clone() for v in self.values}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if lines is not None:
                        exec("\n".join(lines), self.env)
                        value = self.env[name]
                    else:
                        value = eval(expr, self.env)
            except Exception:
                # an in-place op may have failed half way: restore the values it could have touched
                self._restore(saved)
                continue
            if not isinstance(value, torch.Tensor) or value.numel() > 1 << 20:
                self._restore(saved)
                continue
            if expr is not None and _INPLACE.match(expr):
                target = next(u for u in self.values if u.name == expr.split(".")[0])
                ptr = target.value.untyped_storage().data_ptr()
                if any(st == 0 and n > 1 for st, n in zip(target.value.stride(), target.value.shape)) or (
                        ptr in self.updated_inputs and target.name not in self.params):
                    # known bugs: test_fill_of_expanded_input and
                    # test_update_through_view_of_updated_input_after_break (xfail)
                    self._restore(saved)
                    continue
                if any(v.value.untyped_storage().data_ptr() == ptr
                       for v in self.values if v.name in self.params):
                    self.updated_inputs.add(ptr)
                if not exact:  # the update reaches every value sharing the target's memory
                    for u in self.values:
                        if u.value.untyped_storage().data_ptr() == ptr:
                            u.exact = False
                if ".__setitem__" in expr:
                    self.body.append(expr)
                    made += 1
                    continue
            if value.dtype in (torch.float16, torch.bfloat16) and exact and expr is not None and \
                    not _SELECTS.search(expr):
                exact = False  # a fused kernel rounds low-precision intermediates at a different point
            self.env[name] = value
            self.body.extend(lines if lines is not None else [f"{name} = {expr}"])
            self.values.append(_Value(name, value, exact or not value.dtype.is_floating_point))
            made += 1

    def _restore(self, saved):
        """Write the values saved before a failed or rejected in-place op back into the same tensors."""
        for v in self.values:
            try:
                v.value.copy_(saved[v.name])
            except RuntimeError:  # an expanded tensor (it cannot have been written either)
                pass

    def outputs(self):
        computed = [v.name for v in self.values if v.name not in self.params]
        if not computed:
            return self.params[:1]
        picks = {computed[-1]}
        for _ in range(self.rng.randint(0, 2)):
            picks.add(self.rng.choice(computed + self.params))
        return sorted(picks, key=lambda s: (s[0], int(s[1:])))

    def source(self):
        lines = ["def inputs():"] + [f"    {l}" for l in self.input_lines] + \
                [f"    return [{', '.join(self.params)}]", "", "", f"def program({', '.join(self.params)}):"]
        lines += [f"    {l}" for l in self.body]
        lines.append(f"    return {', '.join(self.outputs())},")
        return "\n".join(lines) + "\n"


def build_program(seed):
    """(source, program, inputs) of random program `seed`."""
    import linecache
    src = ProgramGenerator(seed).source()
    filename = f"<kiln fuzz program {seed}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    env = {"torch": torch, "F": F}
    exec(compile(src, filename, "exec"), env)
    return src, env["program"], env["inputs"]


def run_program(seed):
    src, program, inputs = build_program(seed)
    try:
        check(program, *inputs(), fullgraph=False)
    except Exception as e:
        # the message carries the cause; chaining it would show kiln's generated frames, which have no
        # line numbers for pytest's traceback printer
        raise AssertionError(f"random program {seed} differs from eager: {type(e).__name__}: {e}\n"
                             f"{src}") from None


@pytest.mark.parametrize("chunk", range(4))
def test_random_programs(chunk):
    for seed in range(chunk, FUZZ_SEEDS, 4):
        run_program(seed)


@pytest.mark.slow
def test_random_programs_sweep():
    for seed in range(1000, 1000 + FUZZ_SLOW_SEEDS):
        run_program(seed)
