"""Attribute reads and writes, subscripts, iteration and `with` blocks on symbolic values."""
from __future__ import annotations

import collections
import dis
import types
from typing import Any

import torch

from ..graph import Proxy
from ..graph.symbolic import SymInt, has_symbols, hint_of
from ..ops.aten import OVERLOADS
from .errors import GraphBreak, RaisedError
from .bytecode import PUSHES_NULL_FIRST
from .frame import NATIVE_OPERAND_TYPES, NULL, symbolic_break
from .iterators import MODULE_CONTAINERS, DequeIter, DictIter, GeneratorValue, ListIter, LiveListIter, NativeIter, OutsideIterator, SymIter, UserIter, drain, \
    is_outside_iterator, stop_iteration, _STOP
from .state import MISSING, trusted_module

_NO_TENSOR_ATTRS = {"grad", "grad_fn", "data", "is_leaf", "_version", "storage", "untyped_storage",
                    "data_ptr", "register_hook", "backward", "retain_grad", "_base", "numpy", "tolist",
                    "item", "__array__", "share_memory_", "pin_memory", "record_stream"}
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")
_DICT_VIEWS = {type({}.keys()): "keys", type({}.values()): "values", type({}.items()): "items"}


class NoAttribute(GraphBreak):
    """The attribute does not exist (hasattr/getattr with a default catch this)."""


class MissingAttribute(NoAttribute, RaisedError):
    """An attribute that is missing eagerly too: the AttributeError the program may catch."""


class NativeCall:
    """A callable kiln runs directly on symbolic values (tensor methods of a Proxy). `fn` is None for a
    method that reads the tensor's values (`.item()`): calling it breaks the graph at the call."""

    __slots__ = ("fn", "name", "owner", "attr")

    def __init__(self, fn: Any, name: str, owner: Any = None, attr: str = ""):
        self.fn = fn
        self.name = name
        self.owner = owner
        self.attr = attr

    def __repr__(self) -> str:
        return f"NativeCall({self.name})"


def _bind(static: Any, obj: Any, cls: type) -> Any:
    """A function, staticmethod or classmethod found on obj's class, as `obj.name` gives it (else MISSING)."""
    if isinstance(static, types.FunctionType):
        return types.MethodType(static, obj)
    if isinstance(static, staticmethod):
        return static.__func__
    if isinstance(static, classmethod):
        return types.MethodType(static.__func__, cls)
    return MISSING


