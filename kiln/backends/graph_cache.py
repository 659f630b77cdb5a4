"""The graph cache: a compiled graph's wrapper kept on disk beside its kernels, so that a new process that
compiles the same graph again skips the whole pipeline (prims, lowering, fusion, planning, C++ generation)
and only loads the shared object and runs the stored wrapper source.

A graph's key hashes everything its compile reads:
  - the graph, node by node: op, target (by a name that resolves back to the very object), arguments,
    metas, decompositions (recursively), origins, the inputs it mutates;
  - the example inputs' layouts (shape, strides, dtype, device, storage offset, requires_grad);
  - the compile's context and every flag the passes read, the backend's Target, grad and inference mode,
    the default dtype;
  - torch's and Python's versions, the C++ compiler and its flags, and the text of kiln's own sources.
A graph the key cannot describe exactly is not cached, and counted under `counters["cache"]` with the
reason: symbolic sizes, a target that no importable name resolves to, an argument of another kind (a large
tensor constant, an arbitrary object). The value is the wrapper's source and compiled code, the segments'
entry points (name, pointer count, size count), the wrapper's constants (pickled; a constant that does not
come back as the same object or an equal value is refused at store time), the shared object's key and the
counters the compile added (a hit adds them again, so `kiln.explain` and the counters read as after a cold
compile).

Entries are `<key>.graph` files in the kernel cache directory, written, trusted and evicted as the `.so`
entries are (`kiln.runtime.cache`): same owner and mode checks, same sha256 trailer, same size cap.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import importlib
import io
import marshal
import pickle
import sys
import types
from typing import Any, Callable

import torch

from .. import config
from ..counters import counters
from ..graph import Graph
from ..graph.memo import kiln_source_digest
from ..graph.meta import TensorMeta
from ..graph.interpreter import run
from ..graph.node import Node
from ..graph.specialize import size_bindings, specialize_graph
from ..prims.registry import PRIMS, Prim
from ..runtime import cache
from ..runtime.build import compiler_version, find_compiler, flags, libraries

log = config.channel("cache")

FORMAT = "kiln graph entry v1"
SUFFIX = ".graph"
MAX_CONSTANT_BYTES = 1 << 16  # a tensor constant larger than this makes its graph uncacheable
# flags the compile never reads (or reads at run time, where a hit reads them too)
_RUNTIME_FLAGS = frozenset({"logs", "cache_dir", "cache_max_bytes", "fuel_report", "pool_max_bytes",
                            "graph_cache", "recompile_limit"})


class Uncacheable(Exception):
    """The key cannot describe this graph exactly; the reason is counted."""


def enabled(context: Any) -> bool:
    dumping = context.flag("debug_dir") or context.flag("trace_dir")  # (both want every pass's output)
    return bool(context.flag("graph_cache")) and not dumping and \
        not context.options.get("profile", False) and context.flag("fuel") < 0


# ---- the key ---------------------------------------------------------------------------------------------

def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


_TARGET_NAMES: dict[int, tuple[Any, str]] = {}


def target_name(fn: Any) -> str:
    """A name that resolves back to `fn` itself, or Uncacheable."""
    held = _TARGET_NAMES.get(id(fn))
    if held is not None and held[0] is fn:
        return held[1]
    name = _find_name(fn)
    _TARGET_NAMES[id(fn)] = (fn, name)
    return name


def _find_name(fn: Any) -> str:
    if isinstance(fn, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        if isinstance(fn, torch._ops.OpOverload):  # "aten::add" and "Tensor"
            qualified, overload = fn._schema.name, fn._overloadname
        else:
            qualified, overload = fn._qualified_op_name, None
        namespace, _, op = qualified.partition("::")
        found: Any = getattr(getattr(torch.ops, namespace), op)
        if overload is not None:
            found = getattr(found, overload)
        text = qualified if overload is None else f"{qualified}.{overload}"
        if found is fn:
            return "op:" + text
        raise Uncacheable(f"op {text} does not resolve to itself")
    if isinstance(fn, Prim):
        if PRIMS.get(fn.name) is fn:
            return "prim:" + fn.name
        raise Uncacheable(f"prim {fn.name} is not the registered one")
    owner = getattr(fn, "__objclass__", None)  # a method descriptor (torch.Tensor.add)
    if owner is not None and getattr(owner, fn.__name__, None) is fn:
        return f"method:{target_name(owner)}.{fn.__name__}"
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module is None and isinstance(fn, types.BuiltinFunctionType) and isinstance(fn.__self__, types.ModuleType):
        module = fn.__self__.__name__
    if module and qualname and "<" not in qualname:
        try:
            if _resolve(module, qualname) is fn:
                return f"py:{module}:{qualname}"
        except (ImportError, AttributeError):
            pass
    for module_name in ("torch", "torch.nn.functional", "torch.Tensor", "operator", "math", "builtins"):
        name = getattr(fn, "__name__", None)
        try:
            if name and _resolve_module_attr(module_name, name) is fn:
                return f"py:{module_name}:{name}"
        except (ImportError, AttributeError):
            pass
    raise Uncacheable(f"target {fn!r} has no name that resolves to it")


def _resolve_module_attr(module_name: str, name: str) -> Any:
    if module_name == "torch.Tensor":
        return getattr(torch.Tensor, name)
    return getattr(importlib.import_module(module_name), name)


_PLAIN = frozenset({bool, int, float, complex, str, bytes, type(None)})
_SEQUENCES = {tuple: "tuple", list: "list", torch.Size: "Size"}


def _value(v: Any) -> Any:
    """A hashable, process-independent description of an argument, a meta or a flag's value."""
    t = type(v)
    if t in _PLAIN:  # (the key marshals the whole: 1, True, 1.0 and '1' stay apart)
        return v
    if t is Node:
        return ("node", v.name)
    sequence = _SEQUENCES.get(t)
    if sequence is not None:  # (plain items inline: a graph's key describes ~70k values)
        return (sequence, tuple([x if type(x) in _PLAIN else _value(x) for x in v]))
    if t is dict:
        return ("dict", tuple([(_value(k), _value(x)) for k, x in v.items()]))
    if t in (set, frozenset):
        return (t.__name__, tuple(sorted(repr(_value(x)) for x in v)))
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return ("torch", str(v))
    if t is slice:
        return ("slice", _value(v.start), _value(v.stop), _value(v.step))
    if v is Ellipsis:
        return ("...",)
    if t is TensorMeta:
        return ("meta", _value(v.shape), _value(v.strides), str(v.dtype), str(v.device), v.requires_grad,
                _value(v.storage_offset))
    if isinstance(v, torch.Tensor):
        return _tensor(v)
    if isinstance(v, enum.Enum):
        return ("enum", target_name(type(v)), v.name)
    if isinstance(v, type):
        return ("type", target_name(v))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return ("dataclass", target_name(type(v)),
                tuple((f.name, _value(getattr(v, f.name))) for f in dataclasses.fields(v)))
    if callable(v):
        return ("fn", target_name(v))
    raise Uncacheable(f"an argument of type {t.__module__}.{t.__qualname__}")


