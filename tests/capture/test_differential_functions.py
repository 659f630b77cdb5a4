"""Differential programs: closures and nonlocal, default arguments, *args / **kwargs, keyword-only
arguments, lambdas, small recursion, early returns, while loops and nested functions."""
from __future__ import annotations

import pytest
import torch
from diff_helpers import params, run_program

X = torch.randn(3, 4)


def make_counter():
    n = 0

    def inc(k=1):
        nonlocal n
        n += k
        return n
    return inc


def make_scale(s):
    return lambda t: t * s


COUNTER = make_counter()
TRIPLE = make_scale(3)


def f_closure_read(x):
    k = 2.5

    def g(t):
        return t * k
    return g(x)
def f_closure_late_binding(x):
    fns = [lambda t: t * i for i in range(3)]
    return [f(x) for f in fns]
def f_closure_default_binding(x):
    fns = [lambda t, i=i: t * i for i in range(3)]
    return [f(x) for f in fns]
def f_closure_modified_after(x):
    k = 1

    def g():
        return x * k
    k = 5
    return g()
def f_nonlocal_counter(x):
    n = 0

    def bump():
        nonlocal n
        n += 1
        return n
    bump()
    bump()
    return x * bump(), n
def f_nonlocal_nested(x):
    a = 1

    def outer():
        b = 2

        def inner():
            nonlocal a, b
            a += 10
            b += 20
        inner()
        return b
    return outer(), a, x
def f_nonlocal_list_accum(x):
    seen = []

    def visit(v):
        seen.append(v)
    for i in range(3):
        visit(x * i)
    return seen
def f_closure_external_counter(x):
    c = make_counter()
    c()
    c(5)
    return x * c()
def f_closure_global_counter(x): return x * COUNTER(0)
def f_closure_passed_in(x, fn): return fn(x), fn(1)
def f_closure_from_arg_counter(x, inc):
    inc(2)
    return x * inc()
def f_closure_returned(x):
    def make(k):
        def g(t):
            return t + k
        return g
    return make(3)(x), make(4)(1)
def f_defaults(x):
    def g(t, a=2, b=3):
        return t * a + b
    return g(x), g(x, 5), g(x, b=0), g(x, 1, 1)
def f_default_none(x):
    def g(t, bias=None):
        return t if bias is None else t + bias
    return g(x), g(x, 1.0)
def f_default_evaluated_once(x):
    def g(v, d={}):  # noqa: B006
        d[v] = len(d)
        return dict(d)
    return g("a"), g("b"), x
def f_varargs(x):
    def g(*args):
        return len(args), sum(args[1:])
    return g(x, 1, 2), g(x)
def f_kwargs(x):
    def g(**kw):
        return sorted(kw.items())
    return g(a=1, b=x.shape[0]), g(), x
def f_varargs_kwargs_mix(x):
    def g(a, *rest, k=1, **kw):
        return a * k + len(rest) + len(kw)
    return g(x), g(x, 1, 2, k=3, z=4, w=5)
def f_star_call(x):
    def g(a, b, c=0):
        return a * b + c
    args = [x, 2]
    kw = {"c": 1}
    return g(*args, **kw), g(*(x, 3)), g(**{"a": x, "b": 1})
def f_kwonly(x):
    def g(t, *, scale, shift=0):
        return t * scale + shift
    return g(x, scale=2), g(x, shift=1, scale=3)
def f_kwonly_missing(x):
    def g(t, *, scale):
        return t * scale
    return g(x)
def f_too_many_args(x):
    def g(a):
        return a
    return g(x, 1)
def f_unexpected_kwarg(x):
    def g(a):
        return a
    return g(x, nope=1)
def f_posonly(x):
    def g(a, b, /, c):
        return a + b * c
    return g(x, 2, c=3), g(x, 1, 1)
def f_kwargs_forwarding(x):
    def inner(t, scale=1, shift=0):
        return t * scale + shift

    def outer(t, **kw):
        return inner(t, **kw)
    return outer(x, scale=2), outer(x, shift=3)
def f_args_forwarding(x):
    def inner(a, b, c):
        return a * b - c

    def outer(*args):
        return inner(*args)
    return outer(x, 2, 1)
def f_lambda(x):
    sq = lambda t: t * t  # noqa: E731
    add = lambda a, b=1: a + b  # noqa: E731
    return sq(x), add(x), add(x, 2)
def f_lambda_sorted_key(x):
    pairs = [("b", 2), ("a", 3), ("c", 1)]
    return sorted(pairs, key=lambda p: p[1]), x
