"""In-place updates through views are recorded functionally (kiln/ops/views.py): one graph, no break, and
the inputs, their views and the results end with eager's values, on the eager and the cpp backends."""
from __future__ import annotations

import pytest
import torch
from capture_helpers import check


def slice_iadd(x, y):
    y = y.clone()
    y[:, 2] += 5
    return y


def mask_assign(x, y):
    x[x > 0] = 1.0
    return x * 2


def flat_stride_zero(x, y):
    x.view(12)[::3].zero_()
    return x + 1


def transposed_row(x, y):
    y = y * 1
    y.t()[0].add_(1)
    return y


def narrow_copy(x, y):
    x.narrow(0, 1, 1).copy_(y[:1])
    return x.sum(0)


def view_then_read_base(x, y):
    v = x[1]
    v.mul_(3)
    return x * 1, v * 1


def base_update_seen_by_view(x, y):
    z = y.clone()
    v = z[:, 1:3]
    z.add_(1)
    return v + 0, z


def chained_views(x, y):
    z = y.clone()
    a = z.view(4, 3)
    b = a.t()
    b[1].fill_(7)
    return z, a + 0


def two_views_one_base(x, y):
    z = x.clone()
    top, bottom = z[0], z[2]
    top.add_(bottom)
    bottom.sub_(1)
    return z, top * 1, bottom * 1


def split_pieces(x, y):
    z = y.clone()
    a, b = z.split(2, dim=1)
    a.mul_(2)
    return z, b + 0


def unsqueeze_expand_read(x, y):
    z = x.clone()
    u = z.unsqueeze(0)
    u[0, 0].zero_()
    return z


def reshape_copy_is_not_a_view(x, y):
    t = y.t()                      # non-contiguous: reshape copies
    r = t.reshape(12)
    r.add_(100)                    # must not reach y
    return y * 1, r


def input_view_mutated(x, y):
    x[0].add_(10)
    y[:, -1] = 0.5
    return x.sum() + y.sum()


PROGRAMS = [slice_iadd, mask_assign, flat_stride_zero, transposed_row, narrow_copy, view_then_read_base,
            base_update_seen_by_view, chained_views, two_views_one_base, split_pieces, unsqueeze_expand_read,
            reshape_copy_is_not_a_view, input_view_mutated]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["eager", "auto"])
def test_view_update_matches_eager(fn, backend):
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    check(fn, x, y, backend=backend, graphs=1, breaks=0)


def test_view_update_of_input_requiring_grad_runs_eagerly():
    def f(w):
        with torch.no_grad():
            w[0].mul_(2)
        return w * 1
    w = torch.randn(3, 4, requires_grad=True)
    check(f, w)


def test_expanded_view_update_is_refused_like_eager():
    def f(x):
        e = x[:1].expand(3, 4)
        e.add_(1)
        return x
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError):
        f(x.clone())
    import kiln
    kiln.reset()
    with pytest.raises(RuntimeError):
        kiln.compile(f, backend="eager")(x.clone())


# found by review: each must behave as eagerly (values, raised errors, strides, aliasing)
def restride_in_place(x, y):
    z = x + 0
    v = z[0]
    z.t_()          # strides change, the storage does not move: v keeps reading its elements
    z.mul_(2)
    return v * 1, z * 1


def reads_what_it_writes(x, y):
    x.add_(x[0])    # eager refuses a partial overlap of input and output
    return x


def out_overlapping_input(x, y):
    torch.mul(x[:2], 2, out=x[1:])
    return x


def unfolded_view_update(x, y):
    v = x.reshape(-1).unfold(0, 2, 1)   # overlapping elements: each shared one is bumped twice
    v.add_(1)
    return x


@pytest.mark.parametrize("fn", [restride_in_place, reads_what_it_writes, out_overlapping_input,
                                unfolded_view_update], ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["eager", "auto"])
def test_unsafe_view_updates_match_eager(fn, backend):
    import kiln
    for _ in range(2):
        x, y = torch.arange(12.).reshape(3, 4), torch.ones(3, 4)
        xe, xk = x.clone(), x.clone()
        try:
            expected, raised = fn(xe, y), None
        except RuntimeError as e:
            expected, raised = None, type(e)
        kiln.reset()
        if raised is not None:
            with pytest.raises(raised):
                kiln.compile(fn, backend=backend)(xk, y)
            continue
        got = kiln.compile(fn, backend=backend)(xk, y)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(xk, xe)
        assert xk.stride() == xe.stride()


def test_non_view_aliases_of_mutated_input_stay_aliases():
    import kiln

    def f(x):
        x.add_(1)
        return x.detach(), x.as_strided((2,), (1,))
    for backend in ("eager", "auto"):
        kiln.reset()
        x = torch.zeros(4)
        outs = kiln.compile(f, backend=backend)(x)
        assert all(o.data_ptr() == x.data_ptr() for o in outs)
        torch.testing.assert_close(x, torch.ones(4))
