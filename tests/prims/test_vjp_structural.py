"""The vjp rules of the reduction, shape, indexing, creation, extern and check prims against eager autograd.

Each case calls a prim's rule on real float64 tensors with a random incoming gradient (prims on real tensors
run their references) and compares every gradient with `torch.autograd.grad` of the prim's reference. The
same rule is then traced on proxies: it must record prims only, give each gradient its argument's shape and
dtype, and the recorded graph must compute the same values.
"""
import math

import pytest
import torch

from kiln.graph import Graph, Proxy, TensorMeta
from kiln.graph.interpreter import run
from kiln.graph.proxy import tracing
from kiln.prims import checks, creation, extern, indexing, reductions, shape
from kiln.prims.registry import PRIMS

F64 = torch.float64
FAMILIES = (reductions, shape, indexing, creation, extern, checks)


def family_prims():
    names = []
    for module in FAMILIES:
        names += [name for name, p in PRIMS.items() if getattr(module, name, None) is p]
    return names


def test_every_prim_of_these_families_has_a_vjp_rule():
    names = family_prims()
    assert len(names) >= 45
    assert [n for n in names if "vjp" not in PRIMS[n].rules] == []


# ---- inputs ---------------------------------------------------------------------------------------------

def rnd(*shape):
    return torch.randn(shape, dtype=F64)


def ints(high, *shape):
    """Integer-valued floats: ties for the extremum prims."""
    return torch.randint(0, high, shape).to(F64)


def idx(high, *shape):
    return torch.randint(0, high, shape)


def with_zeros(t, *positions):
    t = t.clone()
    for p in positions:
        t[p] = 0.0
    return t


def with_nan(t, position):
    t = t.clone()
    t[position] = math.nan
    return t


def strided_view():
    base = rnd(40)
    return base[2:22].view(4, 5)  # storage offset 2


def rowwise_perm(rows, cols, k):
    return torch.stack([torch.randperm(cols)[:k] for _ in range(rows)])


