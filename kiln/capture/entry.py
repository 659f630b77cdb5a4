"""Generated entry functions: one per cache entry, with the compiled function's own signature.

    def __entry(x, y):
        try:
            if not ((type(x) is __Tensor_1 and x.dtype is ... ) and (...)):
                return __MISS
        except Exception:
            return __MISS
        __out = __graph(x, __Parameter_4)
        __ret = (__out[0], 3)
        __self_2.steps = __out[1]     # side effects, replayed after the graph
        return __ret

An entry for a frame that broke calls the original function instead of the graph.
"""
from __future__ import annotations

import ast
import dis
import collections
import functools
import re
import types
import warnings
from typing import Any

import torch

from .. import config
from ..counters import counters
from ..graph import Proxy, torch_callable
from ..graph import memo
from ..ops import autocast
from ..graph.graph import is_random_target
from ..graph.symbolic import SymInt, has_symbols, python_expr, specialize_all, substitute
from ..ops.aten import OVERLOADS
from ..ops.registry import aliases
from .errors import GraphBreak
from .guards import check_expr, is_constant, storages_apart
from ..graph.specialize import unbound_symbols
from .dynamic import SymbolicGraph, is_symbolic_graph
from .segments import compile_segmented
from .state import Capture
from .values import NativeCall
from .iterators import SymIter


class _Miss:
    def __repr__(self) -> str:
        return "<guard miss>"


MISS = _Miss()
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def build_object(cls: type, attrs: dict, items: dict | None) -> Any:
    """Rebuild an object made inside compiled code (dataclass, model output, user class)."""
    obj = cls.__new__(cls)
    if items is not None:
        # the builtin base's own __setitem__ (not the class's): an OrderedDict keeps its order beside the
        # dict's storage, which dict.update would bypass
        setitem = collections.OrderedDict.__setitem__ if isinstance(obj, collections.OrderedDict) \
            else dict.__setitem__
        for key, value in items.items():
            setitem(obj, key, value)
    if attrs:
        obj.__dict__.update(attrs)
    return obj


def with_attributes(obj: Any, attrs: dict) -> Any:
    """obj with `attrs` set in its __dict__ (a NamedTuple subclass's instance made in compiled code)."""
    obj.__dict__.update(attrs)
    return obj


def rebuild_mapping(cls: type, pairs: list, factory: Any) -> Any:
    """A collections mapping made in compiled code, item by item through the builtin base's __setitem__
    (Counter(pairs) would count the pairs; a defaultdict keeps its default_factory)."""
    obj = cls(factory) if issubclass(cls, collections.defaultdict) else cls()
    setitem = collections.OrderedDict.__setitem__ if isinstance(obj, collections.OrderedDict) \
        else dict.__setitem__
    for key, value in pairs:
        setitem(obj, key, value)
    return obj


def make_function(code: types.CodeType, globals_: dict, defaults: tuple | None,
                  kwdefaults: dict | None) -> types.FunctionType:
    """Rebuild a function defined inside compiled code (one without a closure)."""
    fn = types.FunctionType(code, globals_, code.co_name, defaults)
    fn.__qualname__ = code.co_qualname
    if kwdefaults:
        fn.__kwdefaults__ = kwdefaults
    return fn


def parameters(code: types.CodeType) -> tuple[list[str], str, list[str]]:
    """(parameter names, parameter list source, call-forwarding argument source list)."""
    names = code.co_varnames
    n, posonly, kwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    positional = list(names[:n])
    keyword = list(names[n:n + kwonly])
    i = n + kwonly
    varargs = names[i] if code.co_flags & 0x04 else None
    i += 1 if varargs else 0
    varkw = names[i] if code.co_flags & 0x08 else None
    parts: list[str] = []
    forward: list[str] = []
    for j, name in enumerate(positional):
        parts.append(name)
        forward.append(name)
        if posonly and j == posonly - 1:
            parts.append("/")
    if varargs:
        parts.append("*" + varargs)
        forward.append("*" + varargs)
    elif keyword:
        parts.append("*")
    parts.extend(keyword)
    forward.extend(f"{k}={k}" for k in keyword)
    if varkw:
        parts.append("**" + varkw)
        forward.append("**" + varkw)
    all_names = positional + keyword + ([varargs] if varargs else []) + ([varkw] if varkw else [])
    return all_names, ", ".join(parts), forward


