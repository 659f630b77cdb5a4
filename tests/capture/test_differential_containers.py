"""Differential programs: list / dict / OrderedDict / defaultdict / Counter / deque / set / frozenset
methods and operators, containers passed in and mutated (their state after the call must match eager's),
nested containers and comprehensions."""
from __future__ import annotations

import collections

import pytest
import torch
from diff_helpers import params, run_program

X = torch.randn(3, 4)
OD = collections.OrderedDict


# ---- lists ---------------------------------------------------------------------------------------------
def c_list_slice_assign(x, lst):
    lst[1:3] = [x, x * 2, x * 3]
    return len(lst)
def c_list_slice_assign_step(x, lst):
    lst[::2] = ["a", "b", "c"]
    return x
def c_list_slice_assign_bad_len(x, lst):
    lst[::2] = ["a"]
    return x
def c_list_del(x, lst):
    del lst[0]
    del lst[-2:]
    return x * len(lst)
def c_list_insert(x, lst):
    lst.insert(0, "head")
    lst.insert(100, "tail")
    lst.insert(-1, x)
    return x
def c_list_sort_key(x, lst):
    lst.sort(key=lambda v: -v)
    return x * lst[0]
def c_list_sort_reverse(x):
    lst = ["bb", "a", "ccc"]
    lst.sort(key=len, reverse=True)
    return lst, x
def c_list_pop(x, lst): return x * lst.pop() + lst.pop(0), lst
def c_list_pop_empty(x): return [].pop()
def c_list_remove(x, lst):
    lst.remove(2)
    return x
def c_list_remove_missing(x, lst):
    lst.remove(99)
    return x
def c_list_extend(x, lst):
    lst.extend([x, "e"])
    lst.extend(range(2))
    lst += (9,)
    return len(lst)
def c_list_add_mul(x): return [1, 2] + [x], [0] * 3, 2 * ["a"]
def c_list_index_count(x, lst): return x * lst.index(3) + lst.count(1)
def c_list_index_missing(x, lst): return lst.index("zz")
def c_list_copy(x, lst):
    cp = lst.copy()
    cp.append(x)
    return cp, len(lst)
def c_list_clear(x, lst):
    alias = lst
    lst.clear()
    return x, alias
def c_list_reverse(x, lst):
    lst.reverse()
    return x * lst[0]
def c_list_aliasing(x, lst):
    a = lst
    a.append(x)
    b = [lst, lst]
    b[0].append(1)
    return len(lst), b[1] is lst
def c_list_imul(x, lst):
    lst *= 2
    return x
def c_list_compare(x): return [1, 2] < [1, 3], [1] == [1], [x.shape[0]] > [2], x
def c_list_negative_slices(x, lst): return lst[-3:-1], lst[::-1], lst[5:], x
def c_list_of_tensors_mutate(x, lst):
    lst[0] = lst[0] + x
    lst.append(lst[-1] * 2)
    return torch.stack(lst).sum(0)
def c_nested_list_mutate(x, nested):
    nested[0].append(x)
    nested[1][0] = "z"
    return len(nested[0])
def c_list_comp_filter(x): return [i * i for i in range(8) if i % 3], x
def c_list_comp_nested(x): return [[i + j for j in range(i)] for i in range(4)], x
def c_unpack_star(x):
    first, *mid, last = [1, 2, 3, 4, 5]
    return first, mid, last, x


# ---- dicts ---------------------------------------------------------------------------------------------
def c_dict_pop(x, d): return x * d.pop("a") + d.pop("zz", 3), d
def c_dict_pop_missing(x, d): return d.pop("zz")
def c_dict_setdefault(x, d):
    d.setdefault("a", 100)
    lst = d.setdefault("new", [])
    lst.append(x)
    return x
def c_dict_update(x, d):
    d.update({"b": 20, "c": 30})
    d.update(e=5)
    d.update([("f", 6)])
    return x
