"""Differential programs where state must survive a graph break or an exception: containers, objects,
cells, globals, tensors, generators and iterators mutated before a break (data-dependent branches,
.item(), .tolist(), unknown C functions) or before an exception that escapes the compiled function."""
from __future__ import annotations

import collections
import itertools
import time

import pytest
import torch
from diff_helpers import params, run_program

X = torch.randn(3, 4)
POS = torch.ones(3, 4)
TOTAL = 0
SEEN: list = []


class Box:
    def __init__(self):
        self.n = 0
        self.items = []


def count_up(n):
    for i in range(n):
        yield i


def b_list_across_item(x, lst):
    lst.append(1)
    v = x.sum().item()
    lst.append(2)
    return x * v, len(lst)
def b_dict_across_branch(x, d):
    d["before"] = 1
    if x.sum() > 0:
        d["pos"] = True
    else:
        d["neg"] = True
    d["after"] = 2
    return x
def b_object_across_break(x, box):
    box.n += 1
    box.items.append("a")
    s = float(x.sum())
    box.n += 1
    return x * s
def b_cell_across_break(x):
    n = 0

    def bump():
        nonlocal n
        n += 1
    bump()
    t = time.perf_counter() * 0
    bump()
    return x * n + t
def b_global_across_break(x):
    global TOTAL
    TOTAL += 1
    v = x.max().item()
    TOTAL += 10
    return x * TOTAL + v
def b_global_list_across_break(x):
    SEEN.append("a")
    n = len(x.tolist())
    SEEN.append(n)
    return x
def b_tensor_inplace_across_break(x):
    x.add_(1)
    v = x.sum().item()
    x.mul_(2)
    return v
def b_tensor_view_across_break(x):
    row = x[0]
    row.fill_(3)
    if x.sum() > 0:
        row.add_(1)
    return x
def b_loop_data_branch(x):
    out = []
    for i in range(3):
        if x[i].sum() > 0:
            out.append(i)
        else:
            out.append(-i)
    return out
def b_while_data_condition(x):
    n = 0
    while x.abs().sum() > 1:
        x = x * 0.5
        n += 1
    return x, n
def b_generator_across_break(x):
    g = count_up(5)
    a = next(g)
    v = x.sum().item()
    b = next(g)
    return x * (a + b) + v, list(g)
def b_arg_generator_across_break(x, g):
    a = next(g)
    v = x.sum().item()
    b = next(g)
    return x * (a + b) + v
def b_arg_iterator_loop_break(x, it):
    for v in it:
        if x.sum() * v > 100:
            break
        if v == 2:
            break
    return x
def b_user_generator_with_break_inside(x):
    def gen(t):
        yield t.sum().item()
        yield t.max().item()
    return list(gen(x))
def b_exception_after_break(x):
    v = x.sum().item()
    if v < 1000:
        raise ValueError("after break")
    return x
def b_exception_caught_across_break(x, log):
    try:
        log.append("try")
        v = x.sum().item()
        log.append("mid")
        raise KeyError(v)
    except KeyError:
        log.append("caught")
    return x
def b_with_across_break(x, log):
    class CM:
        def __enter__(self):
            log.append("enter")

        def __exit__(self, *a):
            log.append("exit")
    with CM():
        v = x.sum().item()
        log.append("body")
    return x * v
def b_no_grad_across_break(w):
    with torch.no_grad():
        a = w * 2
        v = a.sum().item()
        b = w * 3
    c = w * 4
    return a.requires_grad, b.requires_grad, c.requires_grad, v
def b_mutation_then_raise_list(x, lst):
    lst.append(x.shape[0])
    raise RuntimeError("late")
def b_mutation_then_raise_dict(x, d):
    d["k"] = 1
    del d["a"]
    raise KeyError("late")
def b_mutation_then_raise_tensor(x):
    x.mul_(3)
    raise ValueError("late")
def b_mutation_then_raise_object(x, box):
    box.n = 42
    box.items.append(x.shape)
    raise IndexError("late")
def b_mutation_then_builtin_error(x, lst):
    lst.append(1)
    return x * [1][5]
def b_generator_consumed_then_raise(x, g):
    next(g)
    next(g)
    raise ValueError("late")
