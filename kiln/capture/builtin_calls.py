"""Builtins on symbolic values: isinstance, type, len, getattr/hasattr/setattr, iter/next, min/max/sum/
sorted (key functions traced), any/all, callable, functools.reduce, sys.exc_info, torch.is_tensor."""
from __future__ import annotations

import builtins
import functools
import sys
import types
from typing import Any, Callable

import torch

from ..graph.symbolic import MIN_SIZE, SymInt
from ..graph import Proxy
from .errors import HINTS, GraphBreak, RaisedError
from .frame import NATIVE_OPERAND_TYPES, Frame
from .iterators import SymIter, _STOP, stop_iteration
from .sources import Source
from .values import NativeCall, NoAttribute, class_lookup

_BUILTIN_TYPES = (type(len), type([].append), type(str.join), type(object.__init__), type((1).__add__),
                  type(dict.fromkeys))


def _isinstance(frame: Frame, args: list, kwargs: dict) -> bool:
    obj, classinfo = args
    try:
        if isinstance(obj, Proxy):
            isinstance(None, classinfo)  # eager's TypeError for a bad classinfo
            cls = torch.nn.Parameter if id(obj) in frame.cap.param_proxies else torch.Tensor
            return issubclass(cls, classinfo)
        if isinstance(obj, SymInt):  # a symbolic size is an int to the program
            return isinstance(MIN_SIZE, classinfo)
        return isinstance(obj, classinfo)
    except TypeError as e:
        raise RaisedError(e, "isinstance()") from None


def _type(frame: Frame, args: list, kwargs: dict) -> Any:
    if len(args) != 1:
        raise GraphBreak("type() with three arguments")
    obj = args[0]
    if isinstance(obj, Proxy):
        return torch.nn.Parameter if id(obj) in frame.cap.param_proxies else torch.Tensor
    if isinstance(obj, SymInt):
        return int
    cls = type(obj)
    src = frame.cap.source_of(obj)
    if src is not None and frame.cap.source_of(cls) is None and cls.__module__ != "builtins":
        # the class gets a source, so reads and writes of its attributes are guarded and replayed
        return frame.cap.wrap(cls, Source(f"type({src.expr})", f"type({src.name})", src, "attr"))
    return cls


def _len(frame: Frame, args: list, kwargs: dict) -> int:
    (obj,) = args
    if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict,
                        torch.nn.ParameterList, torch.nn.ParameterDict)):
        return len(frame.iterate(obj))
    method = class_lookup(type(obj), "__len__")
    if isinstance(method, types.FunctionType) and not isinstance(obj, Proxy):
        n = frame.call(method, [obj], {})
        if isinstance(n, Proxy) or not isinstance(n, int):
            raise RaisedError(TypeError(f"'{type(n).__name__}' object cannot be interpreted as an integer"),
                              "len()")
        if n < 0:
            raise RaisedError(ValueError("__len__() should return >= 0"), "len()")
        return int(n)
    if isinstance(obj, Proxy) or isinstance(obj, NATIVE_OPERAND_TYPES) or frame.cap.is_local(obj) or \
            id(obj) in frame.cap.mirrors:
        return frame.native(len, [obj], {}, "len")
    raise GraphBreak(f"len() of a {type(obj).__name__}")


def _getattr(frame: Frame, args: list, kwargs: dict) -> Any:
    obj, name = args[0], args[1]
    if not isinstance(name, str):
        raise GraphBreak("getattr with a non-constant name")
    try:
        return frame.load_attr(obj, name)
    except NoAttribute:
        if len(args) > 2:
            return args[2]
        raise


def _hasattr(frame: Frame, args: list, kwargs: dict) -> bool:
    obj, name = args
    try:
        frame.load_attr(obj, name)
        return True
    except NoAttribute:
        src = frame.cap.source_of(obj)
        if src is not None:
            frame.cap.guards.add(f"not hasattr({src.expr}, {name!r})",
                                 f"{src.name} has no attribute {name!r}", "attr")
        return False


def _setattr(frame: Frame, args: list, kwargs: dict) -> None:
    frame.store_attr(args[0], args[1], args[2])