# Each case: (prim name, a function giving (args, kwargs)). Float64 tensors are differentiated.
CASES = {
    # reductions
    "sum_dims": ("sum", lambda: ((rnd(3, 4, 5), (0, 2)), {})),
    "sum_one": ("sum", lambda: ((rnd(3, 4), (1,)), {})),
    "sum_none": ("sum", lambda: ((rnd(3, 4), ()), {})),
    "sum_all_0d": ("sum", lambda: ((rnd(3, 4), (0, 1)), {})),
    "sum_empty": ("sum", lambda: ((rnd(0, 3), (0,)), {})),
    "prod_plain": ("prod", lambda: ((rnd(3, 4), (1,)), {})),
    "prod_one_zero": ("prod", lambda: ((with_zeros(rnd(3, 4), (1, 2)), (1,)), {})),
    "prod_two_zeros": ("prod", lambda: ((with_zeros(rnd(3, 4), (1, 2), (1, 0), (2, 3)), (1,)), {})),
    "prod_dim0_zero": ("prod", lambda: ((with_zeros(rnd(3, 4), (0, 1)), (0,)), {})),
    "prod_many_dims": ("prod", lambda: ((with_zeros(rnd(2, 3, 4), (1, 0, 2)), (0, 2)), {})),
    "prod_all_zeros": ("prod", lambda: ((with_zeros(rnd(2, 3), (0, 0), (1, 1), (0, 2)), (0, 1)), {})),
    "prod_none": ("prod", lambda: ((rnd(3), ()), {})),
    "prod_empty": ("prod", lambda: ((rnd(3, 0), (1,)), {})),
    "amax_ties": ("amax", lambda: ((ints(3, 4, 5), (1,)), {})),
    "amax_all_ties": ("amax", lambda: ((ints(2, 3, 4), (0, 1)), {})),
    "amax_nan": ("amax", lambda: ((with_nan(rnd(3, 4), (1, 2)), (1,)), {})),
    "amin_ties": ("amin", lambda: ((ints(3, 3, 4, 5), (0, 2)), {})),
    "amin_none": ("amin", lambda: ((rnd(3, 4), ()), {})),
    "argmax": ("argmax", lambda: ((rnd(3, 4), (1,)), {})),
    "argmin": ("argmin", lambda: ((rnd(3, 4), (0, 1)), {})),
    "var_c1": ("var", lambda: ((rnd(4, 5), (1,), 1), {})),
    "var_c0_all": ("var", lambda: ((rnd(4, 5), (0, 1), 0), {})),
    "var_c_half": ("var", lambda: ((rnd(3, 4, 5), (0, 2), 0.5), {})),
    "var_none": ("var", lambda: ((rnd(4), (), 0), {})),
    "var_n_eq_c": ("var", lambda: ((rnd(3, 2), (1,), 2), {})),
    "var_mean": ("var_mean", lambda: ((rnd(4, 5), (1,), 1), {})),
    "var_mean_all": ("var_mean", lambda: ((rnd(4, 5), (0, 1), 0), {})),
    "var_mean_none": ("var_mean", lambda: ((rnd(4), (), 0), {})),
    # shape
    "broadcast_expand": ("broadcast_in_dim", lambda: ((rnd(3, 1), (2, 3, 4), (1, 2)), {})),
    "broadcast_ones": ("broadcast_in_dim", lambda: ((rnd(1, 3, 1), (1, 3, 1), (0, 1, 2)), {})),
    "broadcast_scalar": ("broadcast_in_dim", lambda: ((rnd(), (2, 3), ()), {})),
    "broadcast_size1_out": ("broadcast_in_dim", lambda: ((rnd(3), (1, 3, 2), (1,)), {})),
    "view": ("view", lambda: ((rnd(4, 6), (2, 12)), {})),
    "view_3d": ("view", lambda: ((rnd(2, 3, 4), (6, 4)), {})),
    "permute": ("permute", lambda: ((rnd(2, 3, 4), (2, 0, 1)), {})),
    "squeeze": ("squeeze", lambda: ((rnd(2, 1, 3, 1), (1, 3)), {})),
    "squeeze_none": ("squeeze", lambda: ((rnd(2, 3), ()), {})),
    "expand_dims": ("expand_dims", lambda: ((rnd(2, 3), (0, 3)), {})),
    "as_strided": ("as_strided", lambda: ((rnd(4, 5), (3, 3), (5, 1), 2), {})),
    "as_strided_overlap": ("as_strided", lambda: ((rnd(4, 5), (4, 3), (1, 1), 0), {})),
    "as_strided_offset": ("as_strided", lambda: ((strided_view(), (2, 3), (1, 4), 5), {})),
    "as_strided_transposed": ("as_strided", lambda: ((rnd(4, 5).t(), (5, 2), (2, 1), 1), {})),
    "diagonal": ("diagonal", lambda: ((rnd(3, 4),), {})),
    "diagonal_offset": ("diagonal", lambda: ((rnd(3, 4), 1, 0, 1), {})),
    "diagonal_3d_neg": ("diagonal", lambda: ((rnd(4, 3, 5), -1, 2, 0), {})),
    "diagonal_kw": ("diagonal", lambda: ((rnd(2, 4, 3),), {"offset": 1, "dim1": 1, "dim2": 2})),
    "diagonal_empty": ("diagonal", lambda: ((rnd(3, 4), 5, 0, 1), {})),
    "unfold_overlap": ("unfold", lambda: ((rnd(2, 7), 1, 3, 2), {})),
    "unfold_gaps": ("unfold", lambda: ((rnd(8, 3), 0, 2, 3), {})),
    "unfold_0d": ("unfold", lambda: ((rnd(), 0, 1, 1), {})),
    "unfold_size0": ("unfold", lambda: ((rnd(3, 4), 1, 0, 1), {})),
    "rev": ("rev", lambda: ((rnd(3, 4), (0, 1)), {})),
    "cat": ("cat", lambda: (([rnd(2, 3), rnd(1, 3), rnd(0, 3)], 0), {})),
    "cat_dim1": ("cat", lambda: (([rnd(2, 3), rnd(2, 1)], 1), {})),
    "pad": ("pad", lambda: ((rnd(3, 4), 0.5, ((1, 2, 0), (0, 1, 1))), {})),
    "pad_crop": ("pad", lambda: ((rnd(3, 4), 0.0, ((-1, 2, 1), (1, -2, 0))), {})),
    "pad_interior_empty": ("pad", lambda: ((rnd(0, 4), 0.0, ((1, 1, 2), (0, 0, 2))), {})),
    "clone": ("clone", lambda: ((rnd(3, 4).t(), torch.preserve_format), {})),
    "clone_default": ("clone", lambda: ((rnd(3, 4),), {})),
    "stop_gradient": ("stop_gradient", lambda: ((rnd(3, 4).t(),), {})),
    "slice": ("slice", lambda: ((rnd(5, 6), (1, 0), (4, 6), (2, 3)), {})),
    "slice_nostep": ("slice", lambda: ((rnd(5, 6), (1, 2), (3, 5)), {})),
    "slice_empty": ("slice", lambda: ((rnd(5, 6), (2, 0), (2, 6), (1, 2)), {})),
    "slice_steps_3d": ("slice", lambda: ((rnd(9, 7, 4), (1, 0, 3), (9, 7, 4), (3, 2, 1)), {})),
    "slice_step_to_end": ("slice", lambda: ((rnd(9, 7), (0, 1), (9, 7), (3, 3)), {})),
    # indexing
    "gather": ("gather", lambda: ((rnd(4, 5), 1, idx(5, 4, 7)), {})),
    "gather_dim0_small": ("gather", lambda: ((rnd(4, 5), 0, idx(4, 2, 3)), {})),
    "gather_negdim": ("gather", lambda: ((rnd(3, 4), -1, idx(4, 3, 4)), {})),
    "scatter": ("scatter", lambda: ((rnd(4, 5), 1, rowwise_perm(4, 5, 3), rnd(4, 3)), {})),
    "scatter_number": ("scatter", lambda: ((rnd(4, 5), 0, rowwise_perm(3, 4, 4).t()[:2].contiguous(), 2.0),
                                           {})),
    "scatter_add": ("scatter_add", lambda: ((rnd(4, 5), 1, idx(5, 4, 6), rnd(4, 6)), {})),
    "index_select": ("index_select", lambda: ((rnd(5, 4), 0, torch.tensor([0, 2, 2, 4, 2])), {})),
    "index_select_dim1": ("index_select", lambda: ((rnd(3, 5, 2), 1, torch.tensor([4, 4, 0])), {})),
    "index_select_0d_index": ("index_select", lambda: ((rnd(3, 5), 1, torch.tensor(3)), {})),
    "index_select_0d": ("index_select", lambda: ((rnd(), 0, torch.tensor([0])), {})),
    "index_rows": ("index", lambda: ((rnd(5, 6), [torch.tensor([0, 3, 3, 1])]), {})),
    "index_inner": ("index", lambda: ((rnd(4, 5, 6), [None, idx(5, 2, 3)]), {})),
    "index_separated": ("index", lambda: ((rnd(4, 5, 6), [idx(4, 7), None, idx(6, 7)]), {})),
    "index_negative": ("index", lambda: ((rnd(4, 5), [torch.tensor([-1, 0, -1])]), {})),
    "index_put": ("index_put", lambda: ((rnd(5, 4), [torch.tensor([0, 2, 4])], rnd(3, 4)), {})),
    "index_put_acc": ("index_put", lambda: ((rnd(5, 4), [torch.tensor([0, 2, 2, 0])], rnd(4, 4), True), {})),
    "index_put_2d": ("index_put", lambda: ((rnd(5, 4, 3), [torch.tensor([0, 4]), torch.tensor([1, 3])],
                                            rnd(2, 3), False), {})),
    "index_put_acc_inner": ("index_put", lambda: ((rnd(3, 5), [None, torch.tensor([1, 1, 4])], rnd(3, 3)),
                                                  {"accumulate": True})),
    # creation (no gradients)
    "iota": ("iota", lambda: ((5, 0, 1, F64), {})),
    "full": ("full", lambda: (((2, 3), 1.5, F64), {})),
    "empty_strided": ("empty_strided", lambda: (((2, 3), (1, 2), F64), {})),
    "uniform": ("uniform", lambda: (((3,), 0.0, 1.0, F64), {})),
    "normal": ("normal", lambda: (((3,), 0.0, 1.0, F64), {})),
    "randint": ("randint", lambda: ((0, 5, (3,), torch.int64), {})),
    "bernoulli": ("bernoulli", lambda: ((torch.rand(4, dtype=F64),), {})),
    "bernoulli_p": ("bernoulli", lambda: ((torch.rand(4, dtype=F64), 0.3), {})),
    # extern
    "mm": ("mm", lambda: ((rnd(3, 4), rnd(4, 5)), {})),
    "mm_transposed": ("mm", lambda: ((rnd(4, 3).t(), rnd(5, 4).t()), {})),
    "addmm": ("addmm", lambda: ((rnd(5), rnd(3, 4), rnd(4, 5)), {})),
    "addmm_transposed": ("addmm", lambda: ((rnd(5), rnd(4, 3).t(), rnd(5, 4).t()), {})),
    "bmm": ("bmm", lambda: ((rnd(2, 3, 4), rnd(2, 4, 5)), {})),
    "conv2d": ("convolution", lambda: ((rnd(2, 4, 7, 6), rnd(6, 4, 3, 3), rnd(6), [2, 1], [1, 0], [1, 1],
                                         False, [0, 0], 1), {})),
    "conv2d_groups": ("convolution", lambda: ((rnd(2, 4, 6, 6), rnd(6, 2, 3, 2), None, [1, 1], [1, 1],
                                                [2, 1], False, [0, 0], 2), {})),
    "conv1d_transposed": ("convolution", lambda: ((rnd(2, 3, 5), rnd(3, 2, 3), rnd(2), [2], [1], [1], True,
                                                    [1], 1), {})),
    "sdpa": ("sdpa", lambda: ((rnd(2, 3, 4, 8), rnd(2, 3, 6, 8), rnd(2, 3, 6, 5)), {})),
    "sdpa_causal": ("sdpa", lambda: ((rnd(2, 4, 8), rnd(2, 4, 8), rnd(2, 4, 8), None, True), {})),
    "sdpa_bool_mask": ("sdpa", lambda: ((rnd(2, 4, 8), rnd(2, 5, 8), rnd(2, 5, 3),
                                         torch.rand(2, 4, 5) > 0.3), {"scale": 0.7})),
    "sdpa_float_mask": ("sdpa", lambda: ((rnd(2, 4, 8), rnd(2, 5, 8), rnd(2, 5, 3), None), {})),
    "sdpa_gqa": ("sdpa", lambda: ((rnd(2, 4, 3, 8), rnd(2, 2, 5, 8), rnd(2, 2, 5, 8), None, False, None,
                                   True), {})),
    "sdpa_flash": ("sdpa_flash", lambda: ((rnd(2, 3, 4, 8), rnd(2, 3, 6, 8), rnd(2, 3, 6, 8)), {})),
    "sdpa_flash_causal": ("sdpa_flash", lambda: ((rnd(1, 2, 5, 4), rnd(1, 2, 5, 4), rnd(1, 2, 5, 4), None,
                                                  True), {})),
    "sdpa_flash_gqa": ("sdpa_flash", lambda: ((rnd(2, 4, 5, 8), rnd(2, 2, 6, 8), rnd(2, 2, 6, 8)), {})),
    "sdpa_flash_scale": ("sdpa_flash", lambda: ((rnd(2, 3, 4, 8), rnd(2, 3, 6, 8), rnd(2, 3, 6, 8)),
                                                {"scale": 0.7})),
    "sort": ("sort", lambda: ((rnd(4, 5), 1, True), {})),
    "sort_ties_stable": ("sort", lambda: ((ints(3, 4, 6), 0, False, True), {})),
    "sort_0d": ("sort", lambda: ((rnd(),), {})),
    "topk": ("topk", lambda: ((rnd(4, 6), 3), {})),
    "topk_smallest_dim0": ("topk", lambda: ((rnd(5, 3), 2, 0, False), {})),
    "cumsum": ("cumsum", lambda: ((rnd(4, 5), 1), {})),
    "cumsum_negdim": ("cumsum", lambda: ((rnd(4, 5, 2), -2), {})),
    "cumsum_0d": ("cumsum", lambda: ((rnd(), 0), {})),
    "cumprod": ("cumprod", lambda: ((rnd(4, 5), 1), {})),
    "cumprod_one_zero": ("cumprod", lambda: ((with_zeros(rnd(3, 6), (0, 2), (1, 0), (2, 5)), 1), {})),
    "cumprod_zeros": ("cumprod", lambda: ((with_zeros(rnd(3, 6), (0, 1), (0, 3), (1, 0), (1, 1)), 1), {})),
    "cumprod_all_zero_dim0": ("cumprod", lambda: ((with_zeros(rnd(4, 2), (0, 0), (1, 0), (2, 1)), 0), {})),
    "cumprod_0d": ("cumprod", lambda: ((rnd(), 0), {})),
    "cummax": ("cummax", lambda: ((ints(3, 4, 6), 1), {})),
    "cummin": ("cummin", lambda: ((ints(3, 5, 3), 0), {})),
    "cummax_0d": ("cummax", lambda: ((rnd(), 0), {})),
    "logcumsumexp": ("logcumsumexp", lambda: ((rnd(4, 5) * 10, 1), {})),
    "logcumsumexp_dim0": ("logcumsumexp", lambda: ((rnd(4, 5), 0), {})),
    # checks
    "check_values": ("check_values", lambda: ((rnd(3), torch.ones(3, dtype=torch.bool), "bad"), {})),
}