def f_lambda_immediately_called(x): return (lambda t: t + 1)(x)
def f_lambda_in_dict(x):
    ops = {"double": lambda t: t * 2, "neg": lambda t: -t}
    return {k: f(x) for k, f in ops.items()}
def f_lambda_global(x): return TRIPLE(x)
def f_recursion(x):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)
    return x * fact(5)
def f_recursion_tensor(x):
    def power(t, n):
        return t if n == 1 else t * power(t, n - 1)
    return power(x, 3)
def f_mutual_recursion(x):
    def is_even(n):
        return True if n == 0 else is_odd(n - 1)

    def is_odd(n):
        return False if n == 0 else is_even(n - 1)
    return is_even(6), is_odd(3), x
def f_recursion_list_flatten(x):
    def flat(v):
        if isinstance(v, list):
            out = []
            for e in v:
                out.extend(flat(e))
            return out
        return [v]
    return flat([1, [2, [3, [x]]]])
def f_recursion_too_deep(x):
    def down(n):
        return down(n + 1)
    return down(0)
def f_early_return(x, n):
    if n < 0:
        return x * 0
    for i in range(10):
        if i == n:
            return x * i
    return x
def f_early_return_in_while(x):
    i = 0
    while True:
        i += 1
        if i * i > 20:
            return x * i
def f_while_else(x):
    i = 0
    while i < 3:
        i += 1
    else:
        i += 100
    return x * i
def f_while_break_else(x):
    i = 0
    while i < 5:
        if i == 2:
            break
        i += 1
    else:
        i = -1
    return x * i
def f_for_else(x):
    for v in [1, 3, 5]:
        if v % 2 == 0:
            break
    else:
        return x * 2
    return x
def f_while_tensor_accumulate(x):
    out, n = x, 0
    while n < 4:
        out = out * 0.5 + n
        n += 1
    return out
def f_while_continue(x):
    i, acc = 0, []
    while i < 6:
        i += 1
        if i % 2:
            continue
        acc.append(i)
    return acc, x
def f_nested_loops_break(x):
    hits = []
    for i in range(3):
        for j in range(3):
            if j > i:
                break
            hits.append((i, j))
    return hits, x
def f_nested_function_defs(x):
    def a(t):
        def b(u):
            def c(v):
                return v + 1
            return c(u) * 2
        return b(t) - 1
    return a(x)
def f_function_attrs(x):
    def g(t):
        return t
    g.tag = "t"
    return g.__name__, g.tag, x
def f_decorator(x):
    def twice(fn):
        def wrapper(t):
            return fn(fn(t))
        return wrapper

    @twice
    def inc(t):
        return t + 1
    return inc(x)
def f_higher_order(x):
    def apply(fn, v, n):
        for _ in range(n):
            v = fn(v)
        return v
    return apply(lambda t: t * 2, x, 3)
def f_global_write(x):
    global STATE
    STATE = STATE + 1
    return x * STATE


STATE = 0


def f_global_list_mutate(x):
    LOG.append(x.shape[0])
    return len(LOG)


LOG: list = []


# ---- harder: syntax corners, evaluation order, argument binding errors ---------------------------------
class Mapish:
    def keys(self):
        return ["a", "b"]

    def __getitem__(self, k):
        return k.upper()


def q_match_literal(x, v):
    match v:
        case 1:
            return x * 1
        case 2 | 3:
            return x * 2
        case _:
            return x * 0
def q_match_sequence(x):
    out = []
    for v in ([1, 2], [1, 2, 3, 4], (), "s"):
        match v:
            case [a, b]:
                out.append(("pair", a + b))
            case [first, *rest]:
                out.append(("many", first, len(rest)))
            case []:
                out.append("empty")
            case _:
                out.append("other")
    return out, x
def q_match_mapping(x):
    out = []
    for d in ({"kind": "lin", "n": 3}, {"kind": "act"}, {}):
        match d:
            case {"kind": "lin", "n": n}:
                out.append(n)
            case {"kind": k, **rest}:
                out.append((k, rest))
            case _:
                out.append(None)
    return out, x
def q_match_class(x):
    from collections import namedtuple
    P = namedtuple("P", "a b")
    out = []
    for v in (P(1, 2), 3.5, "s", [1]):
        match v:
            case P(a=1, b=b):
                out.append(b)
            case float(f) if f > 3:
                out.append(f)
            case str() as s:
                out.append(s * 2)
            case _:
                out.append("?")
    return out, x
def q_match_tensor_shape(x):
    match x.shape:
        case (r, c) if r < c:
            return x.t()
        case (r, c):
            return x