def _delattr(frame: Frame, args: list, kwargs: dict) -> None:
    obj, name = args
    method = class_lookup(type(obj), "__delattr__")
    if isinstance(method, types.FunctionType):
        frame.call(method, [obj, name], {})
        return None
    if not frame.cap.is_local(obj):
        raise GraphBreak(f"deleting attribute {name!r} of a {type(obj).__name__} made outside compiled code")
    try:
        object.__delattr__(obj, name)
    except (AttributeError, TypeError) as e:
        raise RaisedError(e, f"delattr({name!r})") from None
    return None


def _iter(frame: Frame, args: list, kwargs: dict) -> Any:
    if len(args) != 1:
        raise GraphBreak("iter() with a sentinel")
    return frame.get_iterator(args[0])


def _next(frame: Frame, args: list, kwargs: dict) -> Any:
    it = args[0]
    if not isinstance(it, SymIter):
        if not hasattr(type(it), "__next__") or isinstance(it, (type, Proxy)):
            raise RaisedError(TypeError(f"'{type(it).__name__}' object is not an iterator"), "next()")
        it = frame.user_iterator(it)  # a user iterator, one a native call made here, or a break
    item = it.advance(frame)
    if item is _STOP:
        if len(args) > 1:
            return args[1]
        raise stop_iteration(getattr(it, "returned", None))
    return item


def sort_items(frame: Frame, items: list, key: Any, reverse: Any) -> list:
    """sorted(items, key=key, reverse=reverse) with the key function traced like any call."""
    if key is None:
        return frame.native(sorted, [items], {"reverse": reverse}, "sorted")
    keys = [frame.call(key, [item], {}) for item in items]
    order = frame.native(sorted, [list(range(len(items)))], {"key": keys.__getitem__, "reverse": reverse},
                         "sorted")
    return [items[i] for i in order]


def _reducer(fn: Any) -> Callable[..., Any]:
    def handle(frame: Frame, args: list, kwargs: dict) -> Any:
        if len(args) == 1:
            args = [frame.iterate(args[0])]
        key = kwargs.get("key")
        if fn is sorted:
            if len(args) != 1 or set(kwargs) - {"key", "reverse"}:
                raise GraphBreak("sorted() with unexpected arguments")
            return frame.cap.new_local(sort_items(frame, list(args[0]), key, kwargs.get("reverse", False)))
        if key is not None and fn in (min, max) and len(args) == 1:
            items = list(args[0])
            if not items:
                if "default" in kwargs:
                    return kwargs["default"]
                raise RaisedError(ValueError(f"{fn.__name__}() iterable argument is empty"), fn.__name__)
            keys = [frame.call(key, [item], {}) for item in items]
            best = frame.native(fn, [list(range(len(items)))], {"key": keys.__getitem__}, fn.__name__)
            return items[best]
        if key is not None and not isinstance(key, _BUILTIN_TYPES):
            raise GraphBreak(f"{fn.__name__}() with a Python key function")
        return frame.native(fn, args, kwargs, fn.__name__)
    return handle


def _reduce(frame: Frame, args: list, kwargs: dict) -> Any:
    """functools.reduce with the function traced."""
    if kwargs or len(args) not in (2, 3):
        raise GraphBreak("functools.reduce with unexpected arguments")
    it = frame.get_iterator(args[1])
    if len(args) == 3:
        acc = args[2]
    else:
        acc = it.advance(frame)
        if acc is _STOP:
            raise RaisedError(TypeError("reduce() of empty iterable with no initial value"), "reduce")
    while True:
        item = it.advance(frame)
        if item is _STOP:
            return acc
        acc = frame.call(args[0], [acc, item], {})


def _truth_reducer(want: bool) -> Callable[..., Any]:
    def handle(frame: Frame, args: list, kwargs: dict) -> bool:
        for item in frame.iterate(args[0]):
            if frame.truth(item) == want:
                return want
        return not want
    return handle


def _callable(frame: Frame, args: list, kwargs: dict) -> bool:
    obj = args[0]
    return isinstance(obj, NativeCall) or (not isinstance(obj, Proxy) and callable(obj))


