"""Generators and iterators as symbolic values.

A generator function called in compiled code does not run: it becomes a `GeneratorValue` holding a
suspended interpreter frame, advanced one `yield` at a time by whoever consumes it (`for`, `next`, `send`,
`yield from`, `list(...)`). The builtin iterators over symbolic values (`iter(list)`, `enumerate`, `zip`,
`map`, `filter`, `reversed`, `itertools.islice/chain/count/repeat`) are lazy too, so a consumer and a
producer interleave exactly as they do eagerly: a generator's side effects happen between the loop bodies
that consume it, and an infinite generator is consumed only as far as the program asks.

Nothing here advances a real iterator: an iterator that came from outside the compiled code (a generator
passed in as an argument) is never advanced while tracing; reading it is a graph break
(`OutsideIterator`), and the instruction runs natively on the real object.
"""
from __future__ import annotations

import itertools
import types
from typing import Any

import torch

from .errors import GraphBreak, RaisedError

_STOP = object()


class OutsideIterator(GraphBreak):
    """Advancing an iterator kiln did not create (its state lives outside the capture)."""


def stop_iteration(value: Any = None) -> RaisedError:
    exc = StopIteration() if value is None else StopIteration(value)
    return RaisedError(exc, "the iterator is exhausted (StopIteration)")


class Suspend(Exception):
    """A generator's frame yielded `value` (and stays suspended after the YIELD_VALUE)."""

    def __init__(self, value: Any):
        self.value = value


class SymIter:
    """An iterator made inside compiled code. `advance(frame)` returns the next item or `_STOP`."""

    def advance(self, frame: Any) -> Any:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def rebuild(self, rec: Any) -> str:
        """Python source that recreates this iterator in its current state after a graph break."""
        raise GraphBreak(f"a live {self.describe()} crosses a graph break (kiln cannot rebuild it)")

    def describe(self) -> str:
        return type(self).__name__

    # the iterator a `for` loop made over a module container or a tuple (frame.op_GET_ITER), which nothing
    # but the loop holds: a break in the loop can pass on what it has left (stitch._loop_iterators)
    loop_owned = False
    container: Any = None  # the container it iterates (its items re-read after a break, if a module's)

    def remaining(self) -> list | None:
        """The items this iterator has left, where they are fixed now (a list's items may change while a
        loop over it runs: not those), without advancing it; None where they are not known."""
        return None


class ListIter(SymIter):
    """`iter()` of a list of symbolic values (lists, tuples, dict keys, ranges...)."""

    def __init__(self, items: list, kind: str = "list_iterator"):
        self.items = items
        self.pos = 0
        self.kind = kind

    def advance(self, frame: Any) -> Any:
        if self.pos >= len(self.items):
            return _STOP
        self.pos += 1
        return self.items[self.pos - 1]

    def rebuild(self, rec: Any) -> str:
        return f"iter({rec.value(self.remaining())})"

    def remaining(self) -> list | None:
        return list(self.items[self.pos:])

    def describe(self) -> str:
        return self.kind


def iterator_at(items: Any, pos: int) -> Any:
    """iter(items) advanced by `pos` items: a list iterator rebuilt after a graph break."""
    it = iter(items)
    for _ in range(pos):
        next(it)
    return it


class LiveListIter(ListIter):
    """iter() of a list the capture tracks: reads the list as it is at each step, as CPython does, so items
    appended or removed while a loop runs are seen."""

    def advance(self, frame: Any) -> Any:
        if self.pos >= len(self.items):
            self.pos = len(self.items) + 1  # exhausted for good, even if the list grows later
            return _STOP
        self.pos += 1
        return self.items[self.pos - 1]

    def rebuild(self, rec: Any) -> str:
        return f"{rec.cap.ns.hold(iterator_at, 'iterator_at')}({rec.value(self.items)}, {self.pos})"

    def remaining(self) -> list | None:
        return None  # (the live list may grow or shrink after the break)


class DictIter(SymIter):
    """Iteration over a dict, its keys, values or items, read live; a change of size raises eager's
    RuntimeError."""

    def __init__(self, mapping: Any, kind: str):
        self.mapping = mapping
        self.kind = kind
        self.keys = list(mapping)
        self.size = len(self.keys)
        self.pos = 0

    def advance(self, frame: Any) -> Any:
        if len(self.mapping) != self.size:
            self.size = -1
            raise RaisedError(RuntimeError("dictionary changed size during iteration"), "iteration")
        keys = list(self.mapping)
        if keys != self.keys:  # CPython finds a key it did not expect at the iterator's position
            self.size = -1
            raise RaisedError(RuntimeError("dictionary keys changed during iteration"), "iteration")
        if self.pos >= self.size:
            return _STOP
        key = keys[self.pos]
        self.pos += 1
        if self.kind == "values":
            return self.mapping[key]
        if self.kind == "items":
            return (key, self.mapping[key])
        return key


