"""Differential programs: builtin iteration: iter, next with a default, enumerate, zip (strict=True too),
reversed, map, filter, sorted / min / max with key=, sum with start, any / all, and itertools."""
from __future__ import annotations

import itertools
import operator

import pytest
import torch
from diff_helpers import params, run_program

X = torch.randn(3, 4)
Y = torch.randn(3, 4)


def i_iter_next(x):
    it = iter([1, 2, 3])
    return x * next(it) + next(it)
def i_next_default(x):
    it = iter([5])
    return x * next(it, 0) + next(it, 10)
def i_next_default_none(x):
    it = iter(())
    return x if next(it, None) is None else x * 2
def i_next_exhausted_raises(x):
    it = iter([1])
    next(it)
    return x * next(it)
def i_iter_tensor(x):
    it = iter(x)
    return next(it) + next(it)
def i_iter_dict(x):
    it = iter({"a": 1, "b": 2})
    return next(it), x
def i_iter_string(x): return list(iter("abc")), x
def i_iter_sentinel(x):
    vals = [1, 2, 0, 4]
    return list(iter(lambda: vals.pop(0), 0)), vals, x
def i_enumerate(x): return [x * i for i, _ in enumerate("abc")]
def i_enumerate_start(x): return [(i, c) for i, c in enumerate("xy", start=5)], x
def i_enumerate_tensor(x): return sum(r * i for i, r in enumerate(x, 1))
def i_enumerate_next(x):
    e = enumerate([7, 8])
    return next(e), next(e), x
def i_zip(x, y): return [a * b for a, b in zip(x, y)]
def i_zip_three(x): return list(zip([1, 2], "ab", (True, False))), x
def i_zip_uneven(x): return list(zip(range(5), "abc")), x
def i_zip_strict_ok(x): return [a + b for a, b in zip([1, 2], [3, 4], strict=True)], x
def i_zip_strict_error(x): return list(zip([1, 2, 3], [3, 4], strict=True))
def i_zip_strict_caught(x):
    try:
        return list(zip([1], [3, 4], strict=True))
    except ValueError:
        return x * 2
def i_zip_star(x):
    a, b = zip(*[(1, "p"), (2, "q")])
    return a, b, x
def i_zip_empty(x): return list(zip()), x
def i_reversed_list(x): return [x * v for v in reversed([1, 2, 3])]
def i_reversed_range(x): return list(reversed(range(1, 8, 2))), x
def i_reversed_tuple_str(x): return list(reversed((1, "a"))), "".join(reversed("abc")), x
def i_reversed_dict(x): return list(reversed({"a": 1, "b": 2})), x
def i_reversed_unsupported(x): return list(reversed({1, 2}))
def i_map(x): return list(map(lambda v: v * 2, [1, 2, 3])), x
def i_map_two(x): return list(map(operator.add, [1, 2], [10, 20, 30])), x
def i_map_tensor(x): return list(map(torch.relu, x))
def i_map_builtin(x): return list(map(str, [1, 2])), list(map(len, ["a", "bb"])), x
def i_filter(x): return list(filter(lambda v: v % 2 == 0, range(7))), x
def i_filter_none(x): return list(filter(None, [0, 1, "", "a", None, 2])), x
def i_sorted(x): return sorted([3, 1, 2]), sorted("cab"), x
def i_sorted_key(x): return sorted(["bbb", "a", "cc"], key=lambda s: len(s)), x
def i_sorted_reverse(x): return sorted([(1, "b"), (2, "a"), (1, "a")], reverse=True), x
def i_sorted_key_tensor(x):
    rows = list(x)
    return sorted(rows, key=lambda r: r.sum().item())
def i_sorted_dict_items(x): return sorted({"b": 1, "a": 2}.items(), key=lambda kv: kv[1]), x
def i_sorted_mixed_error(x): return sorted([1, "a"])
def i_min_max(x): return min([4, 2, 8]), max(4, 2, 8), min("bca"), x
def i_min_max_key(x):
    words = ["aa", "b", "cccc"]
    return min(words, key=len), max(words, key=lambda w: w[-1]), x
