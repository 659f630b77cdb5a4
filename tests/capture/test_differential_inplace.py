"""Differential programs: in-place updates of tensors and their views, on locals and on inputs (inputs must
end with eager's values): indexed and masked assignment, views of views, copy_, narrow, transposes,
aliasing between inputs, in-place ops returning self."""
from __future__ import annotations

import pytest
import torch
from diff_helpers import params, run_program

A = torch.randn(4, 6)
B = torch.randn(4, 6)
V = torch.randn(6)
IDX = torch.tensor([0, 2])


def t_column_iadd(x):
    x[:, 2] += 5
    return x.sum()
def t_column_iadd_local(x):
    y = x.clone()
    y[:, 2] += 5
    return y
def t_row_assign(x):
    x[1] = 0.0
    return x * 2
def t_row_assign_tensor(x, v):
    x[0] = v
    return x
def t_mask_assign(x):
    x[x < 0] = 0.0
    return x.sum()
def t_mask_assign_tensor(x):
    m = x > 0.5
    y = x.clone()
    y[m] = torch.tensor(-1.0)
    return y
def t_strided_view_zero(x):
    x.view(-1)[::3].zero_()
    return x
def t_transposed_row_add(x):
    y = x.clone()
    y.t()[0].add_(1)
    return y
def t_input_transposed_row_add(x):
    x.t()[0].add_(1)
    return x.mean()
def t_narrow_copy(x, y):
    x.narrow(1, 1, 2).copy_(y[:, :2])
    return x
def t_narrow_copy_broadcast(x, v):
    x.narrow(0, 2, 2).copy_(v)
    return x.sum(0)
def t_slice_mul(x):
    x[1:3, 2:4] *= 10
    return x
def t_ellipsis_fill(x):
    x[..., -1].fill_(7)
    return x
def t_index_tensor_assign(x, i):
    x[i] = 1.0
    return x
def t_index_put_accumulate(x, i):
    x.index_put_((i,), torch.ones(2, 6), accumulate=True)
    return x
def t_index_add(x, i):
    x.index_add_(0, i, torch.ones(2, 6))
    return x
def t_scatter(x):
    src = torch.ones(4, 6)
    x.scatter_(1, torch.zeros(4, 1, dtype=torch.long), src)
    return x
def t_masked_fill_inplace(x):
    x.masked_fill_(x > 0, -2.0)
    return x
def t_clamp_inplace(x):
    r = x.clamp_(-0.5, 0.5)
    return r is x, r
def t_chain_inplace(x): return x.add_(1).mul_(2).sub_(0.5)
def t_unsqueeze_view_add(x):
    x.unsqueeze(0)[0, 0].add_(3)
    return x
def t_view_then_base_read(x):
    v = x.view(2, 12)
    v.add_(1)
    return x.sum(), v.sum()
def t_base_then_view_read(x):
    v = x[:, :3]
    x.mul_(2)
    return v
def t_two_views_same_base(x):
    a = x[:2]
    b = x[1:3]
    a.add_(1)
    b.mul_(3)
    return x
def t_aliased_inputs(x):
    y = x[1]
    y.add_(5)
    return x.sum()
def t_input_and_its_view(x, row):
    row.add_(5)
    return x.sum(), row
def t_same_tensor_twice(x):
    x.add_(x)
    return x
def t_diagonal_inplace(x):
    x.diagonal().fill_(0)
    return x
def t_select_negative(x):
    x.select(1, -1).mul_(0)
    return x
def t_expand_read_after_inplace(v):
    e = v.expand(3, 6)
    v.add_(1)
    return e.sum(0)
def t_reshape_inplace(x):
    x.reshape(6, 4)[0].zero_()
    return x
def t_unbind_inplace(x):
    rows = x.unbind(0)
    rows[0].add_(100)
    return x
def t_split_inplace(x):
    parts = x.split(2, dim=1)
    parts[1].zero_()
    return x
def t_chunk_inplace_local(x):
    y = x.clone()
    for i, c in enumerate(y.chunk(3, dim=1)):
        c.mul_(i)
    return y
def t_loop_row_updates(x):
    for i in range(x.shape[0]):
        x[i] += i
    return x
def t_iadd_rebinds_view(x):
    v = x[0]
    v += 1
    return x, v
def t_setitem_broadcast_row(x, v):
    x[:] = v
    return x
def t_setitem_int_scalar(x):
    x[0, 0] = 3
    x[-1, -1] = x[0, 0] * 2
    return x
def t_setitem_from_other_input(x, y):
    x[:2] = y[2:]
    return x, y
def t_inplace_on_detached(x):
    d = x.detach()
    d.zero_()
    return x
def t_zero_then_use(x):
    s = x.sum()
    x.zero_()
    return s, x.sum()
def t_inplace_dtype_error(x):
    i = torch.zeros(4, dtype=torch.long)
    i.add_(x[0, :4])
    return i
