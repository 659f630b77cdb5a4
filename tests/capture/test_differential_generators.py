"""Differential programs: user generators (yield, yield from, send, close, throw, return values), generator
expressions, infinite generators consumed partly, and generators passed in and consumed partly (the
caller's generator must be left exactly where eager leaves it)."""
from __future__ import annotations

import itertools

import pytest
import torch
from diff_helpers import params, run_program

X = torch.randn(4, 5)
Y = torch.randn(4, 5)


def count_up(n):
    for i in range(n):
        yield i


def naturals(start=0):
    i = start
    while True:
        yield i
        i += 1


def scaled(x, n):
    for i in range(n):
        yield x * i


def inner_ret():
    yield 1
    yield 2
    return 10


def outer_ret():
    r = yield from inner_ret()
    yield r


def accumulator():
    total = 0
    while True:
        v = yield total
        if v is None:
            return total
        total += v


def with_finally(log):
    try:
        yield 1
        yield 2
    finally:
        log.append("closed")


def catching():
    while True:
        try:
            yield "ok"
        except ValueError:
            yield "caught"


def pairs(n):
    for i in range(n):
        yield i, i * i


def raising_gen():
    yield 1
    raise KeyError("boom")


def stopping_gen():
    yield 1
    raise StopIteration  # PEP 479: becomes RuntimeError


class Bag:
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        for it in self.items:
            yield it * 2


# ---- generators created and consumed inside the program -----------------------------------------------
def g_list_of_gen(x): return [x * i for i in count_up(3)]
def g_sum_scaled(x): return sum(scaled(x, 4))
def g_for_loop(x):
    out = x
    for t in scaled(x, 3):
        out = out + t
    return out
def g_yield_from(x):
    def both():
        yield from count_up(2)
        yield from count_up(3)
    return x * sum(both())
def g_yield_from_return(x):
    return x + sum(outer_ret())
def g_yield_from_list(x):
    def gen():
        yield from [x, x * 2]
        yield from (x + 1,)
    return list(gen())
def g_send(x):
    acc = accumulator()
    next(acc)
    acc.send(2)
    v = acc.send(3)
    return x * v
def g_send_return_value(x):
    acc = accumulator()
    next(acc)
    acc.send(4)
    try:
        acc.send(None)
    except StopIteration as e:
        return x * e.value
    return x
def g_close_finally(x):
    log = []
    g = with_finally(log)
    next(g)
    g.close()
    return x * len(log), log
def g_close_then_next(x):
    g = count_up(5)
    next(g)
    g.close()
    return next(g, -1) * x
def g_throw_caught(x):
    g = catching()
    next(g)
    r = g.throw(ValueError("v"))
    return x * len(r), r
def g_throw_uncaught(x):
    g = count_up(3)
    next(g)
    try:
        g.throw(KeyError("k"))
    except KeyError:
        return x + 1
    return x
def g_return_value_next(x):
    g = inner_ret()
    next(g)
    next(g)
    try:
        next(g)
    except StopIteration as e:
        return x * e.value
def g_next_default(x):
    g = count_up(1)
    a = next(g, 7)
    b = next(g, 7)
    return x * a + b
def g_exhausted_twice(x):
    g = count_up(2)
    first = list(g)
    second = list(g)
    return x * len(first), second
def g_infinite_islice(x): return [x * i for i in itertools.islice(naturals(), 4)]
def g_infinite_next(x):
    g = naturals(3)
    return x * next(g) + next(g)
def g_infinite_break(x):
    out = x
    for i in naturals():
        if i >= 3:
            break
        out = out * 2
    return out
def g_infinite_zip(x): return [x + i for _, i in zip(range(3), naturals(5))]
def g_genexpr_sum(x): return sum(t * 2 for t in x)
def g_genexpr_cond(x): return sum(i for i in range(10) if i % 3 == 0) * x
def g_genexpr_tuple(x): return tuple(r.sum() for r in x)
def g_genexpr_dict(x): return dict((f"k{i}", x * i) for i in range(3))
def g_genexpr_nested(x): return sum(i * j for i in range(3) for j in range(i)) + x
def g_genexpr_max(x): return max(i * (5 - i) for i in range(6)) * x
def g_genexpr_join(x): return "-".join(str(i) for i in range(4)), x
def g_genexpr_any(x): return x * any(i > 3 for i in range(6))
def g_genexpr_all(x): return x * all(i < 3 for i in range(6))
def g_genexpr_closure(x):
    k = 3
    return list(x * k + i for i in range(2))
def g_gen_of_gens(x):
    def rows():
        for i in range(3):
            yield (x * i + j for j in range(2))
    return [sum(r) for r in rows()]