def scatter_reduce_cases():
    cases = {}
    for reduce in ("sum", "mean", "amax", "amin"):
        for include_self in (True, False):
            def make(reduce=reduce, include_self=include_self):
                return (ints(3, 4, 5), 1, idx(5, 4, 6), ints(3, 4, 6), reduce, include_self), {}
            cases[f"scatter_reduce_{reduce}_{include_self}"] = ("scatter_reduce", make)
    cases["scatter_reduce_mean_dim0"] = ("scatter_reduce", lambda: ((rnd(3, 4), 0, idx(3, 5, 4), rnd(5, 4),
                                                                     "mean"), {}))
    return cases


CASES.update(scatter_reduce_cases())


def test_every_prim_of_these_families_has_a_case():
    covered = {name for name, _ in CASES.values()}
    untested = {"convolution_backward", "sdpa_backward", "sdpa_flash_backward"}  # tested below: rules refuse
    assert set(family_prims()) - covered == untested


# ---- the check ------------------------------------------------------------------------------------------

def is_float(v):
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point


def lift(args):
    """Float tensors (also in lists) made into leaves of their own, keeping their layout."""
    leaves = []

    def one(v):
        if is_float(v):
            t = v.detach().requires_grad_(True)
            leaves.append(t)
            return t
        return v
    lifted = [[one(x) for x in a] if isinstance(a, list) else one(a) for a in args]
    return lifted, leaves


