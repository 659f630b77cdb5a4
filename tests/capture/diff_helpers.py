"""Differential testing of capture: run a small program by plain Python and by kiln.compile(backend="eager")
on deep copies of the same arguments and compare what can be observed afterwards.

- the return value (tensors with torch.testing.assert_close; containers, user objects, modules, iterators
  and generators element by element),
- the arguments after the call (mutated lists, dicts, objects, tensors; iterators and generators passed in
  must be consumed exactly as far as eager consumed them: the rest of each is drained and compared),
- module globals a program writes (named in `globals_`), restored before each run,
- when eager raises: the compiled call raises an exception of the same type (the state is still compared),
- kiln's own errors: an exception from inside kiln, or an internal capture error kiln swallowed to run the
  frame eagerly (counters["capture_errors"]), fails the program.

Each program is called twice with the same compiled function (the second call runs from the cache).

A table is a list of `(fn, args)` or `(fn, args, options)`: `args` is a tuple (deep-copied for each run) or
a zero-argument callable making a fresh tuple (for arguments deepcopy can't copy, like generators);
options: `kwargs`, `globals_` (names in fn's globals to restore and compare), `graphs` (exact number of
graphs with ops, for pure tensor math only), `calls`.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import itertools
import math
import os
import traceback
import types
from typing import Any, Callable

import pytest
import torch
from capture_helpers import all_entries

import kiln
from kiln.counters import counters

DRAIN = 50          # items drained from an iterator to compare what is left of it
MISSING = object()


class Mismatch(AssertionError):
    pass


def _fail(path: str, message: str) -> None:
    raise Mismatch(f"at {path or '<value>'}: {message}")


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _same_type(actual: Any, expected: Any, path: str) -> None:
    ta, te = type(actual), type(expected)
    # classes created inside a program are distinct objects in the eager and the compiled run
    if ta is not te and _type_name(ta) != _type_name(te):
        _fail(path, f"type {_type_name(ta)} != {_type_name(te)}")


def _is_iterator(value: Any) -> bool:
    return isinstance(value, (types.GeneratorType, collections.abc.Iterator)) and \
        not isinstance(value, (str, bytes, torch.Tensor))


def same(actual: Any, expected: Any, path: str = "", _seen: set | None = None) -> None:
    """Raise Mismatch (naming the path) unless `actual` (compiled run) equals `expected` (eager run)."""
    seen = set() if _seen is None else _seen
    key = (id(actual), id(expected))
    if key in seen:
        return
    seen.add(key)
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            _fail(path, f"expected a tensor, got {type(actual).__name__}: {actual!r:.80}")
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            _fail(path, f"tensor {tuple(actual.shape)} {actual.dtype} != "
                        f"{tuple(expected.shape)} {expected.dtype}")
        if actual.requires_grad != expected.requires_grad:
            _fail(path, f"requires_grad {actual.requires_grad} != {expected.requires_grad}")
        if actual.stride() != expected.stride() and expected.numel() > 1:
            _fail(path, f"stride {actual.stride()} != {expected.stride()}")
        if actual.is_leaf != expected.is_leaf:
            _fail(path, f"is_leaf {actual.is_leaf} != {expected.is_leaf}")
        if expected.is_leaf and (actual.grad is None) != (expected.grad is None):
            _fail(path, f".grad {'None' if actual.grad is None else 'set'} != "
                        f"{'None' if expected.grad is None else 'set'}")
        if expected.is_leaf and expected.grad is not None:
            same(actual.grad, expected.grad, path + ".grad", seen)
        try:
            torch.testing.assert_close(actual.detach(), expected.detach(), rtol=1e-5, atol=1e-6,
                                       equal_nan=True)
        except AssertionError as e:
            _fail(path, f"tensor values differ: {e}")
        return
    if isinstance(expected, torch.nn.Module):
        _same_type(actual, expected, path)
        if actual.training != expected.training:
            _fail(path, f"training {actual.training} != {expected.training}")
        same(dict(actual.state_dict(keep_vars=True)), dict(expected.state_dict(keep_vars=True)),
             path + ".state_dict()", seen)
        same(sorted(vars(actual).keys()), sorted(vars(expected).keys()), path + ".__dict__", seen)
        return
    if isinstance(expected, BaseException):
        _same_type(actual, expected, path)
        same(actual.args, expected.args, path + ".args", seen)
        return
    if isinstance(expected, (list, tuple)):
        _same_type(actual, expected, path)
        if len(actual) != len(expected):
            _fail(path, f"length {len(actual)} != {len(expected)}: {actual!r:.120} != {expected!r:.120}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            same(a, e, f"{path}[{i}]", seen)
        return
    if isinstance(expected, collections.deque):
        _same_type(actual, expected, path)
        if actual.maxlen != expected.maxlen:
            _fail(path, f"maxlen {actual.maxlen} != {expected.maxlen}")
        same(list(actual), list(expected), path, seen)
        return
    if isinstance(expected, dict):
        _same_type(actual, expected, path)
        if list(actual.keys()) != list(expected.keys()):
            _fail(path, f"keys {list(actual.keys())!r:.160} != {list(expected.keys())!r:.160}")
        if isinstance(expected, collections.defaultdict) and \
                actual.default_factory != expected.default_factory:
            _fail(path, f"default_factory {actual.default_factory} != {expected.default_factory}")
        for k in expected:
            same(actual[k], expected[k], f"{path}[{k!r}]", seen)
        return
    if isinstance(expected, (set, frozenset)):
        _same_type(actual, expected, path)
        if actual != expected:
            _fail(path, f"{actual!r:.160} != {expected!r:.160}")
        return
    if isinstance(expected, float) and not isinstance(expected, bool):
        if not isinstance(actual, (float, int)) or isinstance(actual, bool):
            _fail(path, f"expected a float, got {type(actual).__name__}: {actual!r:.80}")
        if not (math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-9) or
                (math.isnan(actual) and math.isnan(expected))):
            _fail(path, f"{actual!r} != {expected!r}")
        if type(actual) is not type(expected):
            _fail(path, f"type {type(actual).__name__} != {type(expected).__name__}")
        return
    if isinstance(expected, (bool, int, str, bytes, complex, type(None))):
        if type(actual) is not type(expected) or actual != expected:
            _fail(path, f"{actual!r:.120} ({type(actual).__name__}) != {expected!r:.120} "
                        f"({type(expected).__name__})")
        return
    if isinstance(expected, (torch.dtype, torch.device, torch.Size, range, slice, type)):
        if actual != expected and not (isinstance(expected, type) and isinstance(actual, type) and
                                       _type_name(actual) == _type_name(expected)):
            _fail(path, f"{actual!r:.120} != {expected!r:.120}")
        return
    if _is_iterator(expected):
        if not _is_iterator(actual):
            _fail(path, f"expected an iterator, got {type(actual).__name__}")
        same(_drain(actual, path), _drain(expected, path), path + " (rest of the iterator)", seen)
        return
    if isinstance(expected, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                             types.ModuleType, functools.partial)):
        if actual is expected:
            return
        name = lambda f: getattr(getattr(f, "func", f), "__qualname__", MISSING)  # noqa: E731
        if name(actual) != name(expected):
            _fail(path, f"callable {actual!r:.80} != {expected!r:.80}")
        return
    if dataclasses.is_dataclass(expected) or hasattr(expected, "__dict__"):
        _same_type(actual, expected, path)
        same(dict(vars(actual)), dict(vars(expected)), path + ".__dict__", seen)
        return
    if actual is not expected and actual != expected:
        _fail(path, f"{actual!r:.120} != {expected!r:.120}")


def _drain(it: Any, path: str) -> list:
    out = []
    try:
        for item in itertools.islice(it, DRAIN):
            out.append(("value", item))
    except Exception as e:  # the rest of an iterator may raise: compare the type
        out.append(("raised", type(e).__name__))
    return out


def _objects(value: Any, path: str = "", out: dict | None = None) -> dict:
    """id -> (path, object) of the mutable objects reachable through lists, tuples and dicts."""
    out = {} if out is None else out
    if isinstance(value, (torch.Tensor, list, dict, set, collections.deque)) or (
            hasattr(value, "__dict__") and not isinstance(value, (type, types.FunctionType,
                                                                  types.ModuleType))):
        out.setdefault(id(value), (path, value))
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _objects(v, f"{path}[{i}]", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _objects(v, f"{path}[{k!r}]", out)
    return out


def _walk(value: Any, path: str) -> Any:
    for part in path.strip("[]").split("]["):
        if part:
            value = value[eval(part)]  # noqa: S307 - paths made by _objects: ints and reprs of keys
    return value


def same_aliasing(actual: Any, expected: Any, compiled_args: Any, eager_args: Any, where: str) -> None:
    """An object eager returns that is (reachable from) an argument must be the same compiled argument."""
    args_by_id = _objects(eager_args)
    for path, obj in _objects(expected).values():
        if id(obj) in args_by_id:
            arg_path = args_by_id[id(obj)][0]
            try:
                got = _walk(actual, path)
            except Exception:
                continue  # a different structure is reported by same()
            if got is not _walk(compiled_args, arg_path):
                raise Mismatch(f"{where}: return{path} is the argument {arg_path} in eager, "
                               f"a different object compiled")


def _tensors(value: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    return [(prefix + path, obj) for path, obj in _objects(value).values() if isinstance(obj, torch.Tensor)]


def _sharing(returned: Any, args: Any) -> set[tuple[str, str]]:
    """Pairs (returned tensor, argument or other returned tensor) that share storage: views stay views."""
    rets, others = _tensors(returned, "return"), _tensors(returned, "return") + _tensors(args, "args")
    pairs = set()
    for rp, r in rets:
        for op, o in others:
            if (op.startswith("args") or rp < op) and r.numel() and o.numel() and \
                    r.untyped_storage().data_ptr() == o.untyped_storage().data_ptr():
                pairs.add((rp, op))
    return pairs


def same_storage_sharing(actual: Any, expected: Any, compiled_args: Any, eager_args: Any, where: str) -> None:
    got, want = _sharing(actual, compiled_args), _sharing(expected, eager_args)
    if got != want:
        raise Mismatch(f"{where}: storage shared in eager only: {sorted(want - got)}; "
                       f"in compiled only: {sorted(got - want)}")


def _world() -> dict:
    """Process state a program may change: grad mode, default dtype, the RNG."""
    return {"grad_enabled": torch.is_grad_enabled(), "default_dtype": torch.get_default_dtype(),
            "rng_state": torch.random.get_rng_state()}


def _reset_world() -> None:
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)


def _call(fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, BaseException | None, str]:
    torch.manual_seed(0)
    try:
        return fn(*args, **kwargs), None, ""
    except Exception as e:
        return None, e, traceback.format_exc()


def _fresh(args: Any, kwargs: dict) -> tuple[tuple, dict]:
    if callable(args):
        return args(), copy.deepcopy(kwargs)
    return copy.deepcopy((args, kwargs))


def _capture_errors() -> collections.Counter:
    return collections.Counter(counters["capture_errors"])


def run_program(fn: Callable, args: Any = (), kwargs: dict | None = None, globals_: tuple = (),
                graphs: int | None = None, calls: int = 2) -> Any:
    """fn compiled with kiln (backend="eager") behaves like fn run by Python, `calls` times."""
    kwargs = dict(kwargs or {})
    g = fn.__globals__
    initial = {name: copy.deepcopy(g[name]) for name in globals_}
    kiln.reset()
    errors_before = _capture_errors()
    compiled = kiln.compile(fn, backend="eager")
    for call in range(calls):
        where = f"call {call + 1}"
        for name in globals_:
            g[name] = copy.deepcopy(initial[name])
        eager_args = _fresh(args, kwargs)
        _reset_world()
        expected, expected_exc, _ = _call(fn, *eager_args)
        eager_world = _world()
        _reset_world()
        eager_globals = {name: g.get(name, MISSING) for name in globals_}
        for name in globals_:
            g[name] = copy.deepcopy(initial[name])
        compiled_args = _fresh(args, kwargs)
        actual, actual_exc, actual_tb = _call(compiled, *compiled_args)
        compiled_world = _world()
        _reset_world()
        compiled_globals = {name: g.get(name, MISSING) for name in globals_}
        new_errors = _capture_errors() - errors_before
        if new_errors:
            raise Mismatch(f"{where}: kiln internal capture error (ran eagerly): {dict(new_errors)}")
        if expected_exc is not None:
            if actual_exc is None:
                raise Mismatch(f"{where}: eager raised {type(expected_exc).__name__}: {expected_exc}; "
                               f"compiled returned {actual!r:.120}")
            if type(actual_exc) is not type(expected_exc):
                raise Mismatch(f"{where}: eager raised {type(expected_exc).__name__}: {expected_exc}; "
                               f"compiled raised {type(actual_exc).__name__}: {actual_exc}\n{actual_tb}")
        elif actual_exc is not None:
            raise Mismatch(f"{where}: compiled raised {type(actual_exc).__name__}: {actual_exc} "
                           f"(eager returned {expected!r:.80})\n{actual_tb}")
        else:
            same(actual, expected, f"{where}: return")
            same_aliasing(actual, expected, compiled_args, eager_args, where)
            same_storage_sharing(actual, expected, compiled_args, eager_args, where)
        same(compiled_args, eager_args, f"{where}: arguments after the call")
        same(compiled_globals, eager_globals, f"{where}: globals after the call")
        same(compiled_world, eager_world, f"{where}: process state after the call")
    for name in globals_:
        g[name] = copy.deepcopy(initial[name])
    if graphs is not None:
        got = sum(1 for e in all_entries(compiled) if e.graph is not None and e.ops)
        assert got == graphs, f"expected {graphs} graphs, got {got}: {[e.brk for e in all_entries(compiled)]}"
    return compiled


def params(table: list, known: dict[str, str]) -> list:
    """pytest params, one per program (id: the function's name); ids in `known` are strict xfails
    (DIFF_IGNORE_KNOWN=1 in the environment runs them as plain tests, to see which pass now)."""
    out, ids = [], set()
    ignore_known = os.environ.get("DIFF_IGNORE_KNOWN") == "1"
    for entry in table:
        fn, args = entry[0], entry[1]
        options = entry[2] if len(entry) > 2 else {}
        name = fn.__name__
        assert name not in ids, f"duplicate program {name}"
        ids.add(name)
        marks = [pytest.mark.xfail(strict=True, reason=known[name])] if name in known and not ignore_known \
            else []
        out.append(pytest.param(fn, args, options, id=name, marks=marks))
    stale = set(known) - ids
    assert not stale, f"KNOWN names programs not in the table: {sorted(stale)}"
    return out


def autograd_signature(r: Any, layout: bool = False) -> Any:
    """What a result says beyond its values: dtype, shape, requires_grad, is_leaf, whether it has a grad_fn
    (layout: strides and inference-ness too); an exception as its type."""
    if isinstance(r, BaseException):
        return ("raise", type(r).__name__)
    if isinstance(r, torch.Tensor):
        extra = (r.stride(), r.is_inference()) if layout else ()
        return ("T", r.dtype, tuple(r.shape), r.requires_grad, r.is_leaf, r.grad_fn is not None, *extra)
    if isinstance(r, (tuple, list)):
        return tuple(autograd_signature(v, layout) for v in r)
    return ("v", r)


def tensor_values(r: Any) -> list:
    """The tensors of a result (nested tuples and lists), detached, in order."""
    if isinstance(r, torch.Tensor):
        return [r.detach()]
    if isinstance(r, (tuple, list)):
        return [v for x in r for v in tensor_values(x)]
    return []