class DequeIter(LiveListIter):
    """iter() of a deque the capture tracks: eager refuses any change of its length while iterating."""

    def __init__(self, items: Any):
        super().__init__(items, "deque iterator")
        self.size = len(items)

    def advance(self, frame: Any) -> Any:
        if len(self.items) != self.size:
            raise RaisedError(RuntimeError("deque mutated during iteration"), "iteration")
        return super().advance(frame)


class GeneratorValue(SymIter):
    """A generator made by calling a generator function inside compiled code: a suspended frame."""

    def __init__(self, frame: Any, fn: Any, args: list, kwargs: dict):
        self.frame = frame
        self.fn = fn
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.started = False
        self.finished = False
        self.running = False

    def describe(self) -> str:
        return f"generator {getattr(self.fn, '__qualname__', '?')}"

    def rebuild(self, rec: Any) -> str:
        if self.started:
            return super().rebuild(rec)
        args = [rec.value(a) for a in self.args]
        args += [f"{k}={rec.value(v)}" for k, v in self.kwargs.items()]
        return f"{rec.value(self.fn)}({', '.join(args)})"

    def advance(self, frame: Any) -> Any:
        return self.resume(None, None)

    def send(self, value: Any) -> Any:
        """gen.send(value): the next yielded value; raises RaisedError(StopIteration) at the end."""
        if not self.started and value is not None and not self.finished:
            raise RaisedError(TypeError("can't send non-None value to a just-started generator"),
                              "send() to a just-started generator")
        item = self.resume(value, None)
        if item is _STOP:
            raise stop_iteration(self.returned)
        return item

    def throw(self, exc: BaseException) -> Any:
        if not self.started or self.finished:
            self.finished = True
            raise RaisedError(exc, f"the code raises {type(exc).__name__}: {exc}")
        item = self.resume(None, exc)
        if item is _STOP:
            raise stop_iteration(self.returned)
        return item

    def close(self) -> None:
        if not self.started or self.finished:
            self.finished = True
            return
        try:
            item = self.resume(None, GeneratorExit())
        except RaisedError as e:
            if isinstance(e.exc, (GeneratorExit, StopIteration)):
                self.finished = True
                return
            raise
        if item is not _STOP:
            self.finished = True
            raise RaisedError(RuntimeError("generator ignored GeneratorExit"), "generator ignored close()")

    returned: Any = None

    def resume(self, value: Any, exc: BaseException | None) -> Any:
        """Run the frame to its next yield (the yielded value) or its return (`_STOP`)."""
        if self.finished:
            return _STOP
        if self.running:
            raise RaisedError(ValueError("generator already executing"), "generator already executing")
        frame = self.frame
        if self.started and exc is None:
            frame.push(value)
        self.started = True
        self.running = True
        try:
            result = frame.run(throw=exc)
        except RaisedError as e:
            self.finished = True
            if isinstance(e.exc, StopIteration):
                error = RuntimeError("generator raised StopIteration")
                error.__cause__ = e.exc
                raise RaisedError(error, "generator raised StopIteration") from None
            raise
        except GraphBreak:
            self.finished = True
            raise
        finally:
            self.running = False
        if isinstance(result, Suspend):
            return result.value
        self.finished = True
        self.returned = result
        return _STOP


class UserIter(SymIter):
    """An object of a user class with a Python `__next__` (its `__iter__` returned itself)."""

    def __init__(self, obj: Any, next_fn: Any):
        self.obj = obj
        self.next_fn = next_fn

    def advance(self, frame: Any) -> Any:
        try:
            return frame.call(self.next_fn, [self.obj], {})
        except RaisedError as e:
            if isinstance(e.exc, StopIteration):
                return _STOP
            raise

    def rebuild(self, rec: Any) -> str:
        return rec.value(self.obj)

    def describe(self) -> str:
        return f"{type(self.obj).__name__} iterator"


class EnumerateIter(SymIter):
    def __init__(self, inner: SymIter, start: Any):
        self.inner = inner
        self.count = start

    def remaining(self) -> list | None:
        rest = self.inner.remaining() if self.inner.loop_owned else None
        if rest is None or not isinstance(self.count, int):
            return None
        return [(self.count + k, item) for k, item in enumerate(rest)]

    def advance(self, frame: Any) -> Any:
        item = self.inner.advance(frame)
        if item is _STOP:
            return _STOP
        self.count += 1
        return (self.count - 1, item)