def detach(v):
    if isinstance(v, torch.Tensor):
        return v.detach()
    if isinstance(v, list):
        return [detach(x) for x in v]
    return v


def flat_gradients(result, args):
    """The rule's entries for the float tensors of args, in the order `lift` made leaves."""
    assert len(result) == len(args)
    out = []
    for entry, a in zip(result, args):
        if isinstance(a, list):
            entries = entry if entry is not None else [None] * len(a)
            assert len(entries) == len(a)
            out += [e for e, x in zip(entries, a) if is_float(x)]
        elif is_float(a):
            out.append(entry)
        else:
            assert entry is None, "a non-float argument got a gradient"
    return out


def incoming_gradients(outs, skip=()):
    return tuple(torch.randn_like(o) if is_float(o) and i not in skip else None for i, o in enumerate(outs))


def eager_and_rule(name, skip=()):
    torch.manual_seed(sum(map(ord, name)))
    prim_name, make = CASES[name]
    args, kwargs = make()
    p = PRIMS[prim_name]
    args, leaves = lift(args)
    with torch.enable_grad():
        out = p.ref(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    grads = incoming_gradients(outs, skip)
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    if p.name == "bernoulli":
        pairs = []  # eager has no derivative for it; the rule gives none
    if leaves and pairs:
        expected = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                       allow_unused=True)
    else:
        expected = [None] * len(leaves)
    plain_args = [detach(a) for a in args]
    plain_outs = tuple(o.detach() for o in outs)
    result = p.rules["vjp"](grads, plain_outs, *plain_args, **kwargs)
    return p, plain_args, kwargs, grads, plain_outs, result, expected