def c_dict_get(x, d): return x * d.get("a") + d.get("q", 10), d.get("q")
def c_dict_items_keys_values(x, d): return list(d.items()), list(d.keys()), sum(d.values()) * x
def c_dict_del_missing(x, d):
    del d["zzz"]
    return x
def c_dict_merge_ops(x, d): return d | {"z": 1}, {**d, "a": 0}, x
def c_dict_ior(x, d):
    d |= {"y": 2}
    return x
def c_dict_iter_order(x):
    d = {}
    d["b"] = 1
    d["a"] = 2
    d["b"] = 3
    return list(d), x
def c_dict_popitem(x, d): return d.popitem(), d, x
def c_dict_comprehension(x): return {k: v for k, v in zip("abc", range(3)) if v}, x
def c_dict_tensor_values(x, d):
    d["out"] = d["w"] * x
    return d["out"].sum()
def c_dict_fromkeys(x): return dict.fromkeys("ab", 0), x
def c_dict_int_keys(x):
    d = {1: "a", 2: "b"}
    d[3] = "c"
    return d, x
def c_dict_in(x, d): return x * ("a" in d) + ("zz" not in d)
def c_dict_len_clear(x, d):
    n = len(d)
    d.clear()
    return x * n
def c_dict_copy_mutate(x, d):
    e = d.copy()
    e["a"] = -1
    return e, x
def c_dict_nested(x, d):
    d["inner"]["k"].append(x)
    return x
def c_ordereddict(x):
    od = OD()
    od["b"] = 1
    od["a"] = 2
    od.move_to_end("b")
    return od, x
def c_ordereddict_popitem_last(x, od): return od.popitem(last=False), x
def c_defaultdict_list(x):
    dd = collections.defaultdict(list)
    for k, v in [("a", 1), ("b", 2), ("a", 3)]:
        dd[k].append(v)
    return dd, x
def c_defaultdict_int_arg(x, dd):
    dd["z"] += 1
    return x * dd["q"]
def c_counter(x):
    c = collections.Counter("abracadabra")
    return c.most_common(2), c["a"], c["zz"], x
def c_counter_update(x, c):
    c.update(["a", "a", "b"])
    c["z"] -= 1
    return x
def c_counter_ops(x): return collections.Counter(a=3, b=1) + collections.Counter(a=1, c=2), x


# ---- deque ---------------------------------------------------------------------------------------------
def c_deque_ops(x):
    d = collections.deque([1, 2, 3])
    d.append(4)
    d.appendleft(0)
    d.extendleft([-1, -2])
    d.rotate(2)
    return list(d), d[0], d[-1], x
def c_deque_pop(x, d): return x * d.pop() + d.popleft(), d
def c_deque_maxlen(x):
    d = collections.deque(maxlen=3)
    for i in range(5):
        d.append(i)
    return d, x
def c_deque_arg_mutate(x, d):
    d.rotate(-1)
    d.extend([x.shape[0]])
    return x
def c_deque_pop_empty(x): return collections.deque().popleft()


# ---- sets ----------------------------------------------------------------------------------------------
def c_set_ops(x):
    a, b = {1, 2, 3}, {2, 3, 4}
    return a | b, a & b, a - b, a ^ b, x
def c_set_methods(x, s):
    s.add(10)
    s.discard(1)
    s.update([20, 21])
    return x * len(s)
def c_set_remove_missing(x, s):
    s.remove(999)
    return x
def c_set_compare(x): return {1, 2} <= {1, 2, 3}, {1} < {1}, {1, 2}.isdisjoint({3}), x
def c_frozenset(x):
    f = frozenset([1, 2, 2])
    return f | {3}, f & frozenset([2]), 2 in f, x
def c_set_of_strings_in(x): return x * ("b" in {"a", "b"})
def c_set_comprehension(x): return {i % 3 for i in range(10)}, x
def c_set_pop_sorted(x, s):
    v = s.pop()
    return v, sorted(s), x
def c_set_dedupe(x): return sorted(set([3, 1, 3, 2, 1])), x


