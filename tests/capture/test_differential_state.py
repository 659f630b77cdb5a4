"""Differential programs on process state and tensor identity: grad mode switched by a plain call, the
default dtype, the RNG (seeded, advanced, forked), returned views that must stay views of the inputs,
and inputs returned as themselves."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from diff_helpers import params, run_program

X = torch.randn(4, 6)


def z_set_grad_enabled_call(x):
    torch.set_grad_enabled(False)
    return x * 2
def z_set_grad_enabled_call_back(w):
    torch.set_grad_enabled(False)
    y = w * 2
    torch.set_grad_enabled(True)
    return y.requires_grad, (w * 3).requires_grad
def z_grad_mode_read(x): return torch.is_grad_enabled(), x
def z_no_grad_decorator(w):
    @torch.no_grad()
    def inner(t):
        return t * 2
    return inner(w).requires_grad, (w * 2).requires_grad
def z_enable_grad_decorator_inside_no_grad(w):
    @torch.enable_grad()
    def inner(t):
        return t * 2
    with torch.no_grad():
        return inner(w).requires_grad
def z_default_dtype(x):
    torch.set_default_dtype(torch.float64)
    return torch.ones(2).dtype, torch.tensor([1.5]).dtype
def z_default_dtype_read(x): return torch.get_default_dtype(), torch.zeros(1).dtype, x
def z_rand_advances(x): return x + torch.rand(4, 6)
def z_rand_twice(x): return torch.randn(3), torch.randn(3), x
def z_manual_seed_inside(x):
    torch.manual_seed(123)
    a = torch.rand(2)
    torch.manual_seed(123)
    b = torch.rand(2)
    return a, b, x
def z_dropout_training(x): return F.dropout(x, 0.5, training=True)
def z_randn_like_and_randint(x): return torch.randn_like(x), torch.randint(0, 10, (3,))
def z_generator_object(x):
    g = torch.Generator().manual_seed(7)
    return torch.rand(3, generator=g), torch.rand(3, generator=g), x
def z_fork_rng(x):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        inner = torch.rand(2)
    return inner, torch.rand(2), x
def z_get_set_rng_state(x):
    state = torch.get_rng_state()
    a = torch.rand(2)
    torch.set_rng_state(state)
    return a, torch.rand(2), x
def z_rand_after_break(x):
    a = torch.rand(2)
    v = x.sum().item()
    return a, torch.rand(2), v
def z_multinomial_bernoulli(x): return torch.bernoulli(torch.full((5,), 0.5)), torch.randperm(5)
def z_return_input(x): return x
def z_return_input_twice(x): return x, x
def z_return_view(x): return x[1:3]
def z_return_view_and_base(x): return x.view(-1), x.t(), x
def z_return_view_of_mutated_input(x):
    v = x[0]
    v += 1
    return x, v
def z_return_view_after_add_(x):
    v = x[:, 1]
    v.add_(1)
    return v
def z_return_view_after_base_mutation(x):
    v = x.view(24)
    x.mul_(2)
    return v
def z_return_reshape_view(x): return x.reshape(2, 12), x.flatten()
def z_return_contiguous_noop(x): return x.contiguous()
def z_return_detach_shares(x): return x.detach()
def z_return_local_and_view(x):
    y = x * 2
    return y, y[0], y.unsqueeze(0)
def z_return_view_of_list_input(xs): return xs[0][0], xs[1]
def z_return_expand(x): return x[0].expand(3, 6)
def z_return_split_views(x): return x.split(2)
def z_return_unbind_views(x): return x.unbind(1)
def z_return_diagonal(x): return x.diagonal(), torch.diagonal(x, 1)
def z_return_as_strided(x): return x.as_strided((2, 2), (1, 6))
def z_requires_grad_output_of_leaf(w): return w, w * 1, w.detach()
def z_backward_grad_state(w):
    (w * w).sum().backward()
    return w.grad.clone()
def z_grad_fn_name(w): return type((w * 2).grad_fn).__name__
def z_autograd_grad(w):
    y = (w ** 3).sum()
    (g,) = torch.autograd.grad(y, w)
    return g
def z_pure_math_one_graph(x): return torch.sigmoid(x) * x.cos() + x.pow(2).mean()


def _leaf():
    return (torch.randn(3, requires_grad=True),)


TABLE = [
    (z_set_grad_enabled_call, (X,)), (z_set_grad_enabled_call_back, _leaf), (z_grad_mode_read, (X,)),
    (z_no_grad_decorator, _leaf), (z_enable_grad_decorator_inside_no_grad, _leaf), (z_default_dtype, (X,)),
    (z_default_dtype_read, (X,)), (z_rand_advances, (X,)), (z_rand_twice, (X,)), (z_manual_seed_inside, (X,)),
    (z_dropout_training, (X,)), (z_randn_like_and_randint, (X,)), (z_generator_object, (X,)),
    (z_fork_rng, (X,)), (z_get_set_rng_state, (X,)), (z_rand_after_break, (X,)),
    (z_multinomial_bernoulli, (X,)), (z_return_input, (X,)), (z_return_input_twice, (X,)),
    (z_return_view, (X,)), (z_return_view_and_base, (X,)), (z_return_view_of_mutated_input, (X,)),
    (z_return_view_after_add_, (X,)),
    (z_return_view_after_base_mutation, (X,)), (z_return_reshape_view, (X,)),
    (z_return_contiguous_noop, (X,)), (z_return_detach_shares, (X,)), (z_return_local_and_view, (X,)),
    (z_return_view_of_list_input, ([X, X.clone()],)), (z_return_expand, (X,)), (z_return_split_views, (X,)),
    (z_return_unbind_views, (X,)), (z_return_diagonal, (X,)), (z_return_as_strided, (X,)),
    (z_requires_grad_output_of_leaf, _leaf), (z_backward_grad_state, _leaf), (z_grad_fn_name, _leaf),
    (z_autograd_grad, _leaf), (z_pure_math_one_graph, (X,), {"graphs": 1}),
]

KNOWN: dict[str, str] = {
}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_state(fn, args, options):
    run_program(fn, args, **options)