def g_enumerate_gen(x): return [x * i + v for i, v in enumerate(count_up(3), start=1)]
def g_zip_gens(x): return [a * b for a, b in zip(count_up(3), naturals(1))] + [x]
def g_sorted_gen(x): return sorted(i * (-1) ** i for i in count_up(5)), x
def g_dict_from_pairs(x): return dict(pairs(3)), x
def g_unpack_pairs(x):
    out = []
    for i, sq in pairs(3):
        out.append(x * sq - i)
    return out
def g_star_unpack(x):
    a, *rest = count_up(4)
    return x * a, rest
def g_raise_inside(x):
    g = raising_gen()
    out = [next(g)]
    try:
        next(g)
    except KeyError:
        out.append("key")
    return out, x
def g_stopiteration_runtimeerror(x):
    try:
        list(stopping_gen())
    except RuntimeError:
        return x + 1
    return x
def g_escaping_generator_error(x): return list(raising_gen())
def g_class_iter(x): return [x * v for v in Bag([1, 2, 3])]
def g_tensor_yield(x):
    def rows(t):
        for r in t:
            yield r.relu()
    return torch.stack(list(rows(x)))
def g_shape_loop(x):
    def dims(t):
        for d in t.shape:
            yield d
    return x * sum(dims(x))
def g_yield_value_none(x):
    def gen():
        got = yield 1
        yield got
    g = gen()
    next(g)
    return x, next(g)
def g_running_state(x):
    def running(n):
        s = 0
        for i in range(n):
            s += i
            yield s
    return [x * s for s in running(4)]
def g_gen_default_args(x):
    def gen(a, step=2):
        while a < 7:
            yield a
            a += step
    return list(gen(1)), list(gen(0, step=3)), x
def g_takewhile(x): return list(itertools.takewhile(lambda v: v < 4, naturals())), x
def g_return_generator(x): return scaled(x, 3)
def g_return_partly_consumed(x):
    g = scaled(x, 4)
    next(g)
    return g
def g_in_listcomp(x): return [[v for v in count_up(i)] for i in range(3)], x
def g_with_inside(x):
    def gen():
        with torch.no_grad():
            yield x * 2
        yield x * 3
    return list(gen())


# ---- generators and iterators passed in ---------------------------------------------------------------
def a_next_twice(x, g): return x * next(g) + next(g)
def a_for_break(x, g):
    for v in g:
        if v >= 2:
            break
        x = x + v
    return x
def a_zip_shorter(x, g):
    # zip pulls one more item from g before it sees the list is done
    return [x * a + b for a, b in zip(g, [1, 2])]
def a_zip_first_short(x, g): return [x * a + b for a, b in zip([1, 2], g)]
def a_any_short_circuit(x, g): return x * any(v > 1 for v in g)
def a_list_all(x, g): return x * len(list(g))
def a_islice(x, g): return [x + v for v in itertools.islice(g, 2)]
def a_map_partly(x, g):
    m = map(lambda v: v * 10, g)
    return x + next(m)
def a_yield_from_arg(x, g):
    def wrap():
        yield from g
    w = wrap()
    return x * next(w)
def a_return_gen_back(x, g):
    next(g)
    return g
def a_iter_list(x, it): return x * next(it), list(it)
def a_send_arg(x, acc):
    acc.send(5)
    return x * acc.send(1)
def a_enumerate_arg(x, g):
    for i, v in enumerate(g):
        if i == 1:
            return x * v
    return x
def a_exhausted_arg(x, g): return x * next(g, 9) + next(g, 8)
def a_close_arg(x, g):
    next(g)
    g.close()
    return x


# ---- harder: side effects while running, finalization, consumption by builtins ------------------------
def logging_gen(log, n):
    for i in range(n):
        log.append(f"yield {i}")
        yield i
    log.append("done")


def h_side_effects_partly(x):
    log = []
    g = logging_gen(log, 4)
    next(g)
    next(g)
    return x, log
def h_side_effects_arg_log(x, log):
    g = logging_gen(log, 3)
    for v in g:
        if v == 1:
            break
    return x * v
def h_finally_on_garbage(x):
    log = []
    g = with_finally(log)
    next(g)
    del g
    return x, log
def h_finally_at_function_end(x, log):
    g = with_finally(log)
    next(g)
    return x
def h_escaping_generator_in_list(x, out):
    g = count_up(5)
    next(g)
    out.append(g)
    return x
def h_lazy_genexpr_binding(x):
    gens = [(i * j for j in range(2)) for i in range(3)]
    return [list(g) for g in gens], x
def h_genexpr_first_iter_eager(x):
    items = [1, 2]
    g = (v * 2 for v in items)
    items = [10, 20]
    return list(g), x
def h_in_consumes_arg(x, g): return 2 in g, x
def h_not_in_exhausts_arg(x, g): return 99 in g, x
def h_unpack_too_many(x, g):
    a, b = g
    return a, b