def compare(got, expected, args):
    for i, (g, e) in enumerate(zip(flat_gradients(got, args), expected)):
        if e is None or (g is None and not e.any()):
            assert g is None or not g.any(), f"gradient {i}: eager has none"
            continue
        assert g is not None, f"gradient {i}: eager has one, the rule none"
        assert g.shape == e.shape and g.dtype == e.dtype, (i, g.shape, e.shape, g.dtype, e.dtype)
        torch.testing.assert_close(g, e, equal_nan=True, msg=lambda m: f"gradient {i}: {m}")


def traced(p, args, kwargs, grads, outs):
    """The rule run on proxies: (graph, real inputs, result of proxies)."""
    graph = Graph("backward")
    inputs = []

    def placeholder(v):
        if isinstance(v, torch.Tensor):
            inputs.append(v)
            return Proxy(graph.placeholder("t", TensorMeta.of(v)))
        if isinstance(v, list):
            return [placeholder(x) for x in v]
        return v
    p_args = [placeholder(a) for a in args]
    p_grads = tuple(placeholder(g) for g in grads)
    p_outs = tuple(placeholder(o) for o in outs)
    with tracing(graph):
        result = p.rules["vjp"](p_grads, p_outs, *p_args, **kwargs)
    return graph, inputs, result