def t_inplace_shape_error(x):
    x.add_(torch.ones(5))
    return x
def t_out_argument(x, y):
    out = torch.empty(4, 6)
    torch.add(x, y, out=out)
    return out
def t_copy_from_input(x):
    y = torch.zeros(4, 6)
    y.copy_(x)
    x.zero_()
    return y
def t_put_tensor_mask_inplace(x):
    mask = torch.tensor([True, False, True, False])
    x[mask, 1:] = -1.0
    return x
def t_swap_rows(x):
    tmp = x[0].clone()
    x[0] = x[1]
    x[1] = tmp
    return x
def t_requires_grad_clone_inplace(w):
    y = w.clone()
    y[0] = 0.0
    return y
def t_inplace_list_of_inputs(xs):
    for t in xs:
        t.mul_(2)
    return len(xs)
def t_dict_of_inputs(d):
    d["a"].add_(d["b"])
    return d["a"].sum()
def t_pure_math_one_graph(x, y):
    return (x * y).relu().sum(-1) + (x - y).abs().mean()


# ---- harder: metadata mutation, overlap errors, autograd interplay, dtype corners ----------------------
def w_unsqueeze_input(x):
    x.unsqueeze_(0)
    return x.shape
def w_transpose_input(x):
    x.t_()
    return x.is_contiguous(), x.stride()
def w_squeeze_input(x):
    x.squeeze_()
    return x
def w_resize_input(x):
    x.resize_(2, 2)
    return x
def w_as_strided_input(x):
    x.as_strided_((2, 3), (1, 2))
    return x
def w_partial_overlap_copy(x):
    x[1:] = x[:-1]
    return x
def w_internal_overlap_inplace(e):
    e.add_(1)
    return e
def w_leaf_requires_grad_inplace(w):
    w.add_(1)
    return w
def w_view_of_leaf_inplace(w):
    w[0].mul_(2)
    return w
def w_inplace_then_backward(w):
    y = w * 2
    y[0] = 0.0
    y.sum().backward()
    return w.grad
def w_inplace_saved_tensor_error(w):
    y = w.exp()
    z = y * 1
    y.add_(1)
    return y.sum()
def w_backward_twice_error(w):
    y = (w * w).sum()
    y.backward()
    y.backward()
    return w.grad
def w_grad_accumulates_on_input(w):
    (w * 3).sum().backward()
    (w * 4).sum().backward()
    return w.grad.clone()
def w_requires_grad_input_flag(x):
    x.requires_grad_()
    return (x * 2).requires_grad
def w_detach_inplace_shares(w):
    d = w.detach()
    d.mul_(0)
    return w
def w_data_assign(w):
    with torch.no_grad():
        w.data = torch.zeros(3)
    return w
def w_int_inplace_ops(i):
    i //= 2
    i %= 3
    i <<= 1
    i |= 1
    return i
def w_bool_inplace_ops(b):
    b &= torch.tensor([True, False, True, True])
    b ^= torch.tensor([True, True, False, False])
    return b
def w_int_true_div_error(i):
    i /= 2
    return i
def w_float_into_int_view(i):
    i[0] = 2.7
    return i
def w_index_duplicate_assign(x):
    idx = torch.tensor([0, 0, 1])
    x[idx] += 1
    return x
def w_index_fill_and_masked_scatter(x):
    x.index_fill_(1, torch.tensor([0, 3]), -1.0)
    mask = x > 0
    x.masked_scatter_(mask, torch.arange(24.0))
    return x
def w_relu_inplace_functional(x):
    import torch.nn.functional as F
    F.relu(x[1:], inplace=True)
    return x
def w_relu_module_inplace_view(x):
    torch.nn.ReLU(inplace=True)(x.t()[2:])
    return x
def w_noncontig_input_inplace(xt):
    xt.mul_(2)
    return xt.stride(), xt
def w_out_view_of_input(x, y):
    torch.mul(y[0], 3, out=x[1])
    return x
def w_add_out_self(x):
    torch.add(x, 1, out=x)
    return x
def w_clamp_tensor_bounds(x):
    x.clamp_(min=torch.zeros(6), max=torch.full((6,), 0.5))
    return x
def w_inplace_on_expand_of_local(v):
    e = v.clone().expand(4, 6)
    e.zero_()
    return e
def w_setitem_slice_step_tensor(x):
    x[::2, 1::2] = torch.arange(6.0).reshape(2, 3)
    return x
def w_view_chain_mutation(x):
    v = x.view(24)[4:16].view(3, 4)[1]
    v.fill_(9)
    return x
def w_cumulative_loop_views(x):
    for i in range(1, x.shape[1]):
        x[:, i] += x[:, i - 1]
    return x
def w_version_counter(x):
    v0 = x._version
    x.add_(1)
    x[0] = 2
    return x._version - v0

