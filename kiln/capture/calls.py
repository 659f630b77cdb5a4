"""Calls in the symbolic interpreter: inlining Python functions and modules, running torch ops into the
graph, builtins on symbolic values, and graph breaks on everything kiln cannot see into."""
from __future__ import annotations

import collections
import copy
import dis
import functools
import inspect
import itertools
import operator
import re
import sys
import types
from typing import Any, Callable

import torch

from ..graph.symbolic import SymInt, has_symbols
from .. import config
from ..graph import DataDependentError, Proxy, flatten, tracing
from ..ops import UnsupportedError
from ..ops import call as ops_call
from ..ops.aten import OVERLOADS
from ..ops.trace import _RecordMode
from .errors import HINTS, GraphBreak, RaisedError
from .bytecode import PY
from .blocks import AutocastExit, GradModeContext, GradModeExit, WithEnter, set_grad
from .polyfills import polyfill_for
from .builtin_calls import (_BUILTIN_HANDLERS, _BUILTIN_TYPES, _SPECIAL_FUNCTIONS, _type, check_arguments,
                            sort_items)
from .disabled import disabled_by, module_disabled_by
from .entry import NO_SELF
from .guards import hooks_present
from .guards import is_constant
from .sources import Source
from .frame import NATIVE_OPERAND_TYPES, NULL, has_proxy, symbolic_break
from .module_construction import construct_module
from .values import NativeCall, class_lookup
from .iterators import EAGER_ITERTOOLS, LAZY_TYPES, GeneratorValue, OutsideIterator, SymIter, \
    chain_from_iterable, drain, eager_itertool, is_outside_iterator, make_lazy
# torch functions with effects kiln must not run while capturing (they break the graph instead)
_IMPURE_TORCH = {torch.manual_seed, torch.seed, torch.set_rng_state, torch.set_default_dtype,
                 torch._C._set_grad_enabled, torch.set_printoptions, torch.use_deterministic_algorithms,
                 torch.set_num_threads}
# torch functions that build a tensor from Python data: they read tensors in it as sequences
_FROM_DATA = {torch.as_tensor, torch.tensor}
_PURE_MODULES = ("math", "operator", "_operator", "builtins", "itertools", "functools", "_functools",
                 "collections", "_collections", "string", "cmath")
# Python library code kiln runs directly when no tensor is involved (introspection, logging)
_NATIVE_PY_MODULES = ("inspect", "typing", "dataclasses", "enum", "abc", "warnings", "logging", "re",
                      "functools", "copy", "string", "textwrap", "importlib")
_PRINTING = {print, input, breakpoint, open, exec, eval, compile, globals, locals, vars, dir, id, exit}
_FRAME_READS = {globals, locals, vars, dir, exec, eval, breakpoint, sys._getframe}


_STATE_SETTERS = ("set_", "_set_", "manual_seed", "seed", "use_deterministic", "_jit_set", "_enable",
                  "_disable", "_push", "_pop", "_increment", "_add_", "_remove_", "_register", "autocast_",
                  "clear_autocast")


def _autocast_dtype_read(cls: type, args: list, kwargs: dict) -> bool:
    """Whether torch.autocast(...) takes its dtype from autocast's state (no dtype given)."""
    try:
        bound = inspect.signature(cls).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return True
    bound.apply_defaults()
    return bound.arguments.get("dtype") is None


def sets_state(fn: Any) -> bool:
    """A torch function (not a tensor method) whose name says it changes global state: running it while
    tracing would change the world and the graph would not redo it."""
    if isinstance(getattr(fn, "__self__", None), Proxy) or getattr(fn, "__objclass__", None) is not None:
        return False
    name = getattr(fn, "__name__", "") or ""
    return name.startswith(_STATE_SETTERS) and not name.endswith("_")


# torch.distributed calls that only read the process group (no communication): kept on the normal path
_DIST_QUERIES = frozenset({"get_rank", "get_world_size", "is_initialized", "is_available", "get_backend",
                           "is_gloo_available", "is_nccl_available", "is_mpi_available", "get_group_rank",
                           "get_global_rank", "get_process_group_ranks", "is_torchelastic_launched"})


def communicates(fn: Any) -> bool:
    """A torch.distributed call other than a query of the process group: collectives and point-to-point
    ops update their tensors in place and wait for the other ranks, so they run natively at a graph break,
    in program order, after the graph computing their inputs."""
    module = getattr(fn, "__module__", None) or ""
    return module.startswith("torch.distributed") and getattr(fn, "__name__", "") not in _DIST_QUERIES


def is_torch_callable(fn: Any) -> bool:
    """Whether `fn` is torch's, called as one op (else Python that capture inlines). Inlined: torch's module
    forwards, and the Python of exported modules (torch.export.unflatten's InterpreterModule runs its
    GraphModule's code under a compiler) and of the pytree helpers that code flattens its inputs with."""
    module = getattr(fn, "__module__", None) or ""
    if module.startswith(("torch.nn.modules", "torch.nn.utils.parametriz", "torch.export.unflatten",
                          "torch.fx._pytree", "torch.utils._pytree")):
        return False
    if module == "torch" or module.startswith("torch.") or module.startswith("torch._"):
        return True
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, types.ModuleType) and owner.__name__.startswith("torch"):
        return True
    return owner is not None and type(owner).__name__ in ("_VariableFunctionsClass",)