class Reconstructor:
    """Python source that rebuilds symbolic values after the graph ran."""

    def __init__(self, cap: Capture, temp: Any = None):
        self.cap = cap
        self.outputs: list[Any] = []  # graph output nodes
        self._index: dict[int, int] = {}
        self.held_inputs: dict[str, str] = {}
        self.temp = temp  # temp(expr) -> name: built objects are named once, so aliases stay aliases
        self._built: dict[int, tuple[Any, str]] = {}

    def _once(self, v: Any, expr: str) -> str:
        if self.temp is None:
            return expr
        name = self.temp(expr)
        self._built[id(v)] = (v, name)
        return name

    def value(self, v: Any) -> str:
        cap = self.cap
        ns = cap.ns
        built = self._built.get(id(v))
        if built is not None and built[0] is v:
            return built[1]
        if isinstance(v, Proxy):
            src = cap.proxy_sources.get(id(v))
            if src is not None:
                return self.held_inputs.get(src.expr, src.expr)
            view = self.view_of_input(v)
            if view is not None:
                return view
            key = id(v.node)
            if key not in self._index:
                self._index[key] = len(self.outputs)
                self.outputs.append(v.node)
            return f"__out[{self._index[key]}]"
        if is_constant(v):
            return ns.literal(v)
        if isinstance(v, SymInt):  # a symbolic size: computed from the inputs' shapes on every call
            return python_expr(v.expr, cap.symbol_exprs)
        if id(v) in cap.mirrors:
            return cap.mirrors[id(v)][1].expr
        typ = type(v)
        origin = cap.tuple_origins.get(id(v))
        if origin is not None and origin[0] is v and isinstance(getattr(v, "__dict__", None), dict):
            return origin[1].expr  # an outside NamedTuple subclass's instance: itself, attributes written
        if typ is tuple:
            return "(" + "".join(self.value(x) + ", " for x in v) + ")"
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            built = f"{ns.hold(typ, typ.__name__)}({', '.join(self.value(x) for x in v)})"
            attrs = getattr(v, "__dict__", None)
            if attrs:  # (a subclass of a NamedTuple class has a __dict__)
                attr_src = "{" + ", ".join(f"{k!r}: {self.value(x)}" for k, x in attrs.items()) + "}"
                return self._once(v, f"{ns.hold(with_attributes, 'with_attributes')}({built}, {attr_src})")
            return built
        if isinstance(v, tuple) and hasattr(v, "n_fields"):
            return f"{ns.hold(typ, typ.__name__)}(({''.join(self.value(x) + ', ' for x in v)}))"
        if typ is list:
            return self._once(v, "[" + ", ".join(self.value(x) for x in v) + "]")
        if typ is dict:
            items = ", ".join(f"{self.key(k)}: {self.value(x)}" for k, x in v.items())
            return self._once(v, "{" + items + "}")
        if isinstance(v, NativeCall) and v.owner is not None:
            return f"getattr({self.value(v.owner)}, {v.attr!r})"
        if isinstance(v, types.MethodType):
            src = cap.source_of(v)
            if src is not None:
                return src.expr
            method = ns.hold(types.MethodType, "MethodType")
            return f"{method}({self.value(v.__func__)}, {self.value(v.__self__)})"
        if typ is slice:
            return f"slice({self.value(v.start)}, {self.value(v.stop)}, {self.value(v.step)})"
        src = cap.source_of(v)
        if src is not None:
            return src.expr
        if cap.is_local(v):
            if isinstance(v, torch.nn.Module):
                raise GraphBreak(f"a module {typ.__name__} made inside compiled code outlives the call "
                                 "(returned or stored)")
            if isinstance(v, dict) and typ.__module__ == "collections":
                pairs = ", ".join(f"({self.key(k)}, {self.value(x)})" for k, x in v.items())
                factory = self.value(v.default_factory) if isinstance(v, collections.defaultdict) else "None"
                return self._once(v, f"{ns.hold(rebuild_mapping, 'mapping')}({ns.hold(typ, typ.__name__)}, "
                                     f"[{pairs}], {factory})")
            if isinstance(v, types.FunctionType) and not v.__closure__:
                make = ns.hold(make_function, "make_function")
                kw = "None" if not v.__kwdefaults__ else self.value(dict(v.__kwdefaults__))
                return self._once(v, f"{make}({ns.hold(v.__code__, 'code')}, {ns.hold(v.__globals__, 'G')}, "
                                     f"{self.value(v.__defaults__)}, {kw})")
            if type(v) is functools.partial:  # (its fields are set by its constructor alone)
                args = "".join(f", {self.value(x)}" for x in v.args)
                kw = "".join(f", {k}={self.value(x)}" if k.isidentifier() else
                             f", **{{{k!r}: {self.value(x)}}}" for k, x in v.keywords.items())
                built = f"{ns.hold(functools.partial, 'partial')}({self.value(v.func)}{args}{kw})"
                if v.__dict__:
                    attrs = "{" + ", ".join(f"{k!r}: {self.value(x)}" for k, x in v.__dict__.items()) + "}"
                    built = f"{ns.hold(with_attributes, 'with_attributes')}({built}, {attrs})"
                return self._once(v, built)
            if isinstance(v, collections.deque):
                items = ", ".join(self.value(x) for x in v)
                return self._once(v, f"{ns.hold(typ, typ.__name__)}([{items}], {v.maxlen!r})")
            if isinstance(v, (types.FunctionType, set)):
                raise GraphBreak(f"returning a {typ.__name__} made inside compiled code")
            attrs = getattr(v, "__dict__", None)
            if attrs is None:
                raise GraphBreak(f"returning a {typ.__name__} made inside compiled code")
            attr_src = "{" + ", ".join(f"{k!r}: {self.value(x)}" for k, x in attrs.items()) + "}"
            items_src = "None"
            if isinstance(v, dict):
                items_src = "{" + ", ".join(f"{self.key(k)}: {self.value(x)}" for k, x in v.items()) + "}"
            build = ns.hold(build_object, "build")
            return self._once(v, f"{build}({ns.hold(typ, typ.__name__)}, {attr_src}, {items_src})")
        if isinstance(v, torch.Tensor):
            raise GraphBreak("returning a tensor kiln did not capture")
        owner = getattr(v, "__self__", None)
        if isinstance(v, (types.BuiltinMethodType, types.MethodWrapperType)) and owner is not None and \
                not isinstance(owner, (types.ModuleType, type)):
            # `lst.append` bound to an object rebuilt here (a list made in compiled code): bind the same
            # C method again (not getattr: super().append of a subclass must not find the override)
            klass = next((k for k in type(owner).__mro__ if k.__module__ == "builtins" and
                          v.__name__ in k.__dict__ and v.__qualname__ == f"{k.__qualname__}.{v.__name__}"),
                         None)
            if klass is None:
                raise GraphBreak(f"a bound method {v.__qualname__} kiln cannot rebind")
            method = ns.hold(klass.__dict__[v.__name__], v.__name__)
            return f"{method}.__get__({self.value(owner)})"
        if isinstance(v, SymIter):
            return self._once(v, v.rebuild(self))
        if isinstance(v, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType) + OVERLOADS):
            return ns.hold(v, "obj")
        if isinstance(v, torch.nn.Module):
            return ns.hold(v, "module")
        if isinstance(v, (range, frozenset, bytes, complex)):
            return ns.hold(v, "const")
        raise GraphBreak(f"returning a {typ.__name__} kiln cannot rebuild")

    def view_of_input(self, v: Proxy) -> str | None:
        """A view of a graph input (one eager would return sharing the input's memory) is rebuilt from the
        input itself after the graph ran (and wrote the input back), so it stays a view of it."""
        al = aliases(self.cap.graph)
        root = al.base.get(v)
        chain = al.chain.get(v)
        src = self.cap.proxy_sources.get(id(root)) if root is not None else None
        if chain is None or src is None or not self.cap.graph.mutated_inputs:
            return None
        base = self.held_inputs.get(src.expr, src.expr)
        if has_symbols(chain):  # replayed on the real input after the graph: at these sizes (guarded)
            specialize_all(chain.sizes())
            chain = substitute(chain, self.cap.shape_env.hints)
        return self._once(v, f"{self.cap.ns.hold(chain, 'view')}.apply({base})")

    def key(self, k: Any) -> str:
        if not is_constant(k):
            raise GraphBreak(f"dict key of type {type(k).__name__}")
        return self.cap.ns.literal(k)