# ---- tuples and nesting --------------------------------------------------------------------------------
def c_tuple_ops(x): return (1, 2) + (3,), (0,) * 2, (1, 2, 3)[1:], (1, 2).index(2), x
def c_tuple_item_assign(x):
    t = (1, 2)
    t[0] = 3
    return x
def c_nested_structure(x):
    data = {"layers": [{"w": x, "n": 1}, {"w": x * 2, "n": 2}]}
    return sum(layer["w"] * layer["n"] for layer in data["layers"])
def c_list_of_dicts_arg(x, rows):
    for r in rows:
        r["seen"] = True
    rows.append({"new": x})
    return len(rows)
def c_dict_of_lists_arg(x, d):
    for k in d:
        d[k].append(k)
    return x


# ---- harder: mutation during iteration, live views, aliasing, stdlib helpers ---------------------------
def k_list_append_while_iterating(x):
    data = [1, 2]
    out = []
    for v in data:
        if v < 3:
            data.append(v + 10)
        out.append(v)
    return out, x
def k_arg_list_append_while_iterating(x, data):
    for v in data:
        if v < 3:
            data.append(v * 10)
    return x
def k_list_remove_while_iterating(x):
    data = [1, 2, 3, 4]
    for v in data:
        data.remove(v)
    return data, x
def k_list_iterator_sees_append(x):
    data = [1]
    it = iter(data)
    data.append(2)
    return list(it), x
def k_dict_changed_size(x):
    d = {"a": 1}
    for k in d:
        d[k + "!"] = 2
    return d
def k_dict_changed_size_caught(x):
    d = {"a": 1, "b": 2}
    try:
        for k in d:
            del d[k]
    except RuntimeError:
        return x, d
    return x
def k_set_changed_size(x):
    s = {1, 2}
    for v in s:
        s.add(v + 10)
    return s
def k_dict_overwrite_while_iterating(x):
    d = {"a": 1, "b": 2}
    for k in d:
        d[k] = d[k] * 10
    return d, x
def k_dict_keys_view_live(x):
    d = {"a": 1}
    ks = d.keys()
    d["b"] = 2
    return len(ks), list(ks), "b" in ks, x
def k_dict_view_set_ops(x, d):
    return d.keys() & {"a", "z"}, d.keys() - {"a"}, sorted(d.items() | {("q", 0)}), x
def k_defaultdict_read_creates(x, dd):
    v = dd["missing"]
    return x * len(dd), v
def k_defaultdict_get_no_create(x, dd): return dd.get("missing"), len(dd), x
def k_defaultdict_in_no_create(x, dd): return "missing" in dd, len(dd), x
def k_aliasing_list_mul(x):
    rows = [[]] * 3
    rows[0].append(1)
    return rows, rows[1] is rows[2], x
def k_aliasing_arg_twice(x, lst):
    both = [lst, lst]
    both[0].append("once")
    return len(both[1])
def k_list_extend_self(x, lst):
    lst.extend(lst)
    lst += lst
    return len(lst), x
def k_list_insert_slice(x, lst):
    lst[1:1] = ["a", "b"]
    del lst[::3]
    return x
def k_list_reverse_slice_assign(x, lst):
    lst[::-1] = lst
    return x
def k_list_sort_stable(x):
    pairs = [(1, "b"), (0, "a"), (1, "a"), (0, "b")]
    pairs.sort(key=lambda p: p[0])
    return pairs, x
def k_list_sort_tensor_error(x): return sorted([x, x + 1])
def k_list_index_start(x, lst): return lst.index(1, 1), lst.index(1, -2), x
def k_list_negative_repeat(x): return [1, 2] * -1, (1,) * 0, x
def k_heapq(x, heap):
    import heapq
    heapq.heappush(heap, 0)
    heapq.heappush(heap, 7)
    smallest = heapq.heappop(heap)
    return smallest, heapq.nsmallest(2, [5, 1, 4]), x
def k_bisect(x, lst):
    import bisect
    bisect.insort(lst, 3)
    return bisect.bisect_left(lst, 3), bisect.bisect_right([1, 2, 2], 2), x