_COPIED_TYPES = (tuple, list, dict, set, frozenset, str, bytes, int, float, complex, bool)


def _same_object_when_traced(obj: Any) -> bool:
    """Whether the traced value is the user's object itself: functions, classes, modules and instances of
    user classes are; containers are traced as copies (a global tuple read twice is two tuples), numbers
    and strings as constants, tensors as proxies."""
    if isinstance(obj, (Proxy, SymInt, NativeCall)) or isinstance(obj, _COPIED_TYPES):
        return False
    return True


def _id(frame: Frame, args: list, kwargs: dict) -> Any:
    """id() of an object that came from outside (a global, a closure, an attribute: it has a source) and is
    traced as itself (`_same_object_when_traced`) is a constant once the entry is guarded to see that very
    object: the guard keeps it alive, so no other object
    can take its id. An object made during the call has a new id on every call, a container is traced as a
    copy, and a tensor's id is never known while tracing: those break."""
    if len(args) != 1 or kwargs:
        raise GraphBreak("id() with other than one argument", HINTS["call"])
    obj = args[0]
    origin = frame.cap.tuple_origins.get(id(obj))
    if origin is not None and origin[0] is obj:  # an outside tuple, traced as a copy: the outside one's id
        _, src, outside = origin
        frame.cap.guards.identity(src, outside)
        return id(outside)
    src = frame.cap.source_of(obj) if _same_object_when_traced(obj) else None
    if src is None:
        raise GraphBreak("id() of an object made in the compiled call (or a tensor) depends on object identity",
                         HINTS["call"])
    frame.cap.guards.identity(src, obj)
    return id(obj)


def _object_new(frame: Frame, args: list, kwargs: dict) -> Any:
    """object.__new__(cls, ...) (a user __new__'s `super().__new__(cls)`): a new empty instance, local to
    the capture. Nothing of the arguments but their number is used (object's argument check)."""
    if not args or not isinstance(args[0], type) or issubclass(args[0], (torch.Tensor, torch.nn.Module)):
        raise GraphBreak("object.__new__ of something other than a plain class", HINTS["call"])
    try:
        obj = object.__new__(args[0], *[None] * (len(args) - 1), **dict.fromkeys(kwargs))
    except TypeError as e:
        raise RaisedError(e, "object.__new__()") from None
    return frame.cap.new_local(obj)


_BUILTIN_HANDLERS: dict[Any, Callable[..., Any]] = {
    object.__new__: _object_new,
    builtins.isinstance: _isinstance,
    builtins.len: _len,
    builtins.getattr: _getattr,
    builtins.hasattr: _hasattr,
    builtins.setattr: _setattr,
    builtins.delattr: _delattr,
    builtins.iter: _iter,
    builtins.next: _next,
    builtins.min: _reducer(min),
    builtins.max: _reducer(max),
    builtins.sum: _reducer(sum),
    builtins.sorted: _reducer(sorted),
    builtins.any: _truth_reducer(True),
    builtins.all: _truth_reducer(False),
    builtins.callable: _callable,
    builtins.id: _id,
}


def _issubclass(frame: Frame, args: list, kwargs: dict) -> bool:
    return issubclass(args[0], args[1])


_BUILTIN_HANDLERS[builtins.issubclass] = _issubclass


def _exc_info(frame: Frame, args: list, kwargs: dict) -> Any:
    exc = frame.current_handled()
    return (None, None, None) if exc is None else (type(exc), exc, getattr(exc, "__traceback__", None))


def _exception(frame: Frame, args: list, kwargs: dict) -> Any:
    return frame.current_handled()


_BUILTIN_HANDLERS[sys.exc_info] = _exc_info
if hasattr(sys, "exception"):
    _BUILTIN_HANDLERS[sys.exception] = _exception
_BUILTIN_HANDLERS[functools.reduce] = _reduce