class ZipIter(SymIter):
    def __init__(self, inners: list[SymIter], strict: bool):
        self.inners = inners
        self.strict = strict

    def advance(self, frame: Any) -> Any:
        if not self.inners:
            return _STOP
        items = []
        for i, inner in enumerate(self.inners):
            item = inner.advance(frame)
            if item is _STOP:
                if self.strict:
                    self._check_strict(frame, i)
                return _STOP
            items.append(item)
        return tuple(items)

    def _check_strict(self, frame: Any, i: int) -> None:
        if i > 0:
            which = "argument 1" if i == 1 else f"arguments 1-{i}"
            raise RaisedError(ValueError(f"zip() argument {i + 1} is shorter than {which}"), "zip(strict)")
        for j, inner in enumerate(self.inners[1:], start=2):
            if inner.advance(frame) is not _STOP:
                which = "argument 1" if j == 2 else f"arguments 1-{j - 1}"
                raise RaisedError(ValueError(f"zip() argument {j} is longer than {which}"), "zip(strict)")


class MapIter(SymIter):
    def __init__(self, fn: Any, inners: list[SymIter]):
        self.fn = fn
        self.inners = inners

    def advance(self, frame: Any) -> Any:
        items = []
        for inner in self.inners:
            item = inner.advance(frame)
            if item is _STOP:
                return _STOP
            items.append(item)
        return frame.call(self.fn, items, {})


class FilterIter(SymIter):
    def __init__(self, fn: Any, inner: SymIter, keep: bool = True):
        self.fn = fn
        self.inner = inner
        self.keep = keep

    def advance(self, frame: Any) -> Any:
        while True:
            item = self.inner.advance(frame)
            if item is _STOP:
                return _STOP
            test = item if self.fn is None else frame.call(self.fn, [item], {})
            if frame.truth(test) == self.keep:
                return item


class ChainIter(SymIter):
    def __init__(self, parts: SymIter):
        self.parts = parts  # an iterator of iterables
        self.current: SymIter | None = None

    def advance(self, frame: Any) -> Any:
        while True:
            if self.current is None:
                part = self.parts.advance(frame)
                if part is _STOP:
                    return _STOP
                self.current = frame.get_iterator(part)
            item = self.current.advance(frame)
            if item is not _STOP:
                return item
            self.current = None


class IsliceIter(SymIter):
    def __init__(self, inner: SymIter, start: int, stop: int | None, step: int):
        self.inner = inner
        self.next_index = start
        self.stop = stop
        self.step = step
        self.pos = 0

    def advance(self, frame: Any) -> Any:
        if self.stop is not None and self.next_index >= self.stop:
            # CPython's islice consumes nothing more once the range is used up
            return _STOP
        while True:
            item = self.inner.advance(frame)
            if item is _STOP:
                self.stop = self.pos  # exhausted: later calls stop without reading
                return _STOP
            self.pos += 1
            if self.pos - 1 == self.next_index:
                self.next_index += self.step
                return item


class CountIter(SymIter):
    def __init__(self, start: Any, step: Any):
        self.value = start
        self.step = step

    def advance(self, frame: Any) -> Any:
        value = self.value
        self.value = value + self.step
        return value

    def rebuild(self, rec: Any) -> str:
        return f"{rec.cap.ns.hold(itertools.count, 'count')}({rec.value(self.value)}, {rec.value(self.step)})"


class RepeatIter(SymIter):
    def __init__(self, value: Any, times: int | None):
        self.value = value
        self.times = times

    def advance(self, frame: Any) -> Any:
        if self.times is not None:
            if self.times <= 0:
                return _STOP
            self.times -= 1
        return self.value


def drain(frame: Any, it: SymIter) -> list:
    """Every remaining item of a symbolic iterator, in order."""
    out = []
    while True:
        item = it.advance(frame)
        if item is _STOP:
            return out
        out.append(item)


MODULE_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)  # what a loop's rest is re-read from


def is_outside_iterator(value: Any) -> bool:
    """A real iterator (it has `__next__`): advancing it while tracing would change the program's state."""
    return not isinstance(value, SymIter) and hasattr(type(value), "__next__") and \
        not isinstance(value, type)