def _tensor(t: torch.Tensor) -> tuple:
    if t.layout != torch.strided or t.device.type != "cpu" or t.is_quantized or t.is_neg() or t.is_conj():
        raise Uncacheable("a tensor constant that is not a plain CPU tensor")
    nbytes = t.untyped_storage().nbytes()
    if nbytes > MAX_CONSTANT_BYTES:
        raise Uncacheable(f"a tensor constant of {nbytes} bytes")
    data = bytes(t.untyped_storage())
    return ("tensor", tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype), t.requires_grad,
            hashlib.sha256(data).hexdigest())


def _graph(graph: Graph) -> tuple:
    nodes = []
    for n in graph.nodes:
        if n.op in ("call_prim", "call_torch"):
            target = target_name(n.target)
        elif n.op == "constant":
            target = _value(n.target)
        else:
            target = _value(n.target)
        decomposition = _graph(n.decomposition) if n.decomposition is not None else None
        nodes.append((n.name, n.op, target, _value(n.args), _value(n.kwargs), _value(n.meta), decomposition,
                      n.origin))
    mutated = tuple((k, v.name) for k, v in graph.mutated_inputs.items())
    return (graph.name, tuple(nodes), mutated)


def _example(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), tuple(v.stride()), v.storage_offset(), str(v.dtype), str(v.device),
                v.requires_grad, v.layout == torch.strided)
    if type(v) in (tuple, list):
        return tuple(_example(x) for x in v)
    if type(v) in _PLAIN:
        return (type(v).__name__, repr(v))
    raise Uncacheable(f"an example input of type {type(v).__qualname__}")


@functools.lru_cache(maxsize=None)
def _toolchain(cxx: str) -> tuple:
    compiler = find_compiler(cxx)
    return (compiler, compiler_version(compiler), tuple(flags() + libraries()))


def graph_key(graph: Graph, example_inputs: list, context: Any, target: Any) -> str:
    """The graph's key (32 hex digits); raises Uncacheable where the key cannot describe it exactly."""
    flags = tuple((name, _value(context.flag(name))) for name in config.flag_names() if name not in _RUNTIME_FLAGS)
    parts = (FORMAT, kiln_source_digest(), str(torch.__version__), sys.version, _toolchain(config.get("cxx")),
             _value(target), _value(context.key()), flags, torch.is_grad_enabled(),
             torch.is_inference_mode_enabled(), str(torch.get_default_dtype()), _graph(graph),
             _example(list(example_inputs)))
    # marshal's version 2 writes only structure and values (no references to repeated objects), so equal
    # descriptions give equal bytes; ~8x faster than repr() on the ~0.8 MB description of a large graph
    try:
        data = marshal.dumps(parts, 2)
    except ValueError as e:
        raise Uncacheable(f"the key's description holds a value marshal cannot write ({e})") from None
    return hashlib.sha256(data).hexdigest()[:cache.KEY_DIGITS]