def b_global_then_raise(x):
    global TOTAL
    TOTAL = 99
    raise ValueError("late")
def b_partial_loop_then_raise(x, lst):
    for i in range(5):
        if i == 3:
            raise ValueError(i)
        lst.append(i)
    return x
def b_tensor_mutation_before_shape_error(x):
    x.add_(1)
    return x.view(5, -1)
def b_list_pop_branch(x, lst):
    while lst:
        v = lst.pop()
        if x.sum() * 0 + v > 2:
            return v
    return -1
def b_dict_iteration_break(x, d):
    out = []
    for k, v in d.items():
        out.append(k)
        if (x * v).sum() > 1e9:
            break
    return out
def b_deque_across_break(x, dq):
    dq.append(1)
    dq.rotate(1)
    v = x.sum().item()
    dq.appendleft(v > 1e9)
    return x
def b_counter_across_break(x):
    c = collections.defaultdict(int)
    for i in range(4):
        if x[i % 3].sum() > 0:
            c["pos"] += 1
        else:
            c["neg"] += 1
    return dict(c)
def b_itertools_across_break(x):
    it = itertools.count()
    a = next(it)
    v = x.sum().item()
    return a, next(it), v
def b_enumerate_arg_across_break(x, it):
    e = enumerate(it)
    first = next(e)
    v = x.sum().item()
    return first, next(e), v
def b_nested_call_break(x, lst):
    def inner(t):
        lst.append("in")
        v = t.sum().item()
        lst.append("out")
        return t * v
    return inner(x) + 1
def b_nested_call_raise(x, lst):
    def inner(t):
        lst.append("in")
        raise KeyError("inner")
    try:
        inner(x)
    except KeyError:
        lst.append("caught")
    return x
def b_recursion_with_break(x):
    def rec(t, n):
        if n == 0:
            return t
        v = t.sum().item()
        return rec(t + v * 0, n - 1)
    return rec(x, 3)
def b_closure_list_across_break(x):
    acc = []

    def add(v):
        acc.append(v)
    add(1)
    if x.sum() > -1e9:
        add(2)
    return acc
def b_tensor_list_inplace_after_break(xs):
    v = xs[0].sum().item()
    for t in xs:
        t.add_(v * 0 + 1)
    return len(xs)
def b_return_aliases_input(x):
    v = x.sum().item()
    return x, x[0], v
def b_break_inside_except(x):
    try:
        raise ValueError
    except ValueError:
        v = x.sum().item()
    return x * v
def b_break_inside_finally(x, log):
    try:
        log.append(1)
    finally:
        log.append(x.sum().item() * 0)
    return x
def b_tolist_then_mutate(x):
    vals = x.tolist()
    vals[0][0] = 100.0
    return vals
def b_data_dependent_exception(x):
    if (x > 0).all():
        raise ValueError("all positive")
    return x
def b_pure_math_one_graph(x):
    return (x.exp() * 2 - 1).tanh().sum(0)

def b_sort_key_breaks(x, lst):
    lst.sort(key=lambda t: t.sum().item())
    return len(lst)
def b_exception_in_resume_caught_outer(x, log):
    try:
        v = x.sum().item()
        log.append("resumed")
        {}["missing"]
    except KeyError:
        log.append("caught")
    return x * v
def b_exception_from_callee_after_break(x, log):
    def callee(t):
        log.append(t.max().item() > -1e9)
        raise IndexError("callee")
    try:
        callee(x)
    except IndexError:
        log.append("outer")
    return x
def b_break_in_loop_over_arg_dict(x, d):
    for k in list(d):
        if x.sum() * 0 + d[k] > 1:
            d[k + "_big"] = d.pop(k)
    return x
def b_generator_finally_and_break(x, log):
    def gen():
        try:
            yield x.sum().item()
            yield 2
        finally:
            log.append("fin")
    g = gen()
    first = next(g)
    g.close()
    return first
def b_closure_mutation_in_break_callee(x):
    state = {"n": 0}

    def step(t):
        state["n"] += 1
        return t * t.sum().item()
    y = step(step(x))
    return y, state