def k_copy_module(x, d):
    import copy
    shallow = copy.copy(d)
    deep = copy.deepcopy(d)
    d["l"].append(1)
    return shallow["l"] is d["l"], deep["l"], x
def k_chainmap(x):
    cm = collections.ChainMap({"a": 1}, {"a": 2, "b": 3})
    cm["c"] = 4
    return cm["a"], cm["b"], sorted(cm), cm.maps[0], x
def k_dict_tensor_keys(x):
    y = x + 1
    d = {x: "x", y: "y"}
    return d[y], len(d), x in d
def k_ordereddict_eq(x): return OD(a=1, b=2) == OD(b=2, a=1), OD(a=1, b=2) == {"b": 2, "a": 1}, x
def k_dict_reinsert_order(x, d):
    v = d.pop("a")
    d["a"] = v
    return list(d), x
def k_dict_kwargs_ctor(x): return dict({"a": 1}, b=2), dict([("c", 3)], c=4), x
def k_counter_extras(x):
    c = collections.Counter(a=3, b=-1, c=0)
    return sorted(c.elements()), c.total(), +c, c - collections.Counter(a=1), x
def k_deque_extras(x, d):
    d.insert(1, "i")
    d.remove(2)
    return d.index(3), d[-1], d.count(1), x
def k_deque_maxlen_extendleft(x):
    d = collections.deque([1, 2, 3], maxlen=3)
    d.extendleft([9, 8])
    return d, x
def k_frozenset_dict_key(x):
    d = {frozenset([1, 2]): "a"}
    return d[frozenset([2, 1])], x
def k_nested_comprehension_shadow(x):
    i = 100
    out = [i for i in range(3)]
    return out, i, x
def k_set_of_tuples(x): return sorted({(1, 2), (1, 2), (2, 1)}), x
def k_tuple_compare_mixed_error(x): return (1, "a") < (1, 2)
def k_list_of_lists_sort(x): return sorted([[2, 1], [1, 5], [1, 2]]), x
def k_unhashable_key_error(x):
    d = {}
    d[[1]] = 2
    return d
def k_dict_get_mutable_default(x, d):
    lst = d.get("zz", [])
    lst.append(1)
    return lst, x

def k_exhausted_iterator_stays_exhausted(x):
    data = [1]
    it = iter(data)
    first = list(it)
    data.append(2)
    return first, list(it), x
def k_reversed_iterator_ignores_append(x):
    data = [1, 2, 3]
    r = reversed(data)
    next(r)
    data.append(4)
    return list(r), x
def k_list_pop_front_while_iterating(x):
    data = [1, 2, 3, 4, 5]
    seen = []
    for v in data:
        seen.append(v)
        data.pop(0)
    return seen, data, x
def k_dict_keys_changed_same_size(x):
    d = {"a": 1}
    for k in d:
        del d[k]
        d[k + "x"] = 1
    return d
def k_dict_items_mutation_error(x):
    d = {"a": 1, "b": 2}
    for k, v in d.items():
        d.pop("b", None)
    return d
def k_deque_mutated_during_iteration(x):
    dq = collections.deque([1, 2])
    for v in dq:
        dq.append(v)
    return dq
def k_set_discard_during_iteration(x):
    s = {1, 2, 3}
    for v in s:
        s.discard(v)
    return s
def k_dict_subclass_missing(x):
    class Auto(dict):
        def __missing__(self, key):
            return key * 2
    d = Auto(a="z")
    return d["a"], d["bb"], "bb" in d, x
def k_list_subclass_append(x):
    class Logged(list):
        def append(self, v):
            super().append(v * 10)
    lst = Logged([1])
    lst.append(2)
    return list(lst), len(lst), x
def k_defaultdict_factory_none(x):
    dd = collections.defaultdict(list)
    dd.default_factory = None
    return dd["missing"]
def k_defaultdict_lambda_copy(x):
    dd = collections.defaultdict(lambda: "fresh")
    _ = dd["a"]
    cp = dd.copy()
    return cp["b"], sorted(cp), dict(dd), x