def make_lazy(frame: Any, cls: Any, args: list, kwargs: dict) -> SymIter | None:
    """The symbolic iterator for a call to a lazy builtin iterator constructor, or None if not one."""
    if cls is enumerate:
        if not args:
            return None
        start = args[1] if len(args) > 1 else kwargs.get("start", 0)
        return EnumerateIter(frame.loop_iterator(args[0]), start)
    if cls is zip:
        strict = bool(kwargs.get("strict", False))
        return ZipIter([frame.get_iterator(a) for a in args], strict)
    if cls is map:
        return MapIter(args[0], [frame.get_iterator(a) for a in args[1:]])
    if cls is filter:
        return FilterIter(args[0], frame.get_iterator(args[1]))
    if cls is itertools.filterfalse:
        return FilterIter(args[0], frame.get_iterator(args[1]), keep=False)
    if cls is reversed:
        seq = args[0]
        kind = type(seq)
        if isinstance(seq, SymIter) or not (hasattr(kind, "__reversed__") or (
                hasattr(kind, "__len__") and hasattr(kind, "__getitem__") and not isinstance(seq, dict))):
            name = "generator" if isinstance(seq, GeneratorValue) else kind.__name__
            raise RaisedError(TypeError(f"'{name}' object is not reversible"), "reversed()")
        user_reversed = getattr(kind, "__reversed__", None)
        if isinstance(user_reversed, types.FunctionType):
            return frame.get_iterator(frame.call(user_reversed, [seq], {}))  # a user class's own
        return ListIter(list(reversed(frame.iterate(seq))), "reversed")
    if cls is itertools.chain:
        return ChainIter(ListIter(list(args)))
    if cls is itertools.islice:
        if len(args) == 2:
            start, stop, step = 0, args[1], 1
        else:
            start, stop, step = args[1], args[2], (args[3] if len(args) > 3 else 1)
        start = 0 if start is None else start
        step = 1 if step is None else step
        if not all(isinstance(v, int) for v in (start, step)) or not (stop is None or isinstance(stop, int)):
            return None
        if stop is not None and stop < 0:
            message = "Stop argument for islice() must be None or an integer: 0 <= x <= sys.maxsize."
            raise RaisedError(ValueError(message), "islice()")
        if start < 0 or step <= 0:
            message = "Indices for islice() must be None or an integer: 0 <= x <= sys.maxsize." if start < 0 \
                else "Step for islice() must be a positive integer or None."
            raise RaisedError(ValueError(message), "islice()")
        return IsliceIter(frame.get_iterator(args[0]), start, stop, step)
    if cls is itertools.count:
        start = args[0] if args else kwargs.get("start", 0)
        step = args[1] if len(args) > 1 else kwargs.get("step", 1)
        return CountIter(start, step)
    if cls is itertools.repeat:
        times = args[1] if len(args) > 1 else kwargs.get("times")
        return RepeatIter(args[0], times)
    return None


def chain_from_iterable(frame: Any, args: list, kwargs: dict) -> SymIter:
    return ChainIter(frame.get_iterator(args[0]))


LAZY_TYPES = (enumerate, zip, map, filter, reversed, itertools.chain, itertools.islice, itertools.count,
              itertools.repeat, itertools.filterfalse)
# itertools that read their whole input first (or whose laziness no program here can observe): their
# inputs are drained and the real function runs on the items
EAGER_ITERTOOLS = (itertools.product, itertools.accumulate, itertools.pairwise, itertools.starmap,
                   itertools.zip_longest, itertools.combinations, itertools.permutations,
                   itertools.combinations_with_replacement, itertools.compress, itertools.takewhile,
                   itertools.dropwhile, itertools.cycle)


class NativeIter(SymIter):
    """A real iterator kiln made over symbolic items (`itertools.product` of drained lists): advancing it
    runs no user code."""

    def __init__(self, it: Any, kind: str):
        self.it = it
        self.kind = kind

    def advance(self, frame: Any) -> Any:
        return next(self.it, _STOP)

    def describe(self) -> str:
        return self.kind


def eager_itertool(frame: Any, fn: Any, args: list, kwargs: dict) -> SymIter:
    """An itertools function of EAGER_ITERTOOLS on drained inputs. A Python function argument would run
    natively, outside the trace, so it breaks instead."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (types.FunctionType, types.MethodType)) or (
                callable(a) and not isinstance(a, (types.BuiltinFunctionType, type, SymIter, list, tuple,
                                                   dict, str, range))):
            raise GraphBreak(f"itertools.{fn.__name__} with a Python function argument")

    def items(a: Any) -> Any:
        if isinstance(a, (int, float, type(None))) or (callable(a) and not isinstance(a, SymIter)):
            return a
        return drain(frame, frame.get_iterator(a))
    name = fn.__name__
    if name in ("starmap", "accumulate", "takewhile", "dropwhile"):
        first = args[0] if name != "accumulate" else None
        rest = args[1:] if name != "accumulate" else args
        drained = ([first] if first is not None else []) + [items(a) for a in rest[:1]] + list(rest[1:])
    else:
        drained = [items(a) for a in args]
    return NativeIter(fn(*drained, **kwargs), f"itertools.{name}")