@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_matches_eager(name):
    p, args, kwargs, grads, outs, result, expected = eager_and_rule(name)
    compare(result, expected, args)
    graph, inputs, p_result = traced(p, args, kwargs, grads, outs)
    flat_p = flat_gradients(p_result, args)
    flat_real = flat_gradients(result, args)
    floats = [x for a in args for x in (a if isinstance(a, list) else [a]) if is_float(x)]
    for gp, gr, a in zip(flat_p, flat_real, floats):
        assert (gp is None) == (gr is None)
        if gp is not None:
            assert isinstance(gp, Proxy)
            assert tuple(gp.shape) == tuple(a.shape) and gp.dtype == a.dtype
    recorded = {n.op for n in graph.nodes}
    assert recorded <= {"placeholder", "call_prim", "getitem", "output"}, recorded
    present = [g for g in flat_p if g is not None]
    graph.output(tuple(g.node for g in present))
    values = run(graph, inputs)
    for v, r in zip(values, [g for g in flat_real if g is not None]):
        torch.testing.assert_close(v, r, equal_nan=True)


# ---- multi-output prims with gradients for some outputs only --------------------------------------------

@pytest.mark.parametrize("name,skip", [("var_mean", (0,)), ("var_mean", (1,)), ("var_mean_all", (1,)),
                                       ("sort", (0,)), ("cummax", (0,))])
def test_vjp_with_missing_output_gradients(name, skip):
    _, args, _, _, _, result, expected = eager_and_rule(name, skip)
    compare(result, expected, args)


# ---- refusals -------------------------------------------------------------------------------------------

def test_as_strided_of_overlapping_input_refuses():
    a = rnd(3).expand(4, 3)
    out = shape.as_strided.ref(a, (2, 2), (1, 1), 0)
    with pytest.raises(NotImplementedError, match="share memory"):
        shape.as_strided.rules["vjp"]((torch.ones_like(out),), (out,), a, (2, 2), (1, 1), 0)


def test_scatter_reduce_prod_refuses():
    a, index, src = rnd(3, 4), idx(4, 3, 2), rnd(3, 2)
    out = indexing.scatter_reduce.ref(a, 1, index, src, "prod")
    with pytest.raises(NotImplementedError, match="prod"):
        indexing.scatter_reduce.rules["vjp"]((torch.ones_like(out),), (out,), a, 1, index, src, "prod")


def test_sdpa_float_mask_needing_grad_gets_eagers_gradient():
    q, k, v, mask = rnd(2, 4, 8), rnd(2, 5, 8), rnd(2, 5, 3), rnd(1, 4, 5)  # a mask broadcast over the batch
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, mask)]
    with torch.enable_grad():
        out = extern.sdpa.ref(*leaves)
    g = torch.randn_like(out)
    expected = torch.autograd.grad(out, leaves, g)
    got = extern.sdpa.rules["vjp"]((g,), (out.detach(),), q, k, v, mask, grad_mask=(True,) * 4)
    assert got[3].shape == mask.shape
    for a, b in zip(got[:4], expected):
        torch.testing.assert_close(a, b)


def test_sdpa_float_mask_without_grad_differentiates_qkv():
    q, k, v, mask = rnd(2, 4, 8), rnd(2, 5, 8), rnd(2, 5, 3), rnd(2, 4, 5)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        out = extern.sdpa.ref(*leaves, mask)
    g = torch.randn_like(out)
    expected = torch.autograd.grad(out, leaves, g)
    got = extern.sdpa.rules["vjp"]((g,), (out.detach(),), q, k, v, mask, grad_mask=(True, True, True, False))
    assert got[3] is None
    for a, b in zip(got[:3], expected):
        torch.testing.assert_close(a, b)