def h_unpack_star_arg(x, g):
    a, *rest = g
    return a, rest, x
def h_islice_not_iterated(x, g):
    itertools.islice(g, 2)
    return x
def h_map_not_iterated(x, g):
    map(str, g)
    return x
def h_iter_is_self(x, g): return iter(g) is g, x
def h_min_default_arg(x, g): return min(g, default=-1), x
def h_dict_zip_arg(x, g): return dict(zip("ab", g)), x
def h_error_midway_in_list(x):
    log = []

    def gen():
        log.append(1)
        yield 1
        log.append(2)
        raise IndexError
    try:
        list(gen())
    except IndexError:
        log.append("caught")
    return x, log
def h_exception_through_for(x):
    done = []
    g = raising_gen()
    try:
        for v in g:
            done.append(v)
    except KeyError:
        done.append("k")
    return done, next(g, "finished"), x
def h_genexpr_stopiteration(x):
    def boom():
        raise StopIteration
    try:
        return list(boom() for _ in range(2))
    except RuntimeError:
        return x
def h_ignored_generatorexit(x):
    def stubborn():
        try:
            yield 1
        except GeneratorExit:
            yield 2
    g = stubborn()
    next(g)
    try:
        g.close()
    except RuntimeError:
        return x + 1
    return x
def h_two_independent(x):
    a, b = count_up(3), count_up(3)
    next(a)
    return list(a), list(b), x
def h_send_tensor(x):
    def doubler():
        v = yield
        while True:
            v = yield v * 2
    g = doubler()
    next(g)
    return g.send(x), g.send(x + 1)
def h_send_before_start(x):
    g = accumulator()
    return g.send(1)
def h_yield_in_try_except_loop(x):
    def gen():
        for i in range(4):
            try:
                if i == 2:
                    raise ValueError
                yield i
            except ValueError:
                yield -1
    return list(gen()), x
def h_nonlocal_in_generator(x):
    calls = 0

    def gen():
        nonlocal calls
        for i in range(3):
            calls += 1
            yield i
    g = gen()
    next(g)
    next(g)
    return calls, x
def h_generator_reads_mutated_list(x):
    data = [1, 2]

    def gen():
        for v in data:
            yield v
    g = gen()
    first = next(g)
    data.append(3)
    return first, list(g), x
def h_yield_from_return_arg(x, g):
    def wrap():
        got = yield from g
        yield ("returned", got)
    return list(wrap()), x
def h_gen_throw_arg(x, g):
    try:
        g.throw(ValueError)
    except ValueError:
        pass
    return next(g, "dead"), x

def h_break_inside_generator_body(x):
    def gen(t):
        for r in t:
            yield r.sum().item()
    return sorted(gen(x)), x
def h_break_inside_gen_partly(x, log):
    def gen(t):
        for i, r in enumerate(t):
            log.append(i)
            yield r.max().item()
    g = gen(x)
    first = next(g)
    return first, x
def h_native_join_of_gen(x):
    def names():
        for i in range(3):
            yield f"n{i}"
    return "/".join(names()), x
def h_zip_star_gens(x): return list(zip(*(count_up(3) for _ in range(2)))), x
def h_generator_returned_from_nested(x):
    def make():
        return (v * 2 for v in count_up(4))
    g = make()
    next(g)
    return g
def h_gen_with_tensor_state(x):
    def running(t):
        acc = torch.zeros_like(t[0])
        for r in t:
            acc = acc + r
            yield acc
    return list(running(x))
def h_sum_gen_with_item(x): return sum(r.sum().item() for r in x)
def h_any_gen_with_item(x, log):
    def check(r):
        log.append(1)
        return r.sum().item() > -1e9
    return any(check(r) for r in x)
def h_generator_arg_in_genexpr(x, g): return [v * 2 for v in g if v < 2], x
def h_generator_arg_next_in_loop(x, g):
    out = []
    for _ in range(2):
        out.append(next(g) * x)
    return out
def h_generator_passed_to_callee(x, g):
    def take(it, n):
        return [next(it) for _ in range(n)]
    return take(g, 2), x
def h_generator_stored_on_object(x):
    class Holder:
        pass
    h = Holder()
    h.g = count_up(4)
    next(h.g)
    return h


def _primed_acc():
    acc = accumulator()
    next(acc)
    return (X, acc)