def run_with_torch(graph: Any, example_inputs: list) -> Any:
    """The captured graph as torch calls (the eager backend's way): for sizes not compiled yet."""
    return torch_callable(graph)


def compile_for_entry(cap: Capture, graph: Any, compile_graph: Any, inputs: list[str]) -> Any:
    """The compiled graph an entry calls: the backend's, through SymbolicGraph when sizes are symbolic.
    A symbolic size that is no input's dim (an int argument) is passed after the tensors: its source
    expression is appended to `inputs`. Captured under torch.autocast, it runs with autocast off (the
    graph holds autocast's casts)."""
    compiled = _compile_for_entry(cap, graph, compile_graph, inputs)
    return autocast.AutocastOff(compiled) if cap.autocast_entry else compiled


def _compile_for_entry(cap: Capture, graph: Any, compile_graph: Any, inputs: list[str]) -> Any:
    if is_symbolic_graph(graph):
        counters["dynamic_graphs"][graph.name] += 1
        loose = unbound_symbols(graph)
        missing = [s for s in loose if s not in cap.symbol_exprs]
        if missing:
            raise GraphBreak(f"symbolic sizes {missing} of the graph have no source kiln can read")
        inputs.extend(f"({cap.symbol_exprs[s]})" for s in loose)
        return SymbolicGraph(graph, lambda g, examples: compile_segmented(g, examples, compile_graph),
                             graph.name, lambda g, examples: compile_segmented(g, examples, run_with_torch),
                             loose, getattr(compile_graph, "compile_symbolic", None))
    return compile_segmented(graph, [t for _, t, _ in cap.inputs], compile_graph)