def test_complex_rules_refuse():
    a = torch.randn(3, 4, dtype=torch.complex128)
    out = extern.mm.ref(a, a.t())
    with pytest.raises(NotImplementedError, match="conjugate"):
        extern.mm.rules["vjp"]((torch.ones_like(out),), (out,), a, a.t())


def test_the_backward_prims_are_not_differentiable_twice():
    g, x, w = rnd(2, 3, 4), rnd(2, 2, 6), rnd(3, 2, 3)
    args = (g, x, w, [3], [1], [0], [1], False, [0], 1, (True, True, True))
    outs = extern.convolution_backward.ref(*args)
    with pytest.raises(NotImplementedError, match="double backward"):
        extern.convolution_backward.rules["vjp"](tuple(torch.ones_like(o) for o in outs), outs, *args)
    assert extern.convolution_backward.rules["vjp"]((None,) * 3, outs, *args) == (None,) * len(args)
    q = rnd(2, 4, 8)
    sargs = (torch.ones(2, 4, 8, dtype=F64), q, q, q)
    souts = extern.sdpa_backward.ref(*sargs)
    with pytest.raises(NotImplementedError, match="double backward"):
        extern.sdpa_backward.rules["vjp"](tuple(torch.ones_like(o) for o in souts), souts, *sargs)
    q = rnd(1, 2, 4, 8)
    out, lse = extern.sdpa_flash.ref(q, q, q)
    fargs = (torch.ones_like(out), q, q, q, out, lse)
    fouts = extern.sdpa_flash_backward.ref(*fargs)
    with pytest.raises(NotImplementedError, match="double backward"):
        extern.sdpa_flash_backward.rules["vjp"](tuple(torch.ones_like(o) for o in fouts), fouts, *fargs)


# ---- the new extern prims: meta against reference, values against eager autograd ------------------------

@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True),
                                  (False, False, True)])
def test_convolution_backward_prim(mask):
    x, w, b = rnd(2, 4, 7, 6), rnd(6, 2, 3, 3), rnd(6)
    conv = (([2, 1], [1, 0], [1, 2], False, [0, 0], 2))
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    with torch.enable_grad():
        out = extern.convolution.ref(*leaves, *conv)
    g = torch.randn_like(out)
    expected = torch.autograd.grad(out, leaves, g)
    args = (g, x, w, [6], *conv, mask)
    got = extern.convolution_backward(*args)
    metas = extern.convolution_backward.meta(*args)
    want = [e for e, m in zip(expected, mask) if m]
    assert len(got) == len(metas) == len(want)
    for r, m, e in zip(got, metas, want):
        assert tuple(m.shape) == tuple(r.shape) and m.dtype == r.dtype and tuple(m.strides) == r.stride()
        torch.testing.assert_close(r, e)


def test_sdpa_backward_prim_meta():
    q, k, v = rnd(2, 3, 4, 8), rnd(2, 3, 6, 8), rnd(2, 3, 6, 5)
    g = rnd(2, 3, 4, 5)
    got = extern.sdpa_backward(g, q, k, v)
    metas = extern.sdpa_backward.meta(g, q, k, v)
    for r, m, t in zip(got, metas, (q, k, v)):
        assert tuple(m.shape) == tuple(r.shape) == tuple(t.shape) and tuple(m.strides) == r.stride()
    with pytest.raises(RuntimeError, match="must match"):
        extern.sdpa_backward.meta(rnd(2, 3, 4, 8), q, k, v)


def test_scatter_add_src_longer_than_index():
    # src may be longer than index in every dim: the rest of src gets zero gradient (eager refuses this)
    a, index, src = rnd(3, 4), idx(4, 2, 2), rnd(3, 5)
    out = indexing.scatter_add.ref(a, 1, index, src)
    g = torch.randn_like(out)
    grad_src = indexing.scatter_add.rules["vjp"]((g,), (out,), a, 1, index, src)[3]
    expected = torch.zeros_like(src)
    expected[:2, :2] = torch.gather(g, 1, index)
    torch.testing.assert_close(grad_src, expected)