def k_counter_from_mapping_ops(x):
    a = collections.Counter({"x": 3, "y": 1})
    b = collections.Counter(x=1, z=2)
    a.subtract(b)
    return a, a & b, a | b, a.most_common(), x
def k_counter_fromkeys_error(x): return collections.Counter.fromkeys("ab")
def k_ordereddict_move_first_reversed(x):
    od = OD(a=1, b=2, c=3)
    od.move_to_end("c", last=False)
    return list(reversed(od)), od.popitem(), od, x
def k_list_iterate_arg_then_extend(x, lst):
    for v in lst:
        if v == 1:
            lst.extend([5])
    return x
def k_nested_list_mutation_in_loop(x):
    grid = [[0] * 3 for _ in range(2)]
    for row in grid:
        for j in range(len(row)):
            row[j] = j
    return grid, x
def k_dict_setdefault_while_iterating_list(x):
    d = {}
    for k in ["a", "b", "a"]:
        d.setdefault(k, []).append(len(d))
    return d, x


TABLE = [
    (c_list_slice_assign, (X, [1, 2, 3, 4])), (c_list_slice_assign_step, (X, [1, 2, 3, 4, 5])),
    (c_list_slice_assign_bad_len, (X, [1, 2, 3, 4])), (c_list_del, (X, [1, 2, 3, 4, 5])),
    (c_list_insert, (X, [1, 2])), (c_list_sort_key, (X, [3, 1, 2])), (c_list_sort_reverse, (X,)),
    (c_list_pop, (X, [1, 2, 3])), (c_list_pop_empty, (X,)), (c_list_remove, (X, [1, 2, 3, 2])),
    (c_list_remove_missing, (X, [1])), (c_list_extend, (X, [1])), (c_list_add_mul, (X,)),
    (c_list_index_count, (X, [1, 3, 1, 3])), (c_list_index_missing, (X, [1])),
    (c_list_copy, (X, [1, 2])), (c_list_clear, (X, [1, 2])), (c_list_reverse, (X, [1, 2, 3])),
    (c_list_aliasing, (X, [0])), (c_list_imul, (X, [1, "a"])), (c_list_compare, (X,)),
    (c_list_negative_slices, (X, [1, 2, 3, 4])), (c_list_of_tensors_mutate, (X, [X, X * 2])),
    (c_nested_list_mutate, (X, [[1], [2, 3]])), (c_list_comp_filter, (X,)), (c_list_comp_nested, (X,)),
    (c_unpack_star, (X,)), (c_dict_pop, (X, {"a": 1, "b": 2})), (c_dict_pop_missing, (X, {})),
    (c_dict_setdefault, (X, {"a": 1})), (c_dict_update, (X, {"a": 1})), (c_dict_get, (X, {"a": 2})),
    (c_dict_items_keys_values, (X, {"a": 1, "b": 2})), (c_dict_del_missing, (X, {"a": 1})),
    (c_dict_merge_ops, (X, {"a": 1})), (c_dict_ior, (X, {"a": 1})), (c_dict_iter_order, (X,)),
    (c_dict_popitem, (X, {"a": 1, "b": 2})), (c_dict_comprehension, (X,)),
    (c_dict_tensor_values, (X, {"w": X})), (c_dict_fromkeys, (X,)), (c_dict_int_keys, (X,)),
    (c_dict_in, (X, {"a": 1})), (c_dict_len_clear, (X, {"a": 1, "b": 2})),
    (c_dict_copy_mutate, (X, {"a": 1})), (c_dict_nested, (X, {"inner": {"k": []}})),
    (c_ordereddict, (X,)), (c_ordereddict_popitem_last, (X, OD(a=1, b=2))), (c_defaultdict_list, (X,)),
    (c_defaultdict_int_arg, (X, collections.defaultdict(int, a=1))), (c_counter, (X,)),
    (c_counter_update, (X, collections.Counter(a=1))), (c_counter_ops, (X,)), (c_deque_ops, (X,)),
    (c_deque_pop, (X, collections.deque([1, 2, 3]))), (c_deque_maxlen, (X,)),
    (c_deque_arg_mutate, (X, collections.deque([1, 2], maxlen=3))), (c_deque_pop_empty, (X,)),
    (c_set_ops, (X,)), (c_set_methods, (X, {1, 2})), (c_set_remove_missing, (X, {1})),
    (c_set_compare, (X,)), (c_frozenset, (X,)), (c_set_of_strings_in, (X,)), (c_set_comprehension, (X,)),
    (c_set_pop_sorted, (X, {1, 2, 3})), (c_set_dedupe, (X,)), (c_tuple_ops, (X,)),
    (c_tuple_item_assign, (X,)), (c_nested_structure, (X,)), (c_list_of_dicts_arg, (X, [{"a": 1}, {}])),
    (c_dict_of_lists_arg, (X, {"a": [], "b": [1]})),
    (k_list_append_while_iterating, (X,)), (k_arg_list_append_while_iterating, (X, [1, 2])),
    (k_list_remove_while_iterating, (X,)), (k_list_iterator_sees_append, (X,)), (k_dict_changed_size, (X,)),
    (k_dict_changed_size_caught, (X,)), (k_set_changed_size, (X,)), (k_dict_overwrite_while_iterating, (X,)),
    (k_dict_keys_view_live, (X,)), (k_dict_view_set_ops, (X, {"a": 1, "b": 2})),
    (k_defaultdict_read_creates, (X, collections.defaultdict(list))),
    (k_defaultdict_get_no_create, (X, collections.defaultdict(list))),
    (k_defaultdict_in_no_create, (X, collections.defaultdict(list))), (k_aliasing_list_mul, (X,)),
    (k_aliasing_arg_twice, (X, [])), (k_list_extend_self, (X, [1, 2])), (k_list_insert_slice, (X, [1, 2, 3])),
    (k_list_reverse_slice_assign, (X, [1, 2, 3])), (k_list_sort_stable, (X,)),
    (k_list_sort_tensor_error, (X,)), (k_list_index_start, (X, [1, 0, 1, 1])), (k_list_negative_repeat, (X,)),
    (k_heapq, (X, [3, 5])), (k_bisect, (X, [1, 4])), (k_copy_module, (X, {"l": []})), (k_chainmap, (X,)),
    (k_dict_tensor_keys, (X,)), (k_ordereddict_eq, (X,)), (k_dict_reinsert_order, (X, {"a": 1, "b": 2})),
    (k_dict_kwargs_ctor, (X,)), (k_counter_extras, (X,)), (k_deque_extras, (X, collections.deque([1, 2, 3]))),
    (k_deque_maxlen_extendleft, (X,)), (k_frozenset_dict_key, (X,)), (k_nested_comprehension_shadow, (X,)),
    (k_set_of_tuples, (X,)), (k_tuple_compare_mixed_error, (X,)), (k_list_of_lists_sort, (X,)),
    (k_unhashable_key_error, (X,)), (k_dict_get_mutable_default, (X, {})),
    (k_exhausted_iterator_stays_exhausted, (X,)), (k_reversed_iterator_ignores_append, (X,)),
    (k_list_pop_front_while_iterating, (X,)), (k_dict_keys_changed_same_size, (X,)),
    (k_dict_items_mutation_error, (X,)), (k_deque_mutated_during_iteration, (X,)),
    (k_set_discard_during_iteration, (X,)), (k_dict_subclass_missing, (X,)), (k_list_subclass_append, (X,)),
    (k_defaultdict_factory_none, (X,)), (k_defaultdict_lambda_copy, (X,)), (k_counter_from_mapping_ops, (X,)),
    (k_counter_fromkeys_error, (X,)), (k_ordereddict_move_first_reversed, (X,)),
    (k_list_iterate_arg_then_extend, (X, [1, 2])), (k_nested_list_mutation_in_loop, (X,)),
    (k_dict_setdefault_while_iterating_list, (X,)),
]

KNOWN: dict[str, str] = {
}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_containers(fn, args, options):
    run_program(fn, args, **options)