def _entry_source(cap: Capture, params: str, body: list[str]) -> str:
    # the guards are written now: a question about a symbolic size asked later would go unchecked
    cap.shape_env.freeze()
    # (the guards' locals must not shadow a parameter, a held object or a name of the body)
    reserved = set(_IDENTIFIER.findall(params + "\n" + "\n".join(body))) | set(cap.ns.values)
    cap.guards.settle()
    exprs = [g.expr for g in cap.guards.guards]
    guard = memo.derived_text("check_expr", repr((exprs, sorted(reserved))),
                              lambda: check_expr(cap.guards.guards, reserved))
    lines = [f"def __entry({params}):",
             "    try:",
             f"        if not ({guard}):",
             "            return __MISS",
             "    except Exception:",
             "        return __MISS"]
    lines += ["    " + line for line in body]
    return "\n".join(lines) + "\n"


def source_reader(cap: Capture, fn: Any, code: types.CodeType) -> Any:
    """reader(expr, *args, **kwargs): the value of a source expression in a call with these arguments
    (automatic dynamic compares an earlier capture's input sizes with a new call's)."""
    _, params, _ = parameters(code)
    env: dict[str, Any] = dict(cap.ns.values)
    exec(compile(f"def __read(__kiln_expr, {params}):\n    return eval(__kiln_expr)\n", "<kiln reader>",
                 "exec"), env)
    reader = env["__read"]
    reader.__defaults__ = fn.__defaults__
    reader.__kwdefaults__ = fn.__kwdefaults__
    return reader


def _checks_source(cap: Capture, params: str) -> str:
    items = [f"    (lambda {params}: ({g.expr}))," for g in cap.guards.guards]
    return "__checks = [\n" + "\n".join(items) + "\n]\n"


