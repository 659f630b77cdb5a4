"""Small programs, each compiled with kiln and checked against eager: values, mutated arguments, and the
number of graphs and graph breaks."""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator

import pytest
import torch
import torch.nn.functional as F
from capture_helpers import check

X = torch.randn(4, 8)
Y = torch.randn(4, 8)
V = torch.randn(8)
I = torch.arange(12).reshape(3, 4)

Point = collections.namedtuple("Point", ["a", "b"])


@dataclasses.dataclass
class Out:
    loss: torch.Tensor
    logits: torch.Tensor


def helper(a, b=2, *rest, scale=1.0, **extra):
    return a * b * scale + sum(rest) + sum(extra.values())


def make_adder(k):
    def add(t):
        return t + k
    return add


ADD3 = make_adder(3)
CONST = 2.5
TABLE = {"w": 3, "b": 1}


class Counter:
    def __init__(self, n):
        self.n = n

    def scaled(self, t):
        return t * self.n

    @property
    def double(self):
        return self.n * 2


class Base:
    def f(self, t):
        return t + 1


class Child(Base):
    def f(self, t):
        return super().f(t) * 2


# ---- one graph, no breaks --------------------------------------------------------------------------------
def p_add(x, y): return x + y
def p_chain(x): return (x * 2 + 1).relu().sum(-1)
def p_methods(x): return x.sum(dim=1, keepdim=True).mean()
def p_functional(x): return F.gelu(F.linear(x, torch.ones(3, 8)))
def p_softmax(x): return torch.softmax(x, dim=-1)
def p_matmul(x, y): return x @ y.t()
def p_unary_ops(x): return -x, +x, abs(x), ~(x > 0)
def p_compare(x, y): return x < y, x >= y, x == y, x != y
def p_shape_int(x): return x.reshape(x.shape[0] * 2, -1)
def p_size_call(x): return x.view(x.size(0), x.size(1) // 2, 2)
def p_dim_ndim(x): return x.sum(x.dim() - 1) * x.ndim
def p_dtype_cast(x): return x.to(torch.float64) * 2
def p_dtype_attr(x): return x.float() if x.dtype == torch.float32 else x
def p_numel(x): return x / x.numel()
def p_loop_range(x):
    for i in range(3):
        x = x + i
    return x
def p_loop_list(x):
    for s in [1.0, 2.0, 3.0]:
        x = x * s
    return x
def p_loop_enumerate(x):
    out = []
    for i, t in enumerate(x):
        out.append(t * i)
    return torch.stack(out)
def p_loop_zip(x, y):
    return [a + b for a, b in zip(x, y)]
def p_while(x):
    i = 0
    while i < 4:
        x = x * 2
        i += 1
    return x
def p_listcomp(x): return [x * i for i in range(3)]
def p_dictcomp(x): return {f"k{i}": x + i for i in range(2)}
def p_setcomp(x): return len({i % 2 for i in range(5)}) * x
def p_genexpr_sum(x): return sum(x * i for i in range(4))
def p_genexpr_tuple(x): return tuple(t.sum() for t in x)
def p_tuple_unpack(x):
    a, b = x.chunk(2, dim=1)
    return b, a
def p_star_unpack(x):
    first, *rest = x.unbind(0)
    return first, len(rest)
def p_nested_fn(x):
    def inner(t):
        return t * 3
    return inner(x) + 1
def p_closure(x):
    k = 5
    def inner(t):
        return t + k
    return inner(x)
def p_closure_global(x): return ADD3(x)
def p_lambda(x):
    f = lambda t, s=2: t * s  # noqa: E731
    return f(x), f(x, 3)
def p_partial(x):
    f = functools.partial(torch.add, alpha=2)
    return f(x, 1)
def p_defaults_varargs(x): return helper(x), helper(x, 3, 1, 2, scale=0.5, u=1)
def p_kwargs_call(x): return torch.clamp(x, min=-0.5, max=0.5)
def p_star_args(x):
    args = (x, 1)
    kw = {"alpha": 3}
    return torch.add(*args, **kw)
def p_global_const(x): return x * CONST
def p_global_dict(x): return x * TABLE["w"] + TABLE["b"]
def p_math(x): return x * math.sqrt(16) + math.pi
def p_operator_mod(x): return operator.mul(x, 2)
def p_isinstance(x, n):
    if isinstance(x, torch.Tensor) and isinstance(n, int):
        return x * n
    return x
def p_isinstance_tuple(x, items):
    return [t * 2 if isinstance(t, torch.Tensor) else t for t in items]
def p_none_check(x, bias=None):
    if bias is not None:
        x = x + bias
    return x * 2
def p_bool_flag(x, flag):
    return x.relu() if flag else x.tanh()
def p_string_arg(x, mode):
    if mode == "sum":
        return x.sum()
    return x.mean()
def p_len_shape(x): return x * len(x) + len(x.shape)
def p_min_max(x): return x * max(x.shape) + min(3, 4)
def p_any_all(x, items): return x * (2 if any(i > 2 for i in items) else 3) + all(items)
def p_getattr_builtin(x): return getattr(x, "sum")()
def p_hasattr(x, obj): return x * 2 if hasattr(obj, "n") else x
def p_user_object(x, c): return c.scaled(x) + c.double
def p_super(x): return Child().f(x)
def p_namedtuple_in(x, p): return p.a * x + p.b
def p_namedtuple_out(x): return Point(x + 1, x - 1)
def p_dataclass_out(x): return Out(loss=x.sum(), logits=x * 2)
def p_dict_in(x, d): return x * d["scale"] + d["shift"]
def p_dict_out(x): return {"a": x, "b": [x * 2, (x * 3,)]}
def p_list_of_tensors(xs): return torch.cat(xs, dim=0)
def p_tuple_of_tensors(xs): return xs[0] * xs[1]
def p_slicing(x): return x[1:3, ::2], x[..., 0], x[None, :, -1]
def p_index_tensor(x, i): return x[i]
def p_setitem(x):
    y = x.clone()
    y[0] = 0.0
    return y
def p_inplace_local(x):
    y = x * 1
    y.add_(1)
    y.mul_(2)
    return y
def p_inplace_input(x):
    x.add_(1)
    return x * 2
def p_iadd(x):
    y = x * 1
    y += 3
    return y
def p_no_grad(x):
    with torch.no_grad():
        y = x * 2
    return y + x
def p_enable_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
    return y
def p_f_string(x, n):
    name = f"layer{n}:{n:03d}"
    return x * len(name)
def p_assert(x):
    assert x.shape[0] == 4, "batch"
    return x + 1
def p_factory(x): return x + torch.ones(4, 8) + torch.zeros_like(x) + torch.arange(8)
def p_full(x): return torch.full((4, 8), 2.0) * x
def p_where(x): return torch.where(x > 0, x, torch.zeros_like(x))
def p_mask_fill(x): return x.masked_fill(x < 0, 0.0)
def p_cat_stack(x, y): return torch.cat([x, y], 1), torch.stack([x, y])
def p_transpose_view(x): return x.t().contiguous().view(-1)
def p_permute(x): return x.reshape(2, 2, 8).permute(2, 0, 1)
def p_reductions(x): return x.sum(), x.mean(0), x.amax(-1), x.var(1)
def p_max_dim(x): return x.max(dim=1)
def p_topk(x): return torch.topk(x, 2, dim=-1).values
def p_argmax(x): return x.argmax(-1)
def p_split(x): return [t.sum() for t in x.split(2, dim=1)]
def p_type_call(x): return type(x) is torch.Tensor
def p_list_mutation(x, lst):
    lst.append(x * 2)
    lst[0] = 7
    return len(lst)
def p_dict_mutation(x, d):
    d["y"] = x + 1
    del d["a"]
    return x
def p_list_pop(x, lst):
    v = lst.pop()
    return x * v
def p_dict_get(x, d): return x * d.get("k", 2) + d.get("z", 1)
def p_dict_items(x, d):
    for k, v in d.items():
        x = x + v
    return x
def p_reversed_sorted(x):
    return [x * i for i in reversed(range(3))], sorted([3, 1, 2])
def p_ternary_shape(x): return x.sum(0) if x.shape[0] > 2 else x.sum(1)
def p_chained_compare(x): return x * 2 if 0 < x.shape[0] < 10 else x
def p_bool_ops(x, a, b): return x * (1 if (a and not b) or (b and not a) else 2)
def p_int_ops(x): return x * (7 // 2) + (7 % 3) + (2 ** 3) + (5 >> 1) + (5 & 3) + (5 | 2) + (5 ^ 1)
def p_float_ops(x): return x / 3.0 - 1.5
def p_rsub_rdiv(x): return 1 - x, 2 / (x.abs() + 1), 2 ** x
def p_scalar_tensor(x): return x * torch.tensor(2.0)
def p_expand(x): return V.expand(4, 8) + x
def p_global_tensor(x): return x + V
def p_empty_return(x): return None
def p_constant_return(x): return 42
def p_identity(x): return x
def p_multiple_returns(x):
    if x.shape[1] == 8:
        return x * 2
    return x * 3
def p_tensor_method_chain(x): return x.abs().sqrt().log1p().exp().clamp(max=3.0)
def p_einsum(x, y): return torch.einsum("ij,kj->ik", x, y)
def p_dropout_eval(x): return F.dropout(x, 0.5, training=False)
def p_layer_norm(x): return F.layer_norm(x, (8,))
def p_cross_entropy(x): return F.cross_entropy(x, torch.tensor([1, 0, 3, 2]))
def p_sort_dict_keys(x, d): return [x * d[k] for k in sorted(d)]
def p_ints_from_shape(x):
    b, c = x.shape
    return x.new_zeros(b, c * 2)
def p_nonlocal(x):
    count = 0
    def bump():
        nonlocal count
        count += 1
    bump()
    bump()
    return x * count
def p_recursive_python(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return x * fact(4)
def p_tuple_concat(x): return (x,) + (x * 2,)
def p_list_concat(x): return [x] + [x * 2] * 2
def p_str_methods(x, s): return x * len(s.upper().split("_"))
def p_in_operator(x, keys): return x * (2 if "a" in keys else 3)
def p_map(x): return list(map(lambda t: t * 2, [x, x + 1]))
def p_filter(x): return list(filter(lambda i: i % 2, range(5)))
def p_builtin_round(x): return x * round(2.6) + abs(-3)
def p_max_tensors_list(x): return torch.max(x, torch.zeros_like(x))
def p_unbind_iter(x): return [r.sum() for r in x]
def p_shape_compare(x, y): return x + y if x.shape == y.shape else x
def p_device_check(x): return x.cuda() if x.is_cuda else x * 2
def p_dtype_default(x): return torch.zeros(3, dtype=x.dtype, device=x.device)
def p_int_tensor(i): return i * 2 + 1, i // 2
def p_bool_tensor(x): return (x > 0) & (x < 1) | (x == 0)
def p_cumsum(x): return x.cumsum(0)
def p_softmax_attention(q, k):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return s.softmax(-1) @ k


ONE_GRAPH = [
    (p_add, (X, Y)), (p_chain, (X,)), (p_methods, (X,)), (p_functional, (X,)), (p_softmax, (X,)),
    (p_matmul, (X, Y)), (p_unary_ops, (X,)), (p_compare, (X, Y)), (p_shape_int, (X,)),
    (p_size_call, (X,)), (p_dim_ndim, (X,)), (p_dtype_cast, (X,)), (p_numel, (X,)),
    (p_loop_range, (X,)), (p_loop_list, (X,)), (p_loop_enumerate, (X,)), (p_loop_zip, (X, Y)),
    (p_while, (X,)), (p_listcomp, (X,)), (p_dictcomp, (X,)), (p_setcomp, (X,)), (p_genexpr_sum, (X,)),
    (p_genexpr_tuple, (X,)), (p_tuple_unpack, (X,)), (p_star_unpack, (X,)), (p_nested_fn, (X,)),
    (p_closure, (X,)), (p_closure_global, (X,)), (p_lambda, (X,)), (p_partial, (X,)),
    (p_defaults_varargs, (X,)), (p_kwargs_call, (X,)), (p_star_args, (X,)), (p_global_const, (X,)),
    (p_global_dict, (X,)), (p_math, (X,)), (p_operator_mod, (X,)), (p_isinstance, (X, 3)),
    (p_isinstance_tuple, (X, [X, 1, "a"])), (p_none_check, (X,)), (p_none_check, (X, V)),
    (p_bool_flag, (X, True)), (p_bool_flag, (X, False)), (p_string_arg, (X, "sum")),
    (p_string_arg, (X, "mean")), (p_len_shape, (X,)), (p_min_max, (X,)), (p_any_all, (X, [1, 2, 3])),
    (p_getattr_builtin, (X,)), (p_hasattr, (X, Counter(2))), (p_user_object, (X, Counter(3))),
    (p_super, (X,)), (p_namedtuple_in, (X, Point(2.0, 1.0))), (p_namedtuple_out, (X,)),
    (p_dataclass_out, (X,)), (p_dict_in, (X, {"scale": 2.0, "shift": V})), (p_dict_out, (X,)),
    (p_list_of_tensors, ([X, Y],)), (p_tuple_of_tensors, ((X, Y),)), (p_slicing, (X,)),
    (p_index_tensor, (X, torch.tensor([0, 2]))), (p_setitem, (X,)), (p_inplace_local, (X,)),
    (p_inplace_input, (X,)), (p_iadd, (X,)), (p_no_grad, (X,)), (p_enable_grad, (X,)),
    (p_f_string, (X, 3)), (p_assert, (X,)), (p_factory, (X,)), (p_full, (X,)), (p_where, (X,)),
    (p_mask_fill, (X,)), (p_cat_stack, (X, Y)), (p_transpose_view, (X,)), (p_permute, (X,)),
    (p_reductions, (X,)), (p_max_dim, (X,)), (p_topk, (X,)), (p_argmax, (X,)), (p_split, (X,)),
    (p_list_mutation, (X, [1, 2])), (p_dict_mutation, (X, {"a": 1})), (p_list_pop, (X, [1, 2, 3])),
    (p_dict_get, (X, {"k": 3})), (p_dict_items, (X, {"u": 1.0, "v": V})), (p_reversed_sorted, (X,)),
    (p_ternary_shape, (X,)), (p_chained_compare, (X,)), (p_bool_ops, (X, True, False)),
    (p_int_ops, (X,)), (p_float_ops, (X,)), (p_rsub_rdiv, (X,)), (p_scalar_tensor, (X,)),
    (p_expand, (X,)), (p_global_tensor, (X,)), (p_multiple_returns, (X,)),
    (p_tensor_method_chain, (X,)), (p_einsum, (X, Y)), (p_layer_norm, (X,)),
    (p_cross_entropy, (X,)), (p_sort_dict_keys, (X, {"b": 2, "a": 1})), (p_ints_from_shape, (X,)),
    (p_nonlocal, (X,)), (p_recursive_python, (X,)), (p_tuple_concat, (X,)), (p_list_concat, (X,)),
    (p_str_methods, (X, "a_b_c")), (p_in_operator, (X, ("a", "b"))), (p_map, (X,)),
    (p_builtin_round, (X,)), (p_max_tensors_list, (X,)), (p_unbind_iter, (X,)),
    (p_shape_compare, (X, Y)), (p_device_check, (X,)), (p_dtype_default, (X,)), (p_int_tensor, (I,)),
    (p_bool_tensor, (X,)), (p_cumsum, (X,)), (p_softmax_attention, (X, Y)),
]


@pytest.mark.parametrize("fn,args", ONE_GRAPH,
                         ids=[f"{f.__name__}-{i}" for i, (f, _) in enumerate(ONE_GRAPH)])
def test_one_graph(fn, args):
    check(fn, *args, graphs=1, breaks=0)


NO_OPS = [(p_type_call, (X,)), (p_dropout_eval, (X,)), (p_dtype_attr, (X,)), (p_empty_return, (X,)),
          (p_constant_return, (X,)), (p_identity, (X,)),
          (p_filter, (X,))]


@pytest.mark.parametrize("fn,args", NO_OPS, ids=[f.__name__ for f, _ in NO_OPS])
def test_no_ops_no_graph(fn, args):
    check(fn, *args, graphs=0, breaks=0)


# ---- graph breaks: graph, native instruction, resume function; results equal ----------------------------
def b_data_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1
def b_item(x): return x * x.sum().item()
def b_tolist(x): return x.tolist()
def b_print(x):
    print("value")
    return x + 1
def b_raise(x):
    if x.shape[0] == 4:
        raise ValueError("no")
    return x
def b_numpy(x): return torch.from_numpy(x.numpy() * 2)
def b_int_tensor(x): return x * int(x.max())
def b_unknown_c(x):
    import time
    time.time()
    return x + 1
def b_nonzero_loop(x):
    return [x[i] for i in range(min(int((x > 0).sum()), 4))]


# (program, args, breaks): each break splits the frame (graph, native instruction, resume function);
# b_numpy breaks at .numpy(), at ndarray * 2 and at torch.from_numpy(ndarray); b_nonzero_loop's list
# comprehension reads x from a cell, so that frame runs eagerly.
BREAKS = [(b_data_branch, (X,), 1), (b_item, (X,), 1), (b_tolist, (X,), 1), (b_print, (X,), 1),
          (b_numpy, (X,), 3), (b_int_tensor, (X,), 1), (b_unknown_c, (X,), 1), (b_nonzero_loop, (X,), 1)]


@pytest.mark.parametrize("fn,args,breaks", BREAKS, ids=[f.__name__ for f, _, _ in BREAKS])
def test_break_results_equal_eager(fn, args, breaks):
    check(fn, *args, breaks=breaks)


def test_raise_propagates_like_eager():
    import kiln
    compiled = kiln.compile(b_raise, backend="eager")
    with pytest.raises(ValueError, match="no") as info:
        compiled(X)
    assert any(entry.name == "b_raise" for entry in info.traceback)