TABLE = [
    (g_list_of_gen, (X,)), (g_sum_scaled, (X,)), (g_for_loop, (X,)), (g_yield_from, (X,)),
    (g_yield_from_return, (X,)), (g_yield_from_list, (X,)), (g_send, (X,)), (g_send_return_value, (X,)),
    (g_close_finally, (X,)), (g_close_then_next, (X,)), (g_throw_caught, (X,)), (g_throw_uncaught, (X,)),
    (g_return_value_next, (X,)), (g_next_default, (X,)), (g_exhausted_twice, (X,)),
    (g_infinite_islice, (X,)), (g_infinite_next, (X,)), (g_infinite_break, (X,)), (g_infinite_zip, (X,)),
    (g_genexpr_sum, (X,)), (g_genexpr_cond, (X,)), (g_genexpr_tuple, (X,)), (g_genexpr_dict, (X,)),
    (g_genexpr_nested, (X,)), (g_genexpr_max, (X,)), (g_genexpr_join, (X,)), (g_genexpr_any, (X,)),
    (g_genexpr_all, (X,)), (g_genexpr_closure, (X,)), (g_gen_of_gens, (X,)), (g_enumerate_gen, (X,)),
    (g_zip_gens, (X,)), (g_sorted_gen, (X,)), (g_dict_from_pairs, (X,)), (g_unpack_pairs, (X,)),
    (g_star_unpack, (X,)), (g_raise_inside, (X,)), (g_stopiteration_runtimeerror, (X,)),
    (g_escaping_generator_error, (X,)), (g_class_iter, (X,)), (g_tensor_yield, (X,)),
    (g_shape_loop, (X,)), (g_yield_value_none, (X,)), (g_running_state, (X,)),
    (g_gen_default_args, (X,)), (g_takewhile, (X,)), (g_return_generator, (X,)),
    (g_return_partly_consumed, (X,)), (g_in_listcomp, (X,)), (g_with_inside, (X,)),
    (a_next_twice, lambda: (X, count_up(5))), (a_for_break, lambda: (X, count_up(5))),
    (a_zip_shorter, lambda: (X, count_up(5))), (a_zip_first_short, lambda: (X, count_up(5))),
    (a_any_short_circuit, lambda: (X, count_up(5))), (a_list_all, lambda: (X, count_up(4))),
    (a_islice, lambda: (X, naturals(2))), (a_map_partly, lambda: (X, count_up(4))),
    (a_yield_from_arg, lambda: (X, naturals(1))), (a_return_gen_back, lambda: (X, naturals())),
    (a_iter_list, lambda: (X, iter([3, 4, 5]))), (a_send_arg, _primed_acc),
    (a_enumerate_arg, lambda: (X, naturals(4))), (a_exhausted_arg, lambda: (X, count_up(1))),
    (a_close_arg, lambda: (X, count_up(3))),
    (h_side_effects_partly, (X,)), (h_side_effects_arg_log, (X, [])), (h_finally_on_garbage, (X,)),
    (h_finally_at_function_end, (X, [])), (h_escaping_generator_in_list, (X, [])),
    (h_lazy_genexpr_binding, (X,)), (h_genexpr_first_iter_eager, (X,)),
    (h_in_consumes_arg, lambda: (X, count_up(5))), (h_not_in_exhausts_arg, lambda: (X, count_up(3))),
    (h_unpack_too_many, lambda: (X, count_up(3))), (h_unpack_star_arg, lambda: (X, count_up(3))),
    (h_islice_not_iterated, lambda: (X, count_up(3))), (h_map_not_iterated, lambda: (X, count_up(3))),
    (h_iter_is_self, lambda: (X, count_up(3))), (h_min_default_arg, lambda: (X, count_up(0))),
    (h_dict_zip_arg, lambda: (X, naturals())), (h_error_midway_in_list, (X,)),
    (h_exception_through_for, (X,)), (h_genexpr_stopiteration, (X,)), (h_ignored_generatorexit, (X,)),
    (h_two_independent, (X,)), (h_send_tensor, (X,)), (h_send_before_start, (X,)),
    (h_yield_in_try_except_loop, (X,)), (h_nonlocal_in_generator, (X,)),
    (h_generator_reads_mutated_list, (X,)), (h_yield_from_return_arg, lambda: (X, inner_ret())),
    (h_gen_throw_arg, lambda: (X, catching())), (h_break_inside_generator_body, (X,)),
    (h_break_inside_gen_partly, (X, [])), (h_native_join_of_gen, (X,)), (h_zip_star_gens, (X,)),
    (h_generator_returned_from_nested, (X,)), (h_gen_with_tensor_state, (X,)), (h_sum_gen_with_item, (X,)),
    (h_any_gen_with_item, (X, [])), (h_generator_arg_in_genexpr, lambda: (X, count_up(4))),
    (h_generator_arg_next_in_loop, lambda: (X, naturals())),
    (h_generator_passed_to_callee, lambda: (X, naturals(3))), (h_generator_stored_on_object, (X,)),
]

KNOWN: dict[str, str] = {
}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_generators(fn, args, options):
    run_program(fn, args, **options)