def _exec(cap: Capture, source: str, fn: Any, extra: dict[str, Any],
          location: tuple[str, int] | None = None) -> dict[str, Any]:
    """Run the generated source. With `location` (the user's file and line of a graph break), the entry
    function's lines are numbered as that line, so an exception raised by the instruction kiln runs
    natively there shows the user's line in its traceback."""
    env: dict[str, Any] = dict(cap.ns.values)
    env.update(extra)
    # code that inspects its caller's frame (namedtuple's __module__, warnings) sees the user's module
    env["__name__"] = getattr(fn, "__globals__", {}).get("__name__", "__main__")
    env["__MISS"] = MISS
    if location is None:
        code = memo.compile_code(source, f"<kiln entry {getattr(fn, '__qualname__', '?')}>")
    else:
        tree = ast.parse(source)
        for node in ast.walk(tree.body[0]):
            if hasattr(node, "lineno"):
                node.lineno = node.end_lineno = location[1]
        code = memo.compile_code(tree, location[0], f"{source}\n# every line numbered {location[1]}")
    exec(code, env)
    for name, value in env.items():
        if name in ("__entry",) or name == "__checks":
            for f in (value if isinstance(value, list) else [value]):
                f.__defaults__ = fn.__defaults__
                f.__kwdefaults__ = fn.__kwdefaults__
            if name == "__entry" and hasattr(fn, "__qualname__"):
                value.__qualname__ = fn.__qualname__  # a call with bad arguments names the user's function
    return env


def graph_body(cap: Capture, ret: Any) -> tuple[list[str], Reconstructor]:
    """Body lines of a graph entry: call the graph, compute results, replay side effects, return."""
    rec = Reconstructor(cap)
    for source, tensor, by_identity in cap.inputs:
        if by_identity:
            rec.held_inputs[source.expr] = cap.ns.hold(tensor, "input")
    temps: list[str] = []
    writes: list[str] = []
    n = 0

    def temp(expr: str) -> str:
        nonlocal n
        name = f"__v{n}"
        n += 1
        temps.append(f"{name} = {expr}")
        return name
    ret_name = temp(rec.value(ret))
    writes.extend(side_effect_writes(cap, rec, temp))
    return temps + writes + [f"return {ret_name}"], rec


def side_effect_writes(cap: Capture, rec: "Reconstructor", temp: Any) -> list[str]:
    """Statements replaying the capture's pending writes: attributes, globals, cells, lists and dicts.

    Each new value is first bound by `temp` (so every value is computed before any write happens)."""
    writes = []
    for obj, source, name, value in cap.attr_writes.values():
        setter = getattr(type(obj), "__setattr__", None)
        if isinstance(setter, types.FunctionType) and not isinstance(obj, torch.nn.Module) and \
                not isinstance(obj, type):
            # the user's __setattr__ already ran while tracing (it made this write): store the result
            store = cap.ns.hold(object.__setattr__, "object_setattr")
            writes.append(f"{store}({source.expr}, {name!r}, {temp(rec.value(value))})")
        else:
            writes.append(f"setattr({source.expr}, {name!r}, {temp(rec.value(value))})")
    for gdict, source, value in cap.global_writes.values():
        writes.append(f"{source.expr} = {temp(rec.value(value))}")
    for cell, source, value in cap.cell_writes.values():
        writes.append(f"{source.expr} = {temp(rec.value(value))}")
    for copy, source in cap.changed_mirrors():
        if isinstance(copy, list):
            writes.append(f"{source.expr}[:] = {temp(rec.value(list(copy)))}")
        else:
            items = dict(copy)
            tmp = temp("{" + ", ".join(f"{rec.key(k)}: {rec.value(x)}" for k, x in items.items()) + "}")
            writes.append(f"{source.expr}.clear(); {source.expr}.update({tmp})")
    return writes


def check_suspended_generators(cap: Capture) -> None:
    """A generator left suspended inside a try/finally or with-block runs that block when it is collected
    (eagerly: as soon as the frame drops it). kiln cannot time that, so such a frame runs natively."""
    for gen in cap.generators:
        if gen.started and not gen.finished:
            frame = gen.frame
            offset = frame.insts[frame.pc - 1].offset
            if any(start <= offset < end and _runs_on_close(frame, target)
                   for start, end, target, *_ in frame.handlers):
                brk = GraphBreak(f"{gen.describe()} is left suspended inside a try or with block (its cleanup "
                                 "runs when it is collected)", "exhaust or close() the generator")
                brk.resumable = False
                raise brk