def class_lookup(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return MISSING


class ValueOps:
    """Frame mixin: attributes, subscripts, iteration, with-blocks."""

    # ---- attributes ----
    def op_LOAD_ATTR(self, inst: dis.Instruction) -> None:
        self.push(self.load_attr(self.pop(), inst.argval))

    def op_LOAD_METHOD(self, inst: dis.Instruction) -> None:
        obj = self.pop()
        self.push_callable(self.load_attr(obj, inst.argval))

    def push_callable(self, fn: Any) -> None:
        """A callable and its NULL, in the running version's order (CALL accepts either)."""
        if PUSHES_NULL_FIRST:
            self.push(NULL)
            self.push(fn)
        else:
            self.push(fn)
            self.push(NULL)

    def op_LOAD_SUPER_ATTR(self, inst: dis.Instruction) -> None:
        """3.12+: `super().name` / `super(C, self).name` as one instruction over (super, class, self)."""
        obj = self.pop()
        cls = self.pop()
        sup = self.pop()
        bound = self.call(sup, [cls, obj], {})
        value = self.load_attr(bound, inst.argval)
        if inst.arg & 1:
            self.push_callable(value)
        else:
            self.push(value)

    def op_STORE_ATTR(self, inst: dis.Instruction) -> None:
        obj = self.pop()
        value = self.pop()
        self.store_attr(obj, inst.argval, value)

    def load_attr(self, obj: Any, name: str, default_lookup: bool = False) -> Any:
        """obj.name; `default_lookup`: object.__getattribute__'s lookup, bypassing a user override."""
        cap = self.cap
        if isinstance(obj, Proxy):
            return self.proxy_attr(obj, name)
        if isinstance(obj, SymInt):  # an int to the program: its class is int, its methods specialize it
            return int if name == "__class__" else getattr(int(obj), name)
        if isinstance(obj, SymIter):
            return self.iterator_attr(obj, name)
        if isinstance(obj, OVERLOADS):  # torch.ops.aten.add.Tensor: made on first use, kept by the packet
            try:
                return getattr(obj, name)
            except AttributeError as e:
                raise self.missing_attribute(obj, name, e) from None
        if isinstance(obj, (types.ModuleType, type, super)) or obj is NULL:
            written = cap.read_attr_overlay(obj, name)
            if written is not MISSING:
                return written
            if isinstance(obj, type):  # a base class's attribute this capture wrote (`Base.tag = v`)
                for klass in obj.__mro__[1:]:
                    if name in obj.__mro__[0].__dict__:
                        break
                    written = cap.read_attr_overlay(klass, name)
                    if written is not MISSING:
                        return written
                    if name in klass.__dict__:
                        break
            try:
                value = getattr(obj, name)
            except AttributeError as e:
                raise self.missing_attribute(obj, name, e) from None
            src = cap.source_of(obj)
            if isinstance(obj, super) or src is None:
                return value
            if isinstance(obj, types.ModuleType) and trusted_module(obj):
                return value
            if isinstance(obj, type) and obj.__module__.split(".")[0] in ("torch", "builtins"):
                return value
            return cap.wrap(value, src.attr(name))
        written = cap.read_attr_overlay(obj, name)
        if written is not MISSING:
            return written
        cls = type(obj)
        getattribute = class_lookup(cls, "__getattribute__")
        if isinstance(getattribute, types.FunctionType) and not default_lookup:
            try:
                return self.call(getattribute, [obj, name], {})  # (it reaches object's through super())
            except RaisedError as e:
                hook = class_lookup(cls, "__getattr__")
                if isinstance(e.exc, AttributeError) and isinstance(hook, types.FunctionType):
                    return self.call(hook, [obj, name], {})  # CPython falls back to __getattr__
                raise
        static = self.class_attr(cls, name)
        if static is not MISSING and any(cap.read_attr_overlay(k, name) is static for k in cls.__mro__) and \
                name not in (getattr(obj, "__dict__", None) or {}):
            # written by this capture (`Cls.count += 1`, `Cls.method = fn`): the new value, unguarded
            bound = _bind(static, obj, cls)
            return static if bound is MISSING else bound
        if isinstance(static, property):
            if static.fget is None:
                raise NoAttribute(f"property {name!r} of {cls.__name__} has no getter")
            return self.call(static.fget, [obj], {})
        src = cap.source_of(obj)
        if static is not MISSING and hasattr(type(static), "__set__") and not isinstance(static, property):
            getter = class_lookup(type(static), "__get__")
            if isinstance(getter, types.FunctionType):
                return self.call(getter, [static, obj, cls], {})  # a user data descriptor
            try:
                value = static.__get__(obj, cls)
            except AttributeError:
                raise NoAttribute(f"{cls.__name__} has no attribute {name!r}") from None
            if name == "__dict__" and cap.is_local(obj) and isinstance(value, dict):
                return cap.new_local(value)  # a local object's own namespace: writes to it are local
            return cap.wrap(value, src.attr(name)) if src is not None else value
        inst_dict = getattr(obj, "__dict__", None)
        if isinstance(inst_dict, dict) and id(inst_dict) in cap.mirror_of:
            inst_dict = cap.mirror_of[id(inst_dict)]  # obj.__dict__ was read (and maybe written) here
            if name in inst_dict:
                return inst_dict[name]
        if isinstance(inst_dict, dict) and name in inst_dict:
            value = inst_dict[name]
            return cap.wrap(value, src.attr(name)) if src is not None else value
        if static is not MISSING:
            bound = _bind(static, obj, cls)
            if bound is not MISSING:
                return bound
            if hasattr(static, "__get__") and not isinstance(static, type):
                getter = class_lookup(type(static), "__get__")
                if isinstance(getter, types.FunctionType):
                    return self.call(getter, [static, obj, cls], {})  # a user (non-data) descriptor
                return static.__get__(obj, cls)
            return cap.wrap(static, src.attr(name)) if src is not None else static
        if isinstance(obj, torch.nn.Module) and isinstance(inst_dict, dict):
            for dict_name in _MODULE_DICTS:
                entries = inst_dict.get(dict_name, {})
                if name in entries:
                    value = entries[name]
                    if src is None:
                        return value
                    return cap.wrap(value, src.attr(dict_name).item(name))
        getattr_hook = class_lookup(cls, "__getattr__")
        if isinstance(getattr_hook, types.FunctionType) and not isinstance(obj, torch.nn.Module):
            return self.call(getattr_hook, [obj, name], {})
        if class_lookup(cls, "__getattribute__") is object.__getattribute__ and (
                getattr_hook is MISSING or isinstance(obj, torch.nn.Module)):
            error = AttributeError(f"'{cls.__name__}' object has no attribute {name!r}")
            raise self.missing_attribute(obj, name, error)
        raise NoAttribute(f"'{cls.__name__}' object has no attribute {name!r}")

    def class_attr(self, cls: type, name: str) -> Any:
        """class_lookup, seeing the class attributes this capture wrote (`Cls.count += 1`)."""
        for klass in cls.__mro__:
            written = self.cap.read_attr_overlay(klass, name)
            if written is not MISSING:
                return written
            if name in klass.__dict__:
                return klass.__dict__[name]
        return MISSING

    def missing_attribute(self, obj: Any, name: str, error: AttributeError) -> "MissingAttribute":
        """Eager raises AttributeError here too: a user `except AttributeError` may catch it. The absence
        is guarded when the object came from outside."""
        src = self.cap.source_of(obj)
        if src is not None:
            self.cap.guards.add(f"not hasattr({src.expr}, {name!r})", f"{src.name} has no attribute {name!r}",
                                "attr")
        return MissingAttribute(error, str(error))

    def proxy_attr(self, proxy: Proxy, name: str) -> Any:
        if name == "__class__":
            return torch.nn.Parameter if id(proxy) in self.cap.param_proxies else torch.Tensor
        if name in ("item", "tolist", "numpy", "__array__"):
            return NativeCall(None, f"Tensor.{name}", proxy, name)  # breaks when called
        if name in _NO_TENSOR_ATTRS:
            raise GraphBreak(f"tensor attribute .{name} is not captured (it needs the real tensor)",
                             "use it outside the compiled function")
        example = proxy.example_at_hand() if name in ("stride", "is_contiguous") else None
        if example is not None:
            # the layout eager gives this value (an input, or an example computed: the same ops ran on
            # equally strided inputs). Else the meta's, which the decompositions give as eager's.
            meta = proxy.meta
            if has_symbols(meta):
                # symbolic sizes: the meta's expressions where they agree with the example's layout; else
                # the example's numbers, valid for these sizes only (each size is specialized, guarded)
                hinted = hint_of(meta)
                agrees = tuple(hinted.strides) == tuple(example.stride()) if name == "stride" else \
                    hinted.is_contiguous() == example.is_contiguous()
                if agrees:
                    return NativeCall(getattr(proxy, name), f"Tensor.{name}", proxy, name)
                for size in meta.shape:
                    int(size)
            return NativeCall(getattr(example, name), f"Tensor.{name}", proxy, name)
        cls = torch.nn.Parameter if id(proxy) in self.cap.param_proxies else torch.Tensor
        if class_lookup(cls, name) is MISSING:
            return self.tensor_own_attr(proxy, name)
        try:
            value = getattr(proxy, name)
        except AttributeError:
            # (a tensor has it: kiln cannot answer for it, which is no absence hasattr may report)
            raise GraphBreak(f"tensor attribute .{name} is not captured") from None
        except GraphBreak:
            raise
        except Exception as e:
            raise symbolic_break(e, f"tensor.{name}") from None
        if callable(value) and not isinstance(value, (torch.dtype, torch.device, type)):
            return NativeCall(value, f"Tensor.{name}", proxy, name)
        return value

    def tensor_own_attr(self, proxy: Proxy, name: str) -> Any:
        """An attribute no tensor class has: one a program set on an input tensor (`t.tag = ...`), read
        from the tensor and guarded like any outside value, or its absence, guarded too (`hasattr(x, "tag")`
        must see a tag set on a later call's tensor). A tensor made in this capture has none (setting
        one breaks the graph)."""
        cap = self.cap
        src = cap.proxy_sources.get(id(proxy))
        cls = "Parameter" if id(proxy) in cap.param_proxies else "Tensor"
        error = AttributeError(f"'{cls}' object has no attribute {name!r}")
        if src is None:
            raise MissingAttribute(error, str(error))
        tensor = next((t for s, t, _ in cap.inputs if s is src), None)
        if tensor is None:
            raise GraphBreak(f"attribute .{name} of tensor {src.name}")
        own = tensor.__dict__
        if name in own:
            return cap.wrap(own[name], src.attr(name))
        cap.guards.add(f"not hasattr({src.expr}, {name!r})", f"{src.name} has no attribute {name!r}", "attr")
        raise MissingAttribute(error, str(error))

    def iterator_attr(self, it: SymIter, name: str) -> Any:
        """Methods of a symbolic iterator: next, and send/throw/close of a generator."""
        def next_item() -> Any:
            item = it.advance(self)
            if item is _STOP:
                raise stop_iteration()
            return item
        if name == "__next__":
            return NativeCall(next_item, "__next__", it, name)
        if name == "__iter__":
            return NativeCall(lambda: it, "__iter__", it, name)
        if isinstance(it, GeneratorValue):
            if name == "send":
                return NativeCall(it.send, "generator.send", it, name)
            if name == "close":
                return NativeCall(it.close, "generator.close", it, name)
            if name == "throw":
                def throw(exc: Any, *rest: Any) -> Any:
                    if isinstance(exc, type):
                        exc = exc(*rest[:1])
                    return it.throw(exc)
                return NativeCall(throw, "generator.throw", it, name)
            if name in ("__name__", "__qualname__"):
                return getattr(it.fn, name)
        raise NoAttribute(f"'{it.describe()}' object has no attribute {name!r} (as kiln models it)")

    def store_attr(self, obj: Any, name: str, value: Any) -> None:
        cap = self.cap
        if isinstance(obj, Proxy):
            raise GraphBreak(f"setting tensor attribute .{name}")
        static = class_lookup(type(obj), name)
        if isinstance(static, property):
            if static.fset is None:
                raise RaisedError(AttributeError(f"property {name!r} of {type(obj).__name__!r} object has "
                                                 "no setter"), "setting a read-only property")
            self.call(static.fset, [obj, value], {})
            return
        descriptor_set = class_lookup(type(static), "__set__") if static is not MISSING else MISSING
        if isinstance(descriptor_set, types.FunctionType):
            self.call(descriptor_set, [static, obj, value], {})  # a user data descriptor
            return
        setter = class_lookup(type(obj), "__setattr__")
        if isinstance(setter, types.FunctionType) and not isinstance(obj, torch.nn.Module):
            self.call(setter, [obj, name, value], {})  # a user __setattr__ decides what is stored
            return
        if cap.is_local(obj):
            try:
                object.__setattr__(obj, name, value)
            except (AttributeError, TypeError) as e:  # __slots__, a read-only attribute: eager's error
                raise RaisedError(e, f"setting attribute {name!r}") from None
            return
        if isinstance(obj, torch.nn.Module) and type(obj).__setattr__ is not torch.nn.Module.__setattr__:
            raise GraphBreak(f"module {type(obj).__name__} defines __setattr__")
        cap.write_attr(obj, name, value)

    def op_DELETE_ATTR(self, inst: dis.Instruction) -> None:
        obj = self.pop()
        if self.cap.is_local(obj):
            delattr(obj, inst.argval)
            return
        raise GraphBreak(f"deleting attribute {inst.argval!r}")

    # ---- subscripts ----
    def subscript(self, container: Any, index: Any) -> Any:
        cap = self.cap
        if isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict,
                                  torch.nn.ParameterList, torch.nn.ParameterDict)):
            return self.module_item(container, index)
        if isinstance(container, type):
            return container[index]
        if not isinstance(container, Proxy) and type(container).__module__ != "builtins":
            getter = class_lookup(type(container), "__getitem__")
            if isinstance(getter, types.FunctionType):  # a user __getitem__ (ModelOutput, a dict subclass)
                return self.call(getter, [container, index], {})
        if isinstance(container, Proxy) or isinstance(container, NATIVE_OPERAND_TYPES) or \
                cap.is_local(container) or id(container) in cap.mirrors:
            if isinstance(container, dict) and not isinstance(container, NATIVE_OPERAND_TYPES):
                getter = class_lookup(type(container), "__getitem__")
                if isinstance(getter, types.FunctionType):
                    return self.call(getter, [container, index], {})
            return self.native_op(_getitem, container, index)
        getter = class_lookup(type(container), "__getitem__")
        if isinstance(getter, types.FunctionType):
            return self.call(getter, [container, index], {})
        raise GraphBreak(f"indexing a {type(container).__name__}")

    def module_item(self, container: Any, index: Any) -> Any:
        cap = self.cap
        if isinstance(index, Proxy):
            raise GraphBreak("indexing a module container with a tensor")
        try:
            value = container[index]
        except Exception as e:
            raise symbolic_break(e, f"{type(container).__name__}[{index!r}]") from None
        src = cap.source_of(container)
        if isinstance(index, slice):
            if src is not None and isinstance(value, (torch.nn.ModuleList, torch.nn.Sequential)):
                # the slice is a new container, its modules are the container's: keep their sources (and
                # so their parameters' guards and graph inputs)
                cap.guards.length(src.attr("_modules"), container._modules)
                for key, item in container._modules.items():
                    if any(item is v for v in value._modules.values()):
                        cap.wrap(item, src.attr("_modules").item(key))
            return cap.new_local(value)
        if src is None:
            return value
        for dict_name in _MODULE_DICTS:
            for key, item in getattr(container, dict_name).items():
                if item is value:
                    cap.guards.length(src.attr(dict_name), getattr(container, dict_name))
                    return cap.wrap(value, src.attr(dict_name).item(key))
        return value

    # ---- iteration ----
    def loop_iterator(self, value: Any) -> SymIter:
        """get_iterator(value), marked `loop_owned` where it is a fresh iterator over a module container or a
        tuple (nothing else can hold it: `for` made it, or `enumerate` of such a container did)."""
        it = self.get_iterator(value)
        module_container = isinstance(value, MODULE_CONTAINERS) and \
            type(value).__iter__ in (c.__iter__ for c in MODULE_CONTAINERS)  # (not a subclass's own __iter__)
        if type(it) is ListIter and (type(value) is tuple or module_container):
            it.loop_owned, it.container = True, value
        return it

    def get_iterator(self, value: Any) -> SymIter:
        """iter(value) as a symbolic iterator: generators and user iterators stay lazy, everything else
        iterates a list of its symbolic items."""
        if isinstance(value, SymIter):
            return value
        if not isinstance(value, (Proxy, torch.nn.Module)) and not isinstance(value, NATIVE_OPERAND_TYPES):
            method = class_lookup(type(value), "__iter__")
            if isinstance(method, types.FunctionType):
                result = self.call(method, [value], {})
                if result is value:
                    return self.user_iterator(value)
                return self.get_iterator(result)
            if is_outside_iterator(value):
                return self.user_iterator(value)
        cap = self.cap
        tracked = cap.is_local(value) or id(value) in cap.mirrors
        if type(value) is list and tracked:
            return LiveListIter(value, "list_iterator")
        if type(value) is dict and tracked:
            return DictIter(value, "keys")
        if type(value) is collections.deque and tracked:
            return DequeIter(value)
        kind = _DICT_VIEWS.get(type(value))
        if kind is not None:
            return DictIter(value.mapping, kind)
        return ListIter(self.iterate(value), type(value).__name__ + " iterator")

    def outside_iterator(self, value: Any) -> bool:
        """A real iterator that does not belong to this capture (advancing it would change the world)."""
        return is_outside_iterator(value) and not self.cap.is_local(value)

    def user_iterator(self, value: Any) -> SymIter:
        nxt = class_lookup(type(value), "__next__")
        if isinstance(nxt, types.FunctionType):
            return UserIter(value, nxt)
        if self.cap.is_local(value):
            return NativeIter(value, type(value).__name__)
        raise OutsideIterator(f"advancing a {type(value).__name__} created outside the compiled code (kiln "
                              "never advances a real iterator while tracing)",
                              "create the iterator inside the compiled function, or pass a list")

    def iterate(self, value: Any) -> list:
        """The items of an iterable as a list of symbolic values (loops over them are unrolled)."""
        cap = self.cap
        if isinstance(value, SymIter):
            return drain(self, value)
        if isinstance(value, Proxy):
            try:
                return list(value)
            except Exception as e:
                raise symbolic_break(e, "iterating a tensor") from None
        if isinstance(value, (torch.nn.ModuleList, torch.nn.Sequential)):
            src = cap.source_of(value)
            if src is None:
                return list(value)
            cap.guards.length(src.attr("_modules"), value._modules)
            return [cap.wrap(m, src.attr("_modules").item(k)) for k, m in value._modules.items()]
        if isinstance(value, torch.nn.ParameterList):
            src = cap.source_of(value)
            if src is None:
                return list(value)
            cap.guards.length(src.attr("_parameters"), value._parameters)
            return [cap.wrap(p, src.attr("_parameters").item(k)) for k, p in value._parameters.items()]
        if isinstance(value, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            src = cap.source_of(value)
            inner = value._modules if isinstance(value, torch.nn.ModuleDict) else value._parameters
            if src is not None:
                cap.guards.keys(src.attr("_modules" if isinstance(value, torch.nn.ModuleDict)
                                         else "_parameters"), inner)
            return list(inner)
        if isinstance(value, torch.nn.Module):
            raise GraphBreak(f"iterating a {type(value).__name__} module")
        if is_outside_iterator(value):
            return drain(self, self.user_iterator(value))
        if not isinstance(value, NATIVE_OPERAND_TYPES) and \
                isinstance(class_lookup(type(value), "__iter__"), types.FunctionType):
            return drain(self, self.get_iterator(value))  # a user __iter__ (also of objects made here)
        if isinstance(value, (list, tuple, dict, str, range, set, frozenset, torch.Size, bytes)) \
                or type(value).__module__ == "builtins" or cap.is_local(value) or id(value) in cap.mirrors:
            if isinstance(value, dict) and type(value) not in (dict,) and not cap.is_local(value) and \
                    id(value) not in cap.mirrors and type(value).__module__ != "collections":
                raise GraphBreak(f"iterating a {type(value).__name__}")
            try:
                return list(value)
            except (GraphBreak,):
                raise
            except Exception as e:
                raise symbolic_break(e, "iteration") from None
        method = class_lookup(type(value), "__iter__")
        if isinstance(method, types.FunctionType):
            return drain(self, self.get_iterator(value))
        raise GraphBreak(f"iterating a {type(value).__name__}")


def _getitem(container: Any, index: Any) -> Any:
    return container[index]