# how each builtin above may be called: (fewest positional arguments, most, keywords it takes); a call outside
# that raises eager's TypeError (the handlers read only what a valid call passes)
_NO_KEYWORDS: frozenset[str] = frozenset()
_ARITY: dict[Any, tuple[int, float, frozenset[str]]] = {
    builtins.isinstance: (2, 2, _NO_KEYWORDS), builtins.issubclass: (2, 2, _NO_KEYWORDS),
    builtins.len: (1, 1, _NO_KEYWORDS), builtins.getattr: (2, 3, _NO_KEYWORDS),
    builtins.hasattr: (2, 2, _NO_KEYWORDS), builtins.setattr: (3, 3, _NO_KEYWORDS),
    builtins.delattr: (2, 2, _NO_KEYWORDS), builtins.iter: (1, 2, _NO_KEYWORDS),
    builtins.next: (1, 2, _NO_KEYWORDS), builtins.min: (1, float("inf"), frozenset({"key", "default"})),
    builtins.max: (1, float("inf"), frozenset({"key", "default"})),
    builtins.sum: (1, 2, frozenset({"start"})), builtins.sorted: (1, 1, frozenset({"key", "reverse"})),
    builtins.any: (1, 1, _NO_KEYWORDS), builtins.all: (1, 1, _NO_KEYWORDS),
    builtins.callable: (1, 1, _NO_KEYWORDS), builtins.id: (1, 1, _NO_KEYWORDS),
    sys.exc_info: (0, 0, _NO_KEYWORDS),
}


def check_arguments(fn: Any, args: list, kwargs: dict) -> None:
    """Raise eager's TypeError for a call of a handled builtin with arguments it does not take
    (`isinstance(x, torch.Tensor, invalid=True)`)."""
    arity = _ARITY.get(fn)
    if arity is None:
        return
    low, high, keywords = arity
    if low <= len(args) <= high and keywords.issuperset(kwargs):
        return
    try:  # placeholders of the same number and names: the builtin's own message for the call's shape
        fn(*[None] * len(args), **dict.fromkeys(kwargs))
    except TypeError as e:
        raise RaisedError(e, f"{getattr(fn, '__name__', 'builtin')}()") from None
    raise GraphBreak(f"call to {getattr(fn, '__name__', 'builtin')}() with these arguments", HINTS["call"])


def _torch_is_tensor(frame: Frame, args: list, kwargs: dict) -> bool:
    return isinstance(args[0], (Proxy, torch.Tensor))


def _torch_grad_enabled(frame: Frame, args: list, kwargs: dict) -> bool:
    return torch.is_grad_enabled()


_BUILTIN_HANDLERS[torch.is_tensor] = _torch_is_tensor
_BUILTIN_HANDLERS[torch.is_grad_enabled] = _torch_grad_enabled


def _autocast_query(fn: Any) -> Callable[..., Any]:
    """torch.is_autocast_enabled(), get_autocast_dtype(), ...: the answer follows from the state at entry
    (and the regions the code entered since), so that whole state is guarded, dtypes of devices it is off
    for included (the first guard covers only what changes results)."""
    def handler(frame: Frame, args: list, kwargs: dict) -> Any:
        cap = frame.cap
        cap.guards.autocast_full(cap.autocast_saved)
        return fn(*args, **kwargs)
    return handler


for _query in ("is_autocast_enabled", "get_autocast_dtype", "is_autocast_cache_enabled",
               "get_autocast_cpu_dtype", "get_autocast_gpu_dtype", "is_autocast_cpu_enabled"):
    if hasattr(torch, _query):
        _BUILTIN_HANDLERS[getattr(torch, _query)] = _autocast_query(getattr(torch, _query))

def _compiling(frame: Frame, args: list, kwargs: dict) -> bool:
    return True  # libraries take their trace-friendly paths under a graph compiler, as under Dynamo


_SPECIAL_FUNCTIONS: dict[Any, Callable[..., Any]] = {torch.is_tensor: _torch_is_tensor}
for _name_ in ("is_compiling", "is_dynamo_compiling"):
    if hasattr(torch.compiler, _name_):
        _SPECIAL_FUNCTIONS[getattr(torch.compiler, _name_)] = _compiling