def _runs_on_close(frame: Any, target: int) -> bool:
    """Whether the handler at `target` would run code on GeneratorExit: a finally or with cleanup does, a
    chain of `except SomeError:` clauses (all Exception subclasses) does not."""
    i = frame.index[target]
    insts = frame.insts
    if insts[i].opname == "CALL_INTRINSIC_1" and \
            dis._intrinsic_1_descs[insts[i].arg] == "INTRINSIC_STOPITERATION_ERROR":  # type: ignore[attr-defined]
        return False  # (3.12+: the handler around every generator body turns StopIteration into an error)
    if insts[i].opname != "PUSH_EXC_INFO":
        return True
    checked = False
    for j in range(i + 1, min(i + 200, len(insts))):
        inst = insts[j]
        if inst.opname == "RERAISE":
            return not checked
        if inst.opname == "CHECK_EXC_MATCH":
            load = insts[j - 1]
            kind = None
            if load.opname == "LOAD_GLOBAL":
                kind = frame.globals.get(load.argval, frame.builtins.get(load.argval))
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                return True  # a tuple, BaseException or a class kiln cannot resolve: assume it runs
            checked = True
    return True


def make_graph_entry(cap: Capture, fn: Any, code: types.CodeType, ret: Any,
                     compile_graph: Any) -> tuple[Any, list, Any]:
    """Build the graph's output, compile it with the backend, and generate the entry function."""
    graph = cap.graph
    check_suspended_generators(cap)
    _fix_setitem_nodes(graph)
    _guard_mutated_aliasing(cap)
    body, rec = graph_body(cap, ret)
    _, params, _ = parameters(code)
    graph.output(tuple(rec.outputs))
    has_ops = any(n.op in ("call_torch", "call_prim") for n in graph.nodes)
    extra: dict[str, Any] = {}
    if has_ops or rec.outputs:
        inputs = []
        for source, tensor, by_identity in cap.inputs:
            inputs.append(rec.held_inputs[source.expr] if by_identity else source.expr)
        extra["__graph"] = compile_for_entry(cap, graph, compile_graph, inputs)
        body = graph_call(cap, inputs, fn, code, compile_graph, extra) + body
    source = _entry_source(cap, params, body) + _checks_source(cap, params)
    env = _exec(cap, source, fn, extra)
    return env["__entry"], env["__checks"], source