def q_walrus(x):
    out = []
    data = [1, 5, 2, 8]
    while (n := len(data)) > 2:
        out.append(data.pop() * n)
    if (m := max(data)) > 1:
        out.append(m)
    return out, [y for v in data if (y := v * 2) > 2], x
def q_del_then_unbound(x):
    y = x * 2
    del y
    return y  # noqa: F821
def q_del_caught(x):
    y = 1
    del y
    try:
        return y  # noqa: F821
    except UnboundLocalError:
        return x
def q_free_var_unbound(x):
    def inner():
        return late * x  # noqa: F821
    try:
        v = inner()
    except NameError as e:
        v = type(e).__name__
    late = 2
    return v, inner()
def q_chained_compare_side_effects(x):
    log = []

    def val(v):
        log.append(v)
        return v
    r = val(1) < val(2) < val(0) < val(5)
    return r, log, x
def q_short_circuit_side_effects(x):
    log = []

    def t(v):
        log.append(v)
        return v
    a = t(0) and t(1)
    b = t(2) or t(3)
    c = t(None) or t("") or t([])
    return a, b, c, log, x
def q_and_or_return_operands(x): return [] or "d", 0 and 1 / 0, "a" and "b", x
def q_augassign_subscript_eval_once(x):
    log = []
    d = {"k": 1}

    def key():
        log.append("key")
        return "k"
    d[key()] += 5
    return d, log, x
def q_augassign_attr_tensor(x):
    class S:
        pass
    s = S()
    s.t = x
    s.t += 1
    s.t *= 2
    return s.t, s.t is x
def q_evaluation_order_args(x):
    log = []

    def a(v):
        log.append(v)
        return v
    def f(p, q, *, r):
        return p + q + r
    return f(a(1), a(2), r=a(3)), log, x
def q_duplicate_kwarg(x):
    def f(a):
        return a
    return f(a=1, **{"a": 2})
def q_call_star_generator(x):
    def f(a, b, c):
        return a * 100 + b * 10 + c
    return f(*(v for v in range(3))), f(*"123"), x
def q_call_star_star_mapping_protocol(x):
    def f(a, b):
        return a + b
    return f(**Mapish()), x
def q_keyword_non_string(x):
    def f(**kw):
        return kw
    return f(**{1: 2})
def q_defaults_mutated(x):
    def f(a, b=1):
        return a + b
    f.__defaults__ = (10,)
    return f(1), x
def q_kwdefaults(x):
    def f(a, *, b=1):
        return a * b
    f.__kwdefaults__ = {"b": 7}
    return f(2), x
def q_recursion_memo_arg(x, memo):
    def fib(n):
        if n in memo:
            return memo[n]
        r = n if n < 2 else fib(n - 1) + fib(n - 2)
        memo[n] = r
        return r
    return fib(12), x
def q_globals_dict_read(x): return globals()["STATE"], x
def q_locals_snapshot(x):
    a = 1
    b = "two"
    return sorted(k for k in locals() if k != "x"), x
def q_eval_exec(x):
    ns = {}
    exec("y = 2 * 3", ns)
    return eval("1 + 2"), ns["y"], x
def q_nested_unpacking(x):
    (a, (b, c)), *rest = [(1, (2, 3)), 4, 5]
    return a + b + c, rest, x
def q_unpack_wrong_count(x):
    a, b = [1, 2, 3]
    return a
def q_swap_and_rotate(x):
    a, b, c = 1, 2, 3
    a, b, c = c, a, b
    return a, b, c, x
def q_conditional_import(x):
    if x.dim() == 2:
        import math as m
    else:
        import cmath as m
    return m.sqrt(16), x
def q_lambda_default_captures(x):
    fs = []
    for k in range(3):
        fs.append(lambda t, k=k: t + k)
    return [f(x) for f in fs]
def q_closure_cell_rebound_in_loop(x):
    fs = []
    for k in range(3):
        def f():
            return k
        fs.append(f)
    return [f() for f in fs], x
def q_generator_function_call_in_closure(x):
    def make():
        n = 0

        def gen():
            nonlocal n
            while n < 3:
                n += 1
                yield n
        return gen
    g = make()
    return list(g()), list(g()), x
def q_class_body_scope(x):
    k = 5

    class C:
        v = k * 2
        w = [v for _ in range(2)] if False else None
    return C.v, C.w, x
def q_function_annotations(x):
    def g(v: int, w: "str" = "s") -> float:
        return v
    return g.__annotations__, x
def q_function_identity_escapes(x, out):
    def g(p):
        return p
    out.append(g)
    return out[0] is g, x