def torch_fallback(graph: Graph, symbolic: bool) -> Callable[..., Any]:
    """What the wrapper runs when an input's layout differs from the compile's: the graph, with torch."""
    bindings = size_bindings(graph) if symbolic else []

    def fallback(*inputs: Any) -> Any:
        counters["cpp"]["input layout changed: ran the graph with torch"] += 1
        if bindings:  # a graph compiled for every size: run with torch at this call's sizes
            values = {sym: inputs[i].shape[d] for sym, i, d in bindings}
            return run(specialize_graph(graph, values), inputs, torch_level=True)
        return run(graph, inputs, torch_level=True)
    return fallback


# ---- entries ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Entry:
    """What a hit needs: the wrapper, its constants, its segments' entry points and its kernels' key."""
    wrapper_source: str
    constants: dict[str, Any]
    entries: list[tuple[str, str, int, int]]  # (wrapper global, C symbol, pointer count, size count)
    library_key: str | None  # the .so entry (None: the graph has no kernels)
    counted: dict[str, dict[str, int]]  # counters the compile added, outside "cache"
    # the wrapper compiled, marshalled (the key names Python's version): compile() of a large model's
    # wrapper is ~10 ms of a hit, loading it 0.2 ms
    wrapper_code: bytes | None = None


def counter_snapshot() -> dict[str, collections.Counter]:
    return {k: collections.Counter(v) for k, v in counters.items()}


def counted_since(before: dict[str, collections.Counter]) -> dict[str, dict[str, int]]:
    added = {}
    for category, now in counters.items():
        if category == "cache":
            continue
        delta = now - before.get(category, collections.Counter())
        if delta:
            added[category] = dict(delta)
    return added


def load(key: str) -> Entry | None:
    """The entry of `key`, or None (no entry, or one refused: counted, and compiled afresh)."""
    data = cache.read_entry(key, SUFFIX, refused="graph entries refused")
    if data is None:
        log.info("graph cache miss %s", key)
        return None
    try:
        entry = pickle.loads(data)
    except Exception as e:  # an entry of an older layout, a constant whose module is gone
        counters["cache"]["graph entries refused"] += 1
        log.info("graph entry %s does not load: %s", key, e)
        return None
    if not isinstance(entry, Entry):
        counters["cache"]["graph entries refused"] += 1
        return None
    path = cache.entry_path(cache.directory(), key, SUFFIX)
    cache.touch(path)
    log.info("graph cache hit %s", path)
    return entry


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            a.stride() == b.stride() and bool(torch.equal(a, b))
    if callable(a) or isinstance(a, (types.ModuleType, type)):
        return a is b or (type(a) is type(b) and hasattr(a, "__dict__") and _same(vars(a), vars(b)))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def prim_ref(name: str) -> Callable[..., Any]:
    """A prim's torch implementation (an extern's target), by the prim's name."""
    return PRIMS[name].ref


def op_overload(namespace: str, name: str, overload: str) -> torch._ops.OpOverload:
    """torch.ops.<namespace>.<name>.<overload> (a fallback's target; a custom operator's library must be
    loaded again for its entry to load)."""
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


class _Pickler(pickle.Pickler):
    """Pickles a prim's implementation (often a lambda) by its prim's name, and an operator overload (which
    does not pickle) by its qualified name."""

    def __init__(self, file: Any):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs = {id(p.ref): name for name, p in PRIMS.items()}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType):
            name = self.refs.get(id(obj))
            if name is not None and PRIMS[name].ref is obj:
                return prim_ref, (name,)
        if isinstance(obj, torch._ops.OpOverload):
            return op_overload, (obj.namespace, obj._schema.name.split("::", 1)[1], obj._overloadname)
        return NotImplemented


def _dumps(value: Any) -> bytes:
    out = io.BytesIO()
    _Pickler(out).dump(value)
    return out.getvalue()


def store(key: str, entry: Entry) -> str | None:
    """Write the entry; returns why it was not stored (a constant that does not pickle back), else None."""
    try:
        data = _dumps(entry)
        back = pickle.loads(data)
    except Exception as e:
        return f"a wrapper constant does not pickle ({type(e).__name__})"
    for name, value in entry.constants.items():
        if not _same(value, back.constants.get(name)):
            return f"wrapper constant {name} ({type(value).__qualname__}) does not pickle back as itself"
    if b"sympy" in data:
        return "a wrapper constant holds a sympy expression"
    try:
        cache.write_entry(cache.directory(), key, data, SUFFIX)
    except OSError as e:
        return f"writing it failed: {e.strerror or e}"
    log.info("graph cache wrote %s", cache.entry_path(cache.directory(), key, SUFFIX))
    return None