class GraphRaised:
    """What an entry holds when its compiled graph raised before writing into any input: the call is run
    again as plain Python from the frame's start, so the error is eager's own, raised from the user's line
    (with the shapes in eager's message), and the inputs are left as eager leaves them (eager writes the
    in-place updates before the failing op; a compiled graph writes them back only at its end)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error

    def run_eagerly(self, fn: Any, name: str, raise_on_error: bool, *args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)  # bad input raises here, as it does without kiln
        # eager does not raise: the compiled graph was wrong to (a bug in kiln, not in the user's input)
        e = self.error
        counters["graph_errors"][f"{name}: {type(e).__name__}: {e}"] += 1
        if raise_on_error or config.get("raise_on_error"):
            raise e
        if name not in _WARNED_GRAPH_ERRORS:
            _WARNED_GRAPH_ERRORS.add(name)
            warnings.warn(f"kiln: the compiled graph of {name} raised {type(e).__name__}: {e}, where eager "
                          "does not; this call ran eagerly", RuntimeWarning, stacklevel=3)
        return result


_WARNED_GRAPH_ERRORS: set[str] = set()


def input_versions(*tensors: torch.Tensor) -> tuple | None:
    """The version counters of the inputs a graph updates in place; None when one has none (an inference
    tensor), so it is unknown whether a failed graph already wrote it."""
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:
        return None


def graph_call(cap: Capture, inputs: list[str], fn: Any, code: types.CodeType, compile_graph: Any,
               extra: dict[str, Any]) -> list[str]:
    """Entry lines calling the compiled graph `__graph` on `inputs` into `__out`. When a graph one of
    kiln's backends compiled raises and could not have changed anything yet — no input it updates has been
    written (their version counters), no random number drawn — the call runs again natively
    (GraphRaised); otherwise the error propagates as the graph raised it, with a note naming the user's
    lines the graph was captured from."""
    graph = cap.graph
    name = getattr(fn, "__qualname__", code.co_name)
    backend = getattr(compile_graph, "backend", compile_graph)
    # (a user's backend raising is the user's to see; kiln second-guesses only graphs it compiled itself)
    rerun = getattr(backend, "__module__", "").startswith("kiln.") and \
        not any(is_random_target(n.target) for n in graph.nodes if n.op == "call_torch")
    mutated = [inputs[i] for i, ph in enumerate(graph.placeholders) if ph.name in graph.mutated_inputs]
    _, _, forward = parameters(code)
    raise_on_error = bool(getattr(getattr(compile_graph, "context", None), "raise_on_error", False))
    extra.update(__GraphRaised=GraphRaised, __input_versions=input_versions, __native=fn,
                 __graph_note=_graph_note(graph, name))
    versions = f"__input_versions({', '.join(mutated)})"
    lines = [f"__versions = {versions}"] if rerun and mutated else []
    lines += ["try:", f"    __out = __graph({', '.join(inputs)})", "except Exception as __e:"]
    if rerun and mutated:
        lines += [f"    if __versions is None or {versions} != __versions:",
                  "        __e.add_note(__graph_note)", "        raise"]
    if rerun:
        lines += ["    __out = __GraphRaised(__e)",
                  "if type(__out) is __GraphRaised:",
                  f"    return __out.run_eagerly(__native, {name!r}, {raise_on_error}, {', '.join(forward)})"]
    else:
        lines += ["    __e.add_note(__graph_note)", "    raise"]
    return lines


def _graph_note(graph: Any, name: str) -> str:
    """The note an error raised by a compiled graph gets: the user's lines its nodes were captured from."""
    origins = list(dict.fromkeys(n.origin for n in graph.nodes if n.origin))
    where = f" (captured from {', '.join(origins)})" if origins else ""
    return f"kiln: raised while running the compiled graph of {name}{where}"


def setitem(tensor: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """`tensor[index] = value`, returning the updated tensor (torch's __setitem__ returns None, but the
    captured graph uses the node as the tensor's new value)."""
    tensor[index] = value
    return tensor


def _fix_setitem_nodes(graph: Any) -> None:
    for node in graph.nodes:
        if node.op == "call_torch" and node.target is torch.Tensor.__setitem__:
            node.target = setitem


def _guard_mutated_aliasing(cap: Capture) -> None:
    """A graph that updates an input in place is only valid when no other input shares its memory."""
    if not cap.graph.mutated_inputs:
        return
    names = [ph.name for ph in cap.graph.placeholders]
    updated = [i for i in range(len(cap.inputs)) if names[i] in cap.graph.mutated_inputs]
    for i in updated:
        source, tensor, _ = cap.inputs[i]
        for j, (other, other_tensor, _) in enumerate(cap.inputs):
            if j != i and tensor.untyped_storage().data_ptr() == other_tensor.untyped_storage().data_ptr():
                raise GraphBreak(f"{source.name} is updated in place and shares memory with {other.name}",
                                 "kiln runs code that updates aliased inputs eagerly")
    if len(cap.inputs) < 2:
        return
    check = cap.ns.hold(storages_apart, "storages_apart")
    exprs = "".join(f"{source.expr}, " for source, _, _ in cap.inputs)
    updated_names = ", ".join(cap.inputs[i][0].name for i in updated)
    cap.guards.add(f"{check}(({exprs}), {tuple(updated)!r})",
                   f"{updated_names} (updated in place) share memory with no other input", "alias")


def make_eager_entry(cap: Capture, fn: Any, code: types.CodeType) -> tuple[Any, list, str]:
    """An entry that runs the original function (the frame broke) when the same guards hold."""
    _, params, forward = parameters(code)
    extra: dict[str, Any] = {"__fn": fn}
    body = [f"return __fn({', '.join(forward)})"]
    source = _entry_source(cap, params, body) + _checks_source(cap, params)
    env = _exec(cap, source, fn, extra)
    return env["__entry"], env["__checks"], source


class _NoSelf:
    pass


_NO_SELF = _NoSelf()
NO_SELF = _NO_SELF