def b_while_true_item_exit(x):
    i = 0
    while True:
        i += 1
        if (x * i).sum().item() > 1e9 or i > 4:
            break
    return i
def b_nested_try_finally_with_break(x, log):
    try:
        try:
            log.append(x.sum().item() * 0)
            raise ValueError
        finally:
            log.append("inner")
    except ValueError:
        log.append("outer")
    finally:
        log.append("last")
    return x
def b_break_then_return_different_types(x):
    if x.sum().item() > 1e9:
        return "big"
    return [x, {"k": x * 2}]
def b_iterator_partly_then_break_then_more(x, it):
    a = next(it)
    if x.sum() > -1e9:
        b = next(it)
    return a, b, x
def b_inplace_arg_view_across_break(x, row):
    row.add_(1)
    v = x.sum().item()
    row.mul_(2)
    return v


def _it3():
    return (X, iter([1, 2, 3]))


def _base_row():
    base = X.clone()
    return (base, base[0])


TABLE = [
    (b_list_across_item, (X, [])), (b_dict_across_branch, (X, {})), (b_object_across_break, (X, Box())),
    (b_cell_across_break, (X,)), (b_global_across_break, (X,), {"globals_": ("TOTAL",)}),
    (b_global_list_across_break, (X,), {"globals_": ("SEEN",)}), (b_tensor_inplace_across_break, (X,)),
    (b_tensor_view_across_break, (X,)), (b_loop_data_branch, (X,)), (b_while_data_condition, (X,)),
    (b_generator_across_break, (X,)), (b_arg_generator_across_break, lambda: (X, count_up(4))),
    (b_arg_iterator_loop_break, lambda: (X, iter([0, 1, 2, 3, 4]))),
    (b_user_generator_with_break_inside, (X,)), (b_exception_after_break, (X,)),
    (b_exception_caught_across_break, (X, [])), (b_with_across_break, (X, [])),
    (b_no_grad_across_break, lambda: (torch.randn(3, requires_grad=True),)),
    (b_mutation_then_raise_list, (X, [])), (b_mutation_then_raise_dict, (X, {"a": 1})),
    (b_mutation_then_raise_tensor, (X,)), (b_mutation_then_raise_object, (X, Box())),
    (b_mutation_then_builtin_error, (X, [])), (b_generator_consumed_then_raise, lambda: (X, count_up(5))),
    (b_global_then_raise, (X,), {"globals_": ("TOTAL",)}), (b_partial_loop_then_raise, (X, [])),
    (b_tensor_mutation_before_shape_error, (X,)), (b_list_pop_branch, (X, [5, 1, 2])),
    (b_dict_iteration_break, (X, {"a": 1, "b": 2})),
    (b_deque_across_break, (X, collections.deque([0]))), (b_counter_across_break, (X,)),
    (b_itertools_across_break, (X,)), (b_enumerate_arg_across_break, lambda: (X, iter("abcd"))),
    (b_nested_call_break, (X, [])), (b_nested_call_raise, (X, [])), (b_recursion_with_break, (X,)),
    (b_closure_list_across_break, (X,)), (b_tensor_list_inplace_after_break, ([X.clone(), X.clone()],)),
    (b_return_aliases_input, (X,)), (b_break_inside_except, (X,)), (b_break_inside_finally, (X, [])),
    (b_tolist_then_mutate, (X,)), (b_data_dependent_exception, (POS,)),
    (b_pure_math_one_graph, (X,), {"graphs": 1}),
    (b_sort_key_breaks, (X, [X * 2, X * -1, X])), (b_exception_in_resume_caught_outer, (X, [])),
    (b_exception_from_callee_after_break, (X, [])), (b_break_in_loop_over_arg_dict, (X, {"a": 1, "b": 5})),
    (b_generator_finally_and_break, (X, [])), (b_closure_mutation_in_break_callee, (X,)),
    (b_while_true_item_exit, (X,)), (b_nested_try_finally_with_break, (X, [])),
    (b_break_then_return_different_types, (X,)), (b_iterator_partly_then_break_then_more, _it3),
    (b_inplace_arg_view_across_break, _base_row),
]

KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_breaks(fn, args, options):
    run_program(fn, args, **options)