def i_max_default(x): return max([], default=-1), min((), default=None), x
def i_max_empty_error(x): return max([])
def i_max_shape(x): return x * max(x.shape), min(x.shape)
def i_sum_start(x): return sum([1, 2, 3], 10), sum([[1], [2]], []), x
def i_sum_tensors(x): return sum([x, x * 2], torch.ones(4))
def i_sum_float(x): return sum([0.5, 0.25]) * x
def i_any_all(x): return any([0, 0, 1]), all([1, 1, 0]), any([]), all([]), x
def i_any_tensor_bools(x): return x * any(v > 2 for v in [1, 2, 3])
def i_chain(x): return list(itertools.chain([1, 2], (3,), "ab")), x
def i_chain_from_iterable(x): return list(itertools.chain.from_iterable([[1], [2, 3]])), x
def i_chain_tensors(x): return torch.stack(list(itertools.chain(x, x)))
def i_product(x): return list(itertools.product([1, 2], "ab")), x
def i_product_repeat(x): return len(list(itertools.product(range(2), repeat=3))) * x
def i_accumulate(x): return list(itertools.accumulate([1, 2, 3, 4])), x
def i_accumulate_func(x): return list(itertools.accumulate([3, 1, 4, 1], max)), x
def i_accumulate_initial(x): return list(itertools.accumulate([1, 2], operator.mul, initial=5)), x
def i_accumulate_tensor(x): return list(itertools.accumulate(x))
def i_islice(x): return list(itertools.islice(range(10), 2, 8, 3)), x
def i_islice_tensor(x): return [r * 2 for r in itertools.islice(x, 1, None)]
def i_count(x): return [x * c for c in itertools.islice(itertools.count(3, 2), 3)]
def i_count_zip(x): return list(zip(itertools.count(), "abc")), x
def i_repeat(x): return list(itertools.repeat(7, 3)), x
def i_repeat_zip(x): return [a * b for a, b in zip(itertools.repeat(2), [1, 2, 3])], x
def i_pairwise(x): return list(itertools.pairwise([1, 2, 4, 7])), x
def i_pairwise_tensor(x): return [b - a for a, b in itertools.pairwise(x)]
def i_groupby(x): return [(k, list(g)) for k, g in itertools.groupby("aabccc")], x
def i_groupby_key(x):
    return [(k, len(list(g))) for k, g in itertools.groupby(range(7), key=lambda v: v // 3)], x
def i_starmap(x): return list(itertools.starmap(pow, [(2, 3), (3, 2)])), x
def i_starmap_tensor(x): return list(itertools.starmap(torch.add, [(x, 1), (x, 2)]))
def i_zip_longest(x): return list(itertools.zip_longest([1, 2, 3], "ab")), x
def i_zip_longest_fill(x): return list(itertools.zip_longest([1], [2, 3], fillvalue=0)), x
def i_combinations(x): return list(itertools.combinations(range(4), 2)), x
def i_permutations(x): return len(list(itertools.permutations("abc"))) * x
def i_dropwhile(x): return list(itertools.dropwhile(lambda v: v < 3, [1, 4, 2, 5])), x
def i_compress(x): return list(itertools.compress("abcd", [1, 0, 1, 0])), x
def i_tee(x):
    a, b = itertools.tee([1, 2, 3])
    return list(a), list(b), x
def i_cycle_islice(x): return list(itertools.islice(itertools.cycle("ab"), 5)), x
def i_iter_arg_partly(x, it):
    a = next(it)
    return x * a
def i_enumerate_arg_partly(x, it):
    for i, v in enumerate(it):
        if v > 1:
            return x * i
    return x
def i_map_arg_partly(x, it):
    m = map(lambda v: v + 1, it)
    return x * next(m)
def i_filter_arg_partly(x, it):
    f = filter(lambda v: v > 1, it)
    return x * next(f)
def i_chain_arg_partly(x, it):
    c = itertools.chain([0], it)
    next(c)
    return x * next(c)
def i_islice_arg(x, it): return [x * v for v in itertools.islice(it, 2)]
def i_next_non_iterator(x): return next([1, 2])
def i_iter_non_iterable(x): return iter(5)


# ---- harder: protocols of user classes, 0-d tensors, ranges, lazy iterators passed around --------------
class Rev:
    def __init__(self, *v):
        self.v = list(v)

    def __reversed__(self):
        return iter(self.v[::-1] + ["custom"])


class GetItemOnly:
    def __getitem__(self, i):
        if i >= 3:
            raise IndexError
        return i * i

    def __len__(self):
        return 3


class Truthy:
    def __init__(self, v):
        self.v = v

    def __bool__(self):
        return self.v > 1


def j_reversed_custom(x): return list(reversed(Rev(1, 2))), x
def j_reversed_getitem_len(x): return list(reversed(GetItemOnly())), x
def j_iter_getitem_protocol(x): return list(GetItemOnly()), 4 in GetItemOnly(), x
def j_filter_user_bool(x): return [t.v for t in filter(None, [Truthy(1), Truthy(2), Truthy(3)])], x
def j_iter_zero_dim(x): return list(x.sum())
def j_len_zero_dim(x): return len(x.sum())
def j_range_ops(x):
    r = range(2, 20, 3)
    return len(r), r[2], r[-1], r[1:3], 8 in r, r.index(11), list(range(5, 0, -2)), x
def j_range_negative_empty(x): return list(range(3, 0)), len(range(0, -10, -3)), x
def j_range_float_error(x): return range(1.5)
def j_reversed_zip_error(x): return reversed(zip([1], [2]))
def j_zip_strict_consumption(x, g):
    try:
        list(zip([1, 2], g, strict=True))
    except ValueError:
        pass
    return x
def j_zip_object_next(x):
    z = zip("ab", [1, 2])
    first = next(z)
    return first, list(z), x
def j_map_lazy_side_effects(x):
    log = []

    def f(v):
        log.append(v)
        return v * 2
    m = map(f, [1, 2, 3])
    first = next(m)
    return first, log, x
def j_filter_lazy_arg_consumption(x, it):
    f = filter(lambda v: v > 2, it)
    return next(f), x
def j_enumerate_dict(x): return list(enumerate({"a": 1, "b": 2})), x
def j_next_iter_values(x, d): return next(iter(d.values())), next(iter(d.items())), x
def j_sorted_dict_by_value(x, d): return sorted(d, key=d.get), sorted(d, key=lambda k: -d[k]), x
def j_max_tensors_by_key(x): return max(list(x), key=lambda r: r.sum().item())
def j_min_tuple_keys(x): return min([(2, "b"), (1, "z"), (1, "a")]), max("abc", key=ord), x
def j_sum_strings_error(x): return sum(["a", "b"], "")
def j_sum_generator_tensors(x): return sum((r * i for i, r in enumerate(x)), torch.zeros(4))
def j_any_all_tensor_elems(x): return any(v > 10 for v in x.flatten().tolist()), all(v > -10 for v in x[0])
def j_all_short_circuit_arg(x, it): return all(v < 2 for v in it), x
def j_iter_callable_sentinel_arg(x, src):
    return list(iter(src.pop, 0)), x
def j_chain_lazy_arg(x, it):
    c = itertools.chain(it, [99])
    return x
def j_product_tensors(x): return [a * b for a, b in itertools.product(x[:2], [1, 2])]
def j_groupby_consumed_out_of_order(x):
    groups = list(itertools.groupby("aabb"))
    return [(k, list(g)) for k, g in groups], x
def j_islice_negative_error(x): return list(itertools.islice(range(5), -1))
def j_accumulate_strings(x): return list(itertools.accumulate("abc")), x
def j_zip_longest_generators(x):
    def g(n):
        yield from range(n)
    return list(itertools.zip_longest(g(1), g(3), fillvalue="-")), x
def j_count_float_step(x): return list(itertools.islice(itertools.count(0.5, 0.25), 3)), x
def j_repeat_tensor_identity(x):
    reps = list(itertools.repeat(x, 2))
    return reps[0] is reps[1], reps[0] is x
def j_tee_partly(x):
    a, b = itertools.tee(iter([1, 2, 3]))
    next(a)
    return list(b), list(a), x
def j_starmap_user_fn(x):
    def f(a, b=10):
        return a + b
    return list(itertools.starmap(f, [(1,), (2, 3)])), x
def j_dict_items_unpack_loop(x):
    total = 0
    for i, (k, v) in enumerate({"a": 1, "b": 2}.items()):
        total += i * v + len(k)
    return total, x
def j_nested_zip_enumerate(x):
    return [(i, a, b) for i, (a, b) in enumerate(zip("ab", range(5)), start=10)], x


def _it():
    return (X, iter([1, 2, 3, 4]))


TABLE = [
    (i_iter_next, (X,)), (i_next_default, (X,)), (i_next_default_none, (X,)),
    (i_next_exhausted_raises, (X,)), (i_iter_tensor, (X,)), (i_iter_dict, (X,)), (i_iter_string, (X,)),
    (i_iter_sentinel, (X,)), (i_enumerate, (X,)), (i_enumerate_start, (X,)), (i_enumerate_tensor, (X,)),
    (i_enumerate_next, (X,)), (i_zip, (X, Y)), (i_zip_three, (X,)), (i_zip_uneven, (X,)),
    (i_zip_strict_ok, (X,)), (i_zip_strict_error, (X,)), (i_zip_strict_caught, (X,)), (i_zip_star, (X,)),
    (i_zip_empty, (X,)), (i_reversed_list, (X,)), (i_reversed_range, (X,)), (i_reversed_tuple_str, (X,)),
    (i_reversed_dict, (X,)), (i_reversed_unsupported, (X,)), (i_map, (X,)), (i_map_two, (X,)),
    (i_map_tensor, (X,)), (i_map_builtin, (X,)), (i_filter, (X,)), (i_filter_none, (X,)),
    (i_sorted, (X,)), (i_sorted_key, (X,)), (i_sorted_reverse, (X,)), (i_sorted_key_tensor, (X,)),
    (i_sorted_dict_items, (X,)), (i_sorted_mixed_error, (X,)), (i_min_max, (X,)), (i_min_max_key, (X,)),
    (i_max_default, (X,)), (i_max_empty_error, (X,)), (i_max_shape, (X,)), (i_sum_start, (X,)),
    (i_sum_tensors, (X,)), (i_sum_float, (X,)), (i_any_all, (X,)), (i_any_tensor_bools, (X,)),
    (i_chain, (X,)), (i_chain_from_iterable, (X,)), (i_chain_tensors, (X,)), (i_product, (X,)),
    (i_product_repeat, (X,)), (i_accumulate, (X,)), (i_accumulate_func, (X,)),
    (i_accumulate_initial, (X,)), (i_accumulate_tensor, (X,)), (i_islice, (X,)), (i_islice_tensor, (X,)),
    (i_count, (X,)), (i_count_zip, (X,)), (i_repeat, (X,)), (i_repeat_zip, (X,)), (i_pairwise, (X,)),
    (i_pairwise_tensor, (X,)), (i_groupby, (X,)), (i_groupby_key, (X,)), (i_starmap, (X,)),
    (i_starmap_tensor, (X,)), (i_zip_longest, (X,)), (i_zip_longest_fill, (X,)), (i_combinations, (X,)),
    (i_permutations, (X,)), (i_dropwhile, (X,)), (i_compress, (X,)), (i_tee, (X,)),
    (i_cycle_islice, (X,)), (i_iter_arg_partly, _it), (i_enumerate_arg_partly, _it),
    (i_map_arg_partly, _it), (i_filter_arg_partly, _it), (i_chain_arg_partly, _it), (i_islice_arg, _it),
    (i_next_non_iterator, (X,)), (i_iter_non_iterable, (X,)),
    (j_reversed_custom, (X,)), (j_reversed_getitem_len, (X,)), (j_iter_getitem_protocol, (X,)),
    (j_filter_user_bool, (X,)), (j_iter_zero_dim, (X,)), (j_len_zero_dim, (X,)), (j_range_ops, (X,)),
    (j_range_negative_empty, (X,)), (j_range_float_error, (X,)), (j_reversed_zip_error, (X,)),
    (j_zip_strict_consumption, _it), (j_zip_object_next, (X,)), (j_map_lazy_side_effects, (X,)),
    (j_filter_lazy_arg_consumption, _it), (j_enumerate_dict, (X,)), (j_next_iter_values, (X, {"k": 1})),
    (j_sorted_dict_by_value, (X, {"a": 2, "b": 1, "c": 3})), (j_max_tensors_by_key, (X,)),
    (j_min_tuple_keys, (X,)), (j_sum_strings_error, (X,)), (j_sum_generator_tensors, (X,)),
    (j_any_all_tensor_elems, (X,)), (j_all_short_circuit_arg, _it),
    (j_iter_callable_sentinel_arg, (X, [0, 3, 2, 1])), (j_chain_lazy_arg, _it), (j_product_tensors, (X,)),
    (j_groupby_consumed_out_of_order, (X,)), (j_islice_negative_error, (X,)), (j_accumulate_strings, (X,)),
    (j_zip_longest_generators, (X,)), (j_count_float_step, (X,)), (j_repeat_tensor_identity, (X,)),
    (j_tee_partly, (X,)), (j_starmap_user_fn, (X,)), (j_dict_items_unpack_loop, (X,)),
    (j_nested_zip_enumerate, (X,)),
]

KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_iterators(fn, args, options):
    run_program(fn, args, **options)