def w_requires_grad_input_read(x):
    x.requires_grad_()
    return x.requires_grad
def w_requires_grad_attr_store(p):
    p.requires_grad = False
    return p.requires_grad, (p * 2).requires_grad
def w_grad_assign(w):
    w.grad = torch.ones(3)
    w.grad.mul_(2)
    return w.grad


def _leaf():
    return (torch.randn(3, requires_grad=True),)


def _base_and_row():
    base = A.clone()
    return (base, base[1])


TABLE = [
    (t_column_iadd, (A,)), (t_column_iadd_local, (A,)), (t_row_assign, (A,)), (t_row_assign_tensor, (A, V)),
    (t_mask_assign, (A,)), (t_mask_assign_tensor, (A,)), (t_strided_view_zero, (A,)),
    (t_transposed_row_add, (A,)), (t_input_transposed_row_add, (A,)), (t_narrow_copy, (A, B)),
    (t_narrow_copy_broadcast, (A, V)), (t_slice_mul, (A,)), (t_ellipsis_fill, (A,)),
    (t_index_tensor_assign, (A, IDX)), (t_index_put_accumulate, (A, IDX)), (t_index_add, (A, IDX)),
    (t_scatter, (A,)), (t_masked_fill_inplace, (A,)), (t_clamp_inplace, (A,)), (t_chain_inplace, (A,)),
    (t_unsqueeze_view_add, (A,)), (t_view_then_base_read, (A,)), (t_base_then_view_read, (A,)),
    (t_two_views_same_base, (A,)), (t_aliased_inputs, (A,)), (t_input_and_its_view, _base_and_row),
    (t_same_tensor_twice, (A,)),
    (t_diagonal_inplace, (A,)), (t_select_negative, (A,)), (t_expand_read_after_inplace, (V,)),
    (t_reshape_inplace, (A,)), (t_unbind_inplace, (A,)), (t_split_inplace, (A,)),
    (t_chunk_inplace_local, (A,)), (t_loop_row_updates, (A,)), (t_iadd_rebinds_view, (A,)),
    (t_setitem_broadcast_row, (A, V)), (t_setitem_int_scalar, (A,)), (t_setitem_from_other_input, (A, B)),
    (t_inplace_on_detached, (A,)), (t_zero_then_use, (A,)), (t_inplace_dtype_error, (A,)),
    (t_inplace_shape_error, (A,)), (t_out_argument, (A, B)), (t_copy_from_input, (A,)),
    (t_put_tensor_mask_inplace, (A,)), (t_swap_rows, (A,)),
    (t_requires_grad_clone_inplace, lambda: (torch.randn(4, 6, requires_grad=True),)),
    (t_inplace_list_of_inputs, ([A, B],)), (t_dict_of_inputs, ({"a": A, "b": B},)),
    (t_pure_math_one_graph, (A, B), {"graphs": 1}),
    (w_unsqueeze_input, (A,)), (w_transpose_input, (A,)), (w_squeeze_input, (A[:1].clone(),)),
    (w_resize_input, (A,)), (w_as_strided_input, (A,)), (w_partial_overlap_copy, (A,)),
    (w_internal_overlap_inplace, lambda: (V.clone().expand(4, 6),)), (w_leaf_requires_grad_inplace, _leaf),
    (w_view_of_leaf_inplace, _leaf), (w_inplace_then_backward, _leaf), (w_inplace_saved_tensor_error, _leaf),
    (w_backward_twice_error, _leaf), (w_grad_accumulates_on_input, _leaf), (w_requires_grad_input_flag, (A,)),
    (w_detach_inplace_shares, _leaf), (w_data_assign, _leaf), (w_int_inplace_ops, (torch.arange(6),)),
    (w_bool_inplace_ops, (torch.tensor([True, True, False, False]),)),
    (w_int_true_div_error, (torch.arange(6),)),
    (w_float_into_int_view, (torch.arange(6),)), (w_index_duplicate_assign, (A,)),
    (w_index_fill_and_masked_scatter, (A,)), (w_relu_inplace_functional, (A,)),
    (w_relu_module_inplace_view, (A,)), (w_noncontig_input_inplace, lambda: (A.clone().t(),)),
    (w_out_view_of_input, (A, B)), (w_add_out_self, (A,)), (w_clamp_tensor_bounds, (A,)),
    (w_inplace_on_expand_of_local, (V,)), (w_setitem_slice_step_tensor, (A,)), (w_view_chain_mutation, (A,)),
    (w_cumulative_loop_views, (A,)), (w_version_counter, (A,)), (w_requires_grad_input_read, (A,)),
    (w_requires_grad_attr_store, _leaf), (w_grad_assign, _leaf),
]

KNOWN: dict[str, str] = {
}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_inplace(fn, args, options):
    run_program(fn, args, **options)