def q_star_expr_in_literals(x):
    a = [1, 2]
    return [*a, *"bc"], (*a,), {*a, 3}, {**{"k": 1}, "j": 2}, x

def q_globals_write_then_read(x):
    globals()["DYNAMIC_GLOBAL"] = 3
    got = DYNAMIC_GLOBAL  # noqa: F821
    del globals()["DYNAMIC_GLOBAL"]
    return got, x
def q_globals_get(x): return globals().get("STATE"), globals().get("NOPE", "d"), x
def q_dir_in_function(x):
    a = 1
    return sorted(dir()), x
def q_vars_no_args(x):
    b = 2
    return sorted(vars()), x


TABLE = [
    (f_closure_read, (X,)), (f_closure_late_binding, (X,)), (f_closure_default_binding, (X,)),
    (f_closure_modified_after, (X,)), (f_nonlocal_counter, (X,)), (f_nonlocal_nested, (X,)),
    (f_nonlocal_list_accum, (X,)), (f_closure_external_counter, (X,)), (f_closure_global_counter, (X,)),
    (f_closure_passed_in, (X, make_scale(2))), (f_closure_from_arg_counter, lambda: (X, make_counter())),
    (f_closure_returned, (X,)), (f_defaults, (X,)), (f_default_none, (X,)),
    (f_default_evaluated_once, (X,)), (f_varargs, (X,)), (f_kwargs, (X,)), (f_varargs_kwargs_mix, (X,)),
    (f_star_call, (X,)), (f_kwonly, (X,)), (f_kwonly_missing, (X,)), (f_too_many_args, (X,)),
    (f_unexpected_kwarg, (X,)), (f_posonly, (X,)), (f_kwargs_forwarding, (X,)),
    (f_args_forwarding, (X,)), (f_lambda, (X,)), (f_lambda_sorted_key, (X,)),
    (f_lambda_immediately_called, (X,)), (f_lambda_in_dict, (X,)), (f_lambda_global, (X,)),
    (f_recursion, (X,)), (f_recursion_tensor, (X,)), (f_mutual_recursion, (X,)),
    (f_recursion_list_flatten, (X,)), (f_recursion_too_deep, (X,)), (f_early_return, (X, 3)),
    (f_early_return_in_while, (X,)), (f_while_else, (X,)), (f_while_break_else, (X,)),
    (f_for_else, (X,)), (f_while_tensor_accumulate, (X,)), (f_while_continue, (X,)),
    (f_nested_loops_break, (X,)), (f_nested_function_defs, (X,)), (f_function_attrs, (X,)),
    (f_decorator, (X,)), (f_higher_order, (X,)), (f_global_write, (X,), {"globals_": ("STATE",)}),
    (f_global_list_mutate, (X,), {"globals_": ("LOG",)}),
    (q_match_literal, (X, 3)), (q_match_sequence, (X,)), (q_match_mapping, (X,)), (q_match_class, (X,)),
    (q_match_tensor_shape, (X,)), (q_walrus, (X,)), (q_del_then_unbound, (X,)), (q_del_caught, (X,)),
    (q_free_var_unbound, (X,)), (q_chained_compare_side_effects, (X,)), (q_short_circuit_side_effects, (X,)),
    (q_and_or_return_operands, (X,)), (q_augassign_subscript_eval_once, (X,)),
    (q_augassign_attr_tensor, (X,)),
    (q_evaluation_order_args, (X,)), (q_duplicate_kwarg, (X,)), (q_call_star_generator, (X,)),
    (q_call_star_star_mapping_protocol, (X,)), (q_keyword_non_string, (X,)), (q_defaults_mutated, (X,)),
    (q_kwdefaults, (X,)), (q_recursion_memo_arg, (X, {})), (q_globals_dict_read, (X,)),
    (q_locals_snapshot, (X,)), (q_eval_exec, (X,)), (q_nested_unpacking, (X,)), (q_unpack_wrong_count, (X,)),
    (q_swap_and_rotate, (X,)), (q_conditional_import, (X,)), (q_lambda_default_captures, (X,)),
    (q_closure_cell_rebound_in_loop, (X,)), (q_generator_function_call_in_closure, (X,)),
    (q_class_body_scope, (X,)), (q_star_expr_in_literals, (X,)), (q_function_annotations, (X,)),
    (q_function_identity_escapes, (X, [])), (q_globals_write_then_read, (X,)), (q_globals_get, (X,)),
    (q_dir_in_function, (X,)), (q_vars_no_args, (X,)),
]

KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_functions(fn, args, options):
    run_program(fn, args, **options)