def callee_and_args(second: Any, first: Any, args: list) -> tuple[Any, list]:
    """The callable and arguments of a CALL from the two slots below its arguments: (NULL, f) on 3.11-3.12
    and (f, NULL) on 3.13+ call f; (method, self) and 3.13's (f, value) pass the second as the first
    argument."""
    if first is NULL:
        return second, args
    if second is NULL:
        return first, args
    return first, [second] + args


class CallOps:
    """Frame mixin: CALL and friends, and the call dispatcher."""

    # ---- instructions ----
    def op_KW_NAMES(self, inst: dis.Instruction) -> None:
        self.kw_names = self.code.co_consts[inst.arg]

    def op_CALL(self, inst: dis.Instruction) -> None:
        argc = inst.arg
        args = self.popn(argc)
        fn, args = callee_and_args(self.pop(), self.pop(), args)
        kwargs = {}
        if self.kw_names:
            names = self.kw_names
            self.kw_names = ()
            values = args[len(args) - len(names):]
            args = args[:len(args) - len(names)]
            kwargs = dict(zip(names, values))
        self.push(self.call(fn, args, kwargs))

    def op_CALL_KW(self, inst: dis.Instruction) -> None:
        """3.13+: CALL with the keyword names on top of the stack."""
        self.kw_names = self.pop()
        self.op_CALL(inst)

    def op_CALL_FUNCTION_EX(self, inst: dis.Instruction) -> None:
        kwargs = self.pop() if inst.arg & 1 else {}
        if kwargs is NULL:  # (3.14: no **kwargs)
            kwargs = {}
        args = self.pop()
        fn = self.pop()
        if fn is NULL:  # 3.13+: the callable, then its NULL
            fn = self.pop()
        elif self.stack and self.stack[-1] is NULL:
            self.pop()
        if not isinstance(kwargs, dict):
            kwargs = self.as_mapping(kwargs)
        self.push(self.call(fn, list(self.iterate(args)), dict(kwargs)))

    def op_MAKE_FUNCTION(self, inst: dis.Instruction) -> None:
        code = self.pop()
        if PY >= (3, 13):  # a bare function; SET_FUNCTION_ATTRIBUTE adds the rest
            empty = tuple(types.CellType() for _ in code.co_freevars) or None
            fn = types.FunctionType(code, self.globals, code.co_name, None, empty)
            fn.__qualname__ = code.co_qualname
            self.cap.new_local(fn)
            self.push(fn)
            return
        flags = inst.arg
        closure = self.pop() if flags & 0x08 else None
        annotations = self.pop() if flags & 0x04 else None
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        fn = types.FunctionType(code, self.globals, code.co_name, defaults, closure)
        if kwdefaults:
            fn.__kwdefaults__ = kwdefaults
        if annotations:  # a tuple of (name, value) pairs in 3.11
            fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2])) \
                if isinstance(annotations, tuple) else dict(annotations)
        fn.__qualname__ = code.co_qualname
        self.cap.new_local(fn)
        self.push(fn)

    def op_SET_FUNCTION_ATTRIBUTE(self, inst: dis.Instruction) -> None:
        fn = self.pop()
        value = self.pop()
        if inst.arg == 0x08:  # a closure is fixed when a function is made: make it again
            made = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, value)
            made.__kwdefaults__, made.__qualname__ = fn.__kwdefaults__, fn.__qualname__
            made.__annotations__ = fn.__annotations__
            fn = made
            self.cap.new_local(fn)
        elif inst.arg == 0x01:
            fn.__defaults__ = value
        elif inst.arg == 0x02:
            fn.__kwdefaults__ = value
        elif inst.arg == 0x04:
            fn.__annotations__ = dict(zip(value[::2], value[1::2])) if isinstance(value, tuple) else dict(value)
        elif inst.arg == 0x10:  # 3.14: annotations computed on demand (PEP 649)
            fn.__annotate__ = value
        else:
            raise GraphBreak(f"function attribute {inst.argrepr} is not supported by kiln's interpreter")
        self.push(fn)

    # ---- dispatch ----
    def call(self, fn: Any, args: list, kwargs: dict) -> Any:
        """Call `fn` on symbolic arguments: inline it, record it, or break."""
        cap = self.cap
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, torch.autograd.Function) and \
                getattr(fn, "__name__", "") == "apply" and torch.is_grad_enabled() and any(
                    isinstance(a, Proxy) and a.meta.requires_grad for a in flatten((args, kwargs))):
            # its forward would be traced as plain ops and differentiated by kiln's rules, not by the
            # user's backward (a straight-through round got no gradient at all)
            raise GraphBreak(f"torch.autograd.Function {owner.__qualname__} on inputs that require grad "
                             "(its backward is user code)", "it runs eagerly, the rest is compiled")
        if isinstance(fn, NativeCall):
            if fn.fn is None:
                raise GraphBreak(f"data-dependent: tensor.{fn.attr}() reads the tensor's values",
                                 HINTS["item"])
            return self.native(fn.fn, args, kwargs, fn.name)
        if isinstance(fn, GradModeExit):
            ctx = fn.ctx
            if ctx.prev is not None:
                set_grad(cap, ctx.prev)
            return None
        if isinstance(fn, AutocastExit):
            return fn.leave()
        if isinstance(fn, WithEnter):
            return fn.ctx.enter(cap)
        if isinstance(fn, torch.nn.Module):
            return self.call_module(fn, args, kwargs)
        if isinstance(fn, OVERLOADS):  # torch.ops.aten.add.Tensor, torch.ops.aten.add, torch.ops.mylib.foo
            return self.torch_call(fn, args, kwargs)
        if isinstance(fn, types.MethodType):
            owner, func = fn.__self__, fn.__func__
            if type(owner) in (torch.no_grad, torch.enable_grad) and func.__name__ == "clone":
                return GradModeContext(type(owner) is torch.enable_grad)  # the grad-mode decorators
            if isinstance(owner, Proxy):
                return self.native(fn, args, kwargs, f"Tensor.{func.__name__}")
            if isinstance(owner, torch.nn.Module) and func in _MODULE_CALLS:
                return self.call_module(owner, args, kwargs)
            return self.call(func, [owner] + list(args), kwargs)
        if isinstance(fn, types.FunctionType):
            disabled = disabled_by(fn)
            if disabled is not None:
                raise GraphBreak(f"call to {fn.__qualname__}, disabled by {disabled}", HINTS["disabled"])
            if fn in _SPECIAL_FUNCTIONS:
                return _SPECIAL_FUNCTIONS[fn](self, args, kwargs)
            if args and args[0] is _ENVIRON and fn.__name__ in _ENVIRON_READS:
                return self.environ_read(fn.__name__, args[1:], kwargs)
            module = fn.__module__ or ""
            if module.startswith("kiln.graph") or module.startswith("kiln.ops"):
                return self.native(fn, args, kwargs, fn.__qualname__)
            if is_torch_callable(fn):
                return self.torch_call(fn, args, kwargs)
            if fn is collections.namedtuple:  # made natively, named after the user's module (not kiln's)
                kwargs = kwargs if "module" in kwargs else {**kwargs, "module": self.globals.get("__name__")}
                return self.native(fn, args, kwargs, "namedtuple")
            if module.split(".")[0] in _NATIVE_PY_MODULES and not any(
                    isinstance(a, Proxy) for a in flatten((args, kwargs))):
                return self.native(fn, args, kwargs, _name(fn))
            return self.inline(fn, args, kwargs)
        if type(fn) is functools._lru_cache_wrapper:
            # the cache is an optimization of a function assumed pure: trace the function itself
            return self.call(self.load_attr(fn, "__wrapped__"), args, kwargs)
        if isinstance(fn, functools.partial):
            func, bound, keywords = fn.func, fn.args, fn.keywords
            src = cap.source_of(fn)
            if src is not None and not cap.is_local(fn):  # one from outside: what it binds is guarded
                func = cap.wrap(func, src.attr("func"))
                bound = cap.wrap(bound, src.attr("args"))
                keywords = cap.wrap(keywords, src.attr("keywords"))
            return self.call(func, list(bound) + list(args), {**keywords, **kwargs})
        if isinstance(fn, type):
            return self.construct(fn, args, kwargs)
        if isinstance(fn, _BUILTIN_TYPES):
            return self.call_builtin(fn, args, kwargs)
        if isinstance(fn, (classmethod, staticmethod)):
            return self.call(fn.__func__, args, kwargs)
        if type(fn).__name__ == "CompiledFunction" and type(fn).__module__ == "kiln.capture.cache":
            # a kiln-compiled function called from compiled code: inline the function it compiles
            target, bound = self.load_attr(fn, "fn"), self.load_attr(fn, "bound_self")
            return self.call(target, list(args) if bound is NO_SELF else [bound] + list(args), kwargs)
        if type(fn) in (operator.itemgetter, operator.attrgetter) and len(args) == 1 and not kwargs:
            return self.call_getter(fn, args[0])
        if type(fn).__name__ == "CustomOpDef" and type(fn).__module__ == "torch._library.custom_ops" and \
                isinstance(getattr(fn, "_opoverload", None), OVERLOADS):
            # a function decorated with torch.library.custom_op: its operator (torch.ops.ns.name.default)
            return self.torch_call(fn._opoverload, args, kwargs)
        method = class_lookup(type(fn), "__call__")
        if isinstance(method, types.FunctionType):
            return self.call(method, [fn] + list(args), kwargs)
        raise GraphBreak(f"call to {type(fn).__name__} object {_name(fn)}", HINTS["call"])

    def call_builtin(self, fn: Any, args: list, kwargs: dict) -> Any:
        cap = self.cap
        handler = _BUILTIN_HANDLERS.get(fn)
        if handler is not None:
            check_arguments(fn, args, kwargs)
            return handler(self, args, kwargs)
        owner = getattr(fn, "__self__", None)
        name = getattr(fn, "__name__", "")
        if name == "__getattribute__" and len(args) == 1 and isinstance(args[0], str) and \
                (fn is object.__getattribute__ or (isinstance(fn, types.MethodWrapperType) and
                                                   owner is not None and
                                                   getattr(fn, "__objclass__", object) is object)):
            return self.load_attr(owner, args[0], default_lookup=True)  # super().__getattribute__(k)
        if owner is itertools.chain and name == "from_iterable":
            return chain_from_iterable(self, args, kwargs)
        if name == "sort" and type(owner) is list and (cap.is_local(owner) or id(owner) in cap.mirrors):
            if args:
                raise GraphBreak("list.sort() takes no positional arguments")
            owner[:] = sort_items(self, list(owner), kwargs.get("key"), kwargs.get("reverse", False))
            return None
        if fn in _FRAME_READS and not (fn in (vars, dir) and args):
            brk = GraphBreak(f"call to {fn.__name__}() (it reads the calling frame)", HINTS["call"])
            brk.resumable = False  # it must run in the user's own frame, not in kiln's entry
            raise brk
        if fn in _PRINTING:
            raise GraphBreak(f"call to {fn.__name__}()", HINTS["print"] if fn is print else HINTS["call"])
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, Proxy):
            return self.native(fn, args, kwargs, f"Tensor.{fn.__name__}")
        if fn in _IMPURE_TORCH:
            raise GraphBreak(f"call to {_name(fn)} (it changes global torch state)", HINTS["call"])
        if is_torch_callable(fn) or getattr(fn, "__objclass__", None) is torch._C.TensorBase:
            return self.torch_call(fn, args, kwargs)
        if owner is not None and not isinstance(owner, types.ModuleType):
            if id(owner) in cap.mirrors and name not in _READ_ONLY_METHODS:
                cap.check_mirror_write(owner)
            if cap.is_local(owner) or id(owner) in cap.mirrors or isinstance(owner, _IMMUTABLE_OWNERS):
                return self.native(fn, args, kwargs, _name(fn))
            src = cap.source_of(owner)
            read_only = getattr(fn, "__name__", "") in _READ_ONLY_METHODS
            if src is not None and read_only and all(is_constant(a) for a in args) and not kwargs:
                return self.read_only_method(fn, owner, src, args)
            if src is None and read_only and isinstance(owner, (dict, list, types.MappingProxyType)):
                return self.native(fn, args, kwargs, _name(fn))  # class-level metadata (dataclass fields)
            raise GraphBreak(f"method {_name(fn)} of a {type(owner).__name__} kiln does not track",
                             HINTS["call"])
        if fn is object.__setattr__ and len(args) == 3 and not cap.is_local(args[0]) and \
                cap.source_of(args[0]) is not None:
            cap.write_attr(args[0], args[1], args[2])  # a user __setattr__ storing through object's
            return None
        objclass = getattr(fn, "__objclass__", None)
        if objclass is not None and args and (cap.is_local(args[0]) or id(args[0]) in cap.mirrors or
                                              isinstance(args[0], NATIVE_OPERAND_TYPES)):
            return self.native(fn, args, kwargs, _name(fn))
        module = getattr(fn, "__module__", None) or getattr(owner, "__name__", "") or ""
        if module.split(".")[0] in _PURE_MODULES:
            return self.native(fn, args, kwargs, _name(fn))
        raise GraphBreak(f"call to C function {_name(fn)}", HINTS["call"])

    def call_getter(self, getter: Any, obj: Any) -> Any:
        """operator.itemgetter / attrgetter applied to a symbolic value, traced like `obj[k]` / `obj.a`."""
        keys = getter.__reduce__()[1]
        if type(getter) is operator.itemgetter:
            values = [self.subscript(obj, k) for k in keys]
        else:
            values = []
            for dotted in keys:
                value = obj
                for part in dotted.split("."):
                    value = self.load_attr(value, part)
                values.append(value)
        return values[0] if len(values) == 1 else tuple(values)

    def environ_read(self, method: str, args: list, kwargs: dict) -> Any:
        """A read of the process environment (get, [], in): the value read now, guarded (a changed
        variable recaptures)."""
        if kwargs or not args or not all(is_constant(a) for a in args):
            raise GraphBreak(f"environment read {method} with arguments kiln does not guard")
        key = args[0]
        value = _ENVIRON.get(key) if isinstance(key, str) else None
        env = self.cap.ns.hold(_ENVIRON, "environ")
        literal = "None" if value is None else self.cap.ns.literal(value)
        self.cap.guards.add(f"{env}.get({self.cap.ns.literal(key)}) == {literal}",
                            f"environment variable {key!r} is {'unset' if value is None else repr(value)}", "environ")
        if method == "__contains__":
            return value is not None
        if value is not None:
            return value
        if method == "get":
            return args[1] if len(args) > 1 else None
        raise RaisedError(KeyError(key), f"environment variable {key!r} is not set")

    def read_only_method(self, fn: Any, owner: Any, src: Any, args: list) -> Any:
        """A builtin read of an outside container (dict.get on a dict subclass): guarded like a read."""
        name = fn.__name__
        unbound = next((k.__dict__[name] for k in type(owner).__mro__
                        if k.__module__ == "builtins" and name in k.__dict__), None)
        if unbound is None:
            raise GraphBreak(f"method {_name(fn)} of a {type(owner).__name__} kiln does not track")
        ns = self.cap.ns
        arg_src = "".join(", " + ns.literal(a) for a in args)
        source = Source(f"{ns.hold(unbound, name)}({src.expr}{arg_src})", f"{src.name}.{name}{tuple(args)}",
                        src, "call")
        return self.cap.wrap(self.native(unbound, [owner] + list(args), {}, name), source)

    def native(self, fn: Callable[..., Any], args: list, kwargs: dict, name: str) -> Any:
        """Run fn directly on the symbolic values (torch calls on proxies record into the graph)."""
        for a in list(args) + list(kwargs.values()):
            if self.outside_iterator(a):
                raise OutsideIterator(f"{name} would advance a {type(a).__name__} created outside the "
                                      "compiled code")
        if any(isinstance(a, SymIter) for a in args):
            # C code consumes an iterator through its own protocol: hand it the items
            args = [iter(drain(self, a)) if isinstance(a, SymIter) else a for a in args]
        fn_name = getattr(fn, "__name__", "")
        if not isinstance(fn, types.FunctionType) and fn_name not in _NO_DUNDER_METHODS:
            owner = getattr(fn, "__self__", None)
            compares_items = type(owner) in (list, tuple, collections.deque) and \
                fn_name in ("count", "index", "remove", "__contains__")
            checked = args[:1] if fn_name in _KEY_METHODS and isinstance(owner, (dict, set, frozenset)) \
                else args
            user = self.user_argument(checked + ([owner] if compares_items else []), kwargs,
                                      fn in _ITEM_READERS or compares_items)
            if user is not None:
                # C code would call the object's Python dunders outside the trace (unguarded, its side
                # effects once): the call runs natively instead
                raise GraphBreak(f"{name} on a {type(user).__name__} would run its Python methods outside "
                                 "the trace", HINTS["call"])
        try:
            with tracing(self.cap.tracer):
                result = fn(*args, **kwargs)
        except Exception as e:
            genuine = not (has_proxy(args) or has_proxy(kwargs) or isinstance(getattr(fn, "__self__", None),
                                                                               Proxy))
            raise symbolic_break(e, name, genuine) from None
        if type(result) in _FRESH_RESULTS or is_outside_iterator(result):
            self.cap.new_local(result)  # a container or iterator a native call made here is the capture's own
        if fn is copy.deepcopy:
            _register_fresh(self.cap, result, 0)  # every container inside a deep copy is new
        return result

    def user_argument(self, args: list, kwargs: dict, items: bool) -> Any:
        """An argument (with `items`, or an item of a list/tuple argument) whose class has Python dunders."""
        for a in list(args) + list(kwargs.values()):
            if self.calls_python_dunders(a):
                return a
            if items and type(a) in (list, tuple) and len(a) <= 4096:
                for v in a:
                    if self.calls_python_dunders(v):
                        return v
        return None

    def torch_call(self, fn: Any, args: list, kwargs: dict) -> Any:
        """A torch function: proxies route through kiln.ops; factories are recorded too."""
        name = _name(fn)
        if fn in _IMPURE_TORCH or sets_state(fn):
            raise GraphBreak(f"call to {name} (it changes global torch state)", HINTS["call"])
        if getattr(fn, "__name__", "") in ("__enter__", "__exit__") and args and \
                isinstance(args[0], torch.amp.autocast_mode.autocast):
            # outside a with-block (a direct call, an ExitStack): the state it sets may outlive the call
            raise GraphBreak(f"call to {name} (it changes torch.autocast's state)", HINTS["call"])
        if getattr(fn, "__module__", "").startswith("torch._higher_order_ops"):
            stand_in = polyfill_for(fn)
            if stand_in is not None:  # associative_scan: plain Python over torch ops, inlined
                return self.inline(stand_in, args, kwargs)
            # (scan, cond, while_loop, map: they run Python callables on proxies)
            raise GraphBreak(f"call to {name}, a torch higher-order op kiln does not trace", HINTS["call"])
        if communicates(fn):
            raise GraphBreak(f"call to {name} (torch.distributed communication runs natively, in program "
                             "order)", "collectives break the graph; the code after one is captured again")
        flat = list(flatten((args, kwargs)))
        has_proxy = any(isinstance(a, Proxy) for a in flat)
        for a in flat:
            if not (isinstance(a, (Proxy, SymInt, torch.dtype, torch.device, torch.layout, torch.memory_format, type,
                                   types.FunctionType, types.BuiltinFunctionType)) or is_constant(a)
                    or self.cap.is_local(a)):
                # e.g. a numpy array or a tensor kiln did not capture: its value would be baked in
                raise GraphBreak(f"{name} on a {type(a).__name__} kiln does not track", HINTS["call"])
            if has_proxy and isinstance(a, types.FunctionType) and isinstance(fn, types.FunctionType) and \
                    not (getattr(a, "__module__", None) or "").startswith("torch"):
                # torch's Python code would call the user's function for real, unseen by capture: what it
                # reads (a global tensor, a parameter in a closure) would enter the graph unguarded
                raise GraphBreak(f"{name} calls the function {getattr(a, '__qualname__', a)}, which kiln would "
                                 f"not trace (torch's code runs it)", HINTS["call"])
        try:
            with tracing(self.cap.tracer):
                if has_proxy:
                    if fn in _FROM_DATA:  # they read their data as a sequence, not through __torch_function__
                        return ops_call(fn, tuple(args), dict(kwargs))
                    if isinstance(fn, types.FunctionType):
                        with _RecordMode():
                            return fn(*args, **kwargs)
                    return fn(*args, **kwargs)
                if has_symbols((args, kwargs)):  # a factory sized by a symbolic size: recorded, never run
                    return ops_call(fn, tuple(args), dict(kwargs))
                result = fn(*args, **kwargs)
                if any(isinstance(v, torch.Tensor) for v in flatten(result)):
                    return ops_call(fn, tuple(args), dict(kwargs))
                return result
        except (GraphBreak, DataDependentError, UnsupportedError) as e:
            raise symbolic_break(e, name) from None
        except Exception as e:
            raise symbolic_break(e, name, not has_proxy) from None

    def call_module(self, module: torch.nn.Module, args: list, kwargs: dict) -> Any:
        disabled = module_disabled_by(module)
        if disabled is not None:
            raise GraphBreak(f"call to module {type(module).__name__}, disabled by {disabled}",
                             HINTS["disabled"])
        source = self.cap.source_of(module)
        guards = self.cap.guards
        if hooks_present(module, guards):  # (its hooks, and the global ones: those guarded here)
            raise GraphBreak(f"module {type(module).__name__} has hooks", "hooks run eagerly")
        # a hook registered later, or a `module.forward = fn` assigned later, must make the capture miss
        class_forward = "forward" not in vars(module)
        if source is not None and not (class_forward and guards.quiet_module(source, module)):
            hooks_present(module, guards, source)
            if class_forward:
                guards.add(f"'forward' not in {source.expr}.__dict__", f"{source.name}.forward is its class's",
                           "hooks")
        forward = self.load_attr(module, "forward")
        return self.call(forward, args, kwargs)

    def construct(self, cls: type, args: list, kwargs: dict) -> Any:
        cap = self.cap
        if cls in (torch.no_grad, torch.enable_grad):
            if args or kwargs:
                raise GraphBreak(f"{cls.__name__} with arguments")
            return GradModeContext(cls is torch.enable_grad)
        if cls is torch.set_grad_enabled:
            mode = args[0] if args else kwargs.get("mode")
            if not isinstance(mode, bool):
                raise GraphBreak("torch.set_grad_enabled with a non-constant mode")
            prev = torch.is_grad_enabled()
            set_grad(cap, mode)
            return GradModeContext(mode, prev)
        if cls is super:
            return self.make_super(args)
        if issubclass(cls, torch.amp.autocast_mode.autocast):
            # made natively (it only reads autocast's state and checks its arguments); entering it is
            # followed by the interpreter (AutocastContext)
            if any(isinstance(v, Proxy) for v in flatten((args, kwargs))):
                raise GraphBreak("torch.autocast with a tensor argument")
            manager = cap.new_local(self.native(cls, args, kwargs, cls.__qualname__))
            if _autocast_dtype_read(cls, args, kwargs):  # its dtype is the one set now (state at entry)
                cap.guards.autocast_full(cap.autocast_saved)
            return manager
        if cls in LAZY_TYPES:
            lazy = make_lazy(self, cls, args, kwargs)
            if lazy is not None:
                return lazy
        if cls in EAGER_ITERTOOLS:
            return eager_itertool(self, cls, args, kwargs)
        if cls is type:
            return _type(self, args, kwargs)
        if issubclass(cls, torch.nn.Module):
            return construct_module(cap, cls, args, kwargs)
        if cls is GeneratorExit or cls is StopIteration:
            return cls(*args)
        if cls is functools.partial:
            return cap.new_local(functools.partial(*args, **kwargs))
        if cls.__module__ == "builtins" or cls in (torch.Size, torch.device, torch.dtype) or \
                issubclass(cls, BaseException) or (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            if cls in (list, dict, set):
                items = self.call_builtin_iterables(args)
                return cap.new_local(self.native(cls, items, kwargs, cls.__name__))
            if cls in (tuple, frozenset, enumerate, zip, reversed, sorted, str, bool, int, float):
                args = self.call_builtin_iterables(args) if cls in (tuple, frozenset, enumerate, zip,
                                                                    reversed) else args
                if cls is bool and len(args) == 1:
                    return self.truth(args[0])
            made = self.native(cls, args, kwargs, cls.__name__)
            if isinstance(made, tuple) and isinstance(getattr(made, "__dict__", None), dict):
                cap.new_local(made)  # a NamedTuple subclass's instance: its attributes may be set here
            return made
        if is_torch_callable(cls):
            return self.torch_call(cls, args, kwargs)
        if cls in (operator.itemgetter, operator.attrgetter):
            return cap.new_local(self.native(cls, args, kwargs, cls.__name__))
        if cls in (collections.deque, collections.OrderedDict, collections.defaultdict):
            items = self.call_builtin_iterables(args[:1]) + list(args[1:]) if cls is not \
                collections.defaultdict else list(args)
            return cap.new_local(self.native(cls, items, kwargs, cls.__name__))
        meta_call = class_lookup(type(cls), "__call__")
        if isinstance(meta_call, types.FunctionType):  # a metaclass's own __call__ makes the instance
            return self.call(meta_call, [cls] + list(args), kwargs)
        new = class_lookup(cls, "__new__")
        if isinstance(new, staticmethod):  # (a `def __new__` in a class body is one)
            new = new.__func__
        init = class_lookup(cls, "__init__")
        if init in (list.__init__, set.__init__) and not isinstance(new, types.FunctionType):
            # a subclass of list or set with the builtin constructor
            obj = cap.new_local(cls.__new__(cls))
            self.native(init, [obj] + self.call_builtin_iterables(args), kwargs, f"{cls.__name__}()")
            return obj
        if isinstance(new, types.FunctionType):
            return self.construct_with_new(cls, new, init, args, kwargs)
        if not (isinstance(init, types.FunctionType) or init is object.__init__ or init is dict.__init__):
            raise GraphBreak(f"creating a {cls.__name__} (C __init__)", HINTS["call"])
        try:
            obj = cls.__new__(cls)
        except Exception as e:
            raise symbolic_break(e, f"{cls.__name__}.__new__") from None
        cap.new_local(obj)
        if isinstance(init, types.FunctionType):
            self.call(init, [obj] + list(args), kwargs)
        elif args or kwargs:
            raise GraphBreak(f"creating a {cls.__name__} with arguments to a C __init__")
        return obj

    def construct_with_new(self, cls: type, new: types.FunctionType, init: Any, args: list,
                           kwargs: dict) -> Any:
        """cls(*args) for a class with its own __new__, as type.__call__ does it: __init__ runs only on an
        instance of cls that __new__ returned (one of another class is returned as it is)."""
        if issubclass(cls, torch.Tensor):
            raise GraphBreak(f"creating a {cls.__name__} (a tensor subclass)", HINTS["call"])
        obj = self.call(new, [cls] + list(args), kwargs)
        if isinstance(obj, Proxy) or not issubclass(type(obj), cls):
            return obj
        if isinstance(init, types.FunctionType):
            self.call(init, [obj] + list(args), kwargs)
        elif init is not object.__init__:  # (object's ignores the arguments when __new__ is overridden)
            raise GraphBreak(f"creating a {cls.__name__} (C __init__)", HINTS["call"])
        return obj

    def make_super(self, args: list) -> Any:
        if args:
            return super(*args)
        cell = self.cells.get("__class__")
        first = self.code.co_varnames[0] if self.code.co_argcount else None
        if cell is None or first is None:
            raise GraphBreak("super() without __class__")
        owner = self.locals.get(first)
        if owner is None and first in self.cells:
            owner = self.cells[first].cell_contents
        return super(cell.cell_contents, owner)

    def call_builtin_iterables(self, args: list) -> list:
        """Arguments of list()/tuple()/zip()/enumerate(): iterables become lists of symbolic items."""
        out = []
        for a in args:
            if isinstance(a, SymIter) or self.outside_iterator(a):
                out.append(self.iterate(a))
            elif isinstance(a, (Proxy, torch.nn.Module)) or self.cap.is_local(a) or id(a) in self.cap.mirrors \
                    or isinstance(a, (list, tuple, dict, range, str, set, frozenset)) or \
                    isinstance(class_lookup(type(a), "__iter__"), types.FunctionType) or \
                    type(a).__module__ == "builtins":
                if isinstance(a, dict) and (self.cap.is_local(a) or id(a) in self.cap.mirrors):
                    out.append(a)
                else:
                    out.append(self.iterate(a))
            else:
                out.append(a)
        return out

    # ---- inlining ----
    def inline(self, fn: types.FunctionType, args: list, kwargs: dict) -> Any:
        code = fn.__code__
        if code.co_flags & (0x80 | 0x100 | 0x200):  # coroutine, iterable coroutine, async generator
            raise GraphBreak(f"call to async function {fn.__qualname__}")
        try:
            bound = bind_arguments(fn, args, kwargs)
        except TypeError as e:
            raise GraphBreak(f"calling {fn.__qualname__}: {e}", "the call fails eagerly too", e) from None
        cap = self.cap
        if fn.__defaults__ and not cap.is_local(fn):
            for name, value in bound.items():
                if isinstance(value, torch.Tensor) and not isinstance(value, Proxy):
                    raise GraphBreak(f"tensor default argument {name!r} of {fn.__qualname__}")
        for name in code.co_varnames[code.co_argcount + code.co_kwonlyargcount:][:2]:
            if isinstance(bound.get(name), dict):
                cap.new_local(bound[name])
        # the callee runs in a frame of this frame's class (the Interpreter that mixes these handlers in)
        frame = type(self)(cap, code, fn, bound, fn.__globals__, parent=self)
        if frame.is_generator:
            gen = GeneratorValue(frame, fn, args, kwargs)  # runs as its consumer advances it
            cap.generators.append(gen)
            return gen
        return frame.run()


def _register_fresh(cap: Any, value: Any, depth: int) -> None:
    if depth > 8 or isinstance(value, (torch.Tensor, types.ModuleType, type, types.FunctionType)) or \
            is_constant(value):
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        if not isinstance(value, (tuple, frozenset)):
            cap.new_local(value)
        for item in value:
            _register_fresh(cap, item, depth + 1)
        return
    if isinstance(value, dict):
        cap.new_local(value)
        for item in value.values():
            _register_fresh(cap, item, depth + 1)
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(value, torch.nn.Module):
        cap.new_local(value)
        for item in attrs.values():
            _register_fresh(cap, item, depth + 1)


def bind_arguments(fn: types.FunctionType, args: list | tuple, kwargs: dict) -> dict[str, Any]:
    """The frame's initial locals for fn(*args, **kwargs), as CPython binds them (TypeError if not)."""
    code = fn.__code__
    names = code.co_varnames
    n, posonly, kwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    has_varargs, has_varkw = bool(code.co_flags & 0x04), bool(code.co_flags & 0x08)
    bound: dict[str, Any] = {}
    if len(args) > n and not has_varargs:
        raise TypeError(f"{fn.__qualname__}() takes {n} positional arguments but {len(args)} were given")
    for name, value in zip(names[:n], args):
        bound[name] = value
    extra_kw: dict[str, Any] = {}
    keyword_ok = set(names[posonly:n + kwonly])
    for key, value in kwargs.items():
        if key in keyword_ok:
            if key in bound:
                raise TypeError(f"{fn.__qualname__}() got multiple values for argument {key!r}")
            bound[key] = value
        elif has_varkw:
            extra_kw[key] = value
        else:
            raise TypeError(f"{fn.__qualname__}() got an unexpected keyword argument {key!r}")
    defaults = fn.__defaults__ or ()
    first_default = n - len(defaults)
    for i, name in enumerate(names[:n]):
        if name not in bound:
            if i >= first_default:
                bound[name] = defaults[i - first_default]
            else:
                raise TypeError(f"{fn.__qualname__}() missing required argument {name!r}")
    kwdefaults = fn.__kwdefaults__ or {}
    for name in names[n:n + kwonly]:
        if name not in bound:
            if name in kwdefaults:
                bound[name] = kwdefaults[name]
            else:
                raise TypeError(f"{fn.__qualname__}() missing required keyword argument {name!r}")
    i = n + kwonly
    if has_varargs:
        bound[names[i]] = tuple(args[n:])
        i += 1
    if has_varkw:
        bound[names[i]] = extra_kw
    return bound


# objects whose methods read nothing that can change (a compiled regex, a match, strings, numbers)
_IMMUTABLE_OWNERS = (str, bytes, tuple, frozenset, int, float, complex, torch.Size, type, re.Pattern, re.Match)
# C methods that store or move their arguments without calling any of their methods
_NO_DUNDER_METHODS = {"append", "insert", "extend", "clear", "copy", "reverse", "appendleft",
                      "extendleft", "popleft", "rotate", "__len__", "keys", "values", "items",
                      "update", "tuple", "list", "partial", "isinstance", "issubclass", "type",
                      "id", "len", "iter", "next", "getattr", "setattr", "hasattr", "callable", "super",
                      "__setattr__", "__getattribute__", "__init__", "__new__", "itemgetter", "attrgetter",
                      "deque", "OrderedDict", "defaultdict", "namedtuple", "MethodType"}
# mapping and set methods that hash only their first argument (the key), not the value stored
_KEY_METHODS = {"__setitem__", "__getitem__", "__delitem__", "__contains__", "get", "pop", "setdefault",
                "add", "discard", "remove"}
# builtins that compare, hash or add the items of their arguments
_ITEM_READERS = {sorted, min, max, sum, set, frozenset, dict.fromkeys}
# results of native calls that are new objects or read-only views (never an object the program shares)
_FRESH_RESULTS = (list, dict, set, type({}.keys()), type({}.values()), type({}.items()),
                  type(collections.OrderedDict().keys()), type(collections.OrderedDict().values()),
                  type(collections.OrderedDict().items()), types.MappingProxyType, inspect.Signature,
                  inspect.Parameter, inspect.BoundArguments)
_ENVIRON = config.process_environment()
_ENVIRON_READS = ("get", "__getitem__", "__contains__")
_READ_ONLY_METHODS = {"get", "__getitem__", "__contains__", "__len__", "keys", "values", "items", "copy",
                      "index", "count"}
_MODULE_CALLS = {torch.nn.Module.__call__, getattr(torch.nn.Module, "_call_impl", None),
                 getattr(torch.nn.Module, "_wrapped_call_impl", None)} - {None}


def _name(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    if module is None:
        owner = getattr(fn, "__self__", None)
        module = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
    return f"{module}.{qual}" if module and module != "builtins" else qual

