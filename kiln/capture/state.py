"""The state of one capture, shared by the frames it inlines: the graph being built, the sources and
guards of every value read from outside, and the side effects to replay after the graph runs.

Values are plain Python objects: `Proxy` for tensors, real constants, containers holding symbolic values,
and the program's own modules, functions and objects. Values from outside get a source (a way to reload
them) and a guard when they are read. Outside containers are copied on read ("mirrors"), outside
attributes, globals and closure cells are written to overlays, so capture never changes the program's
state; the generated entry function replays the changes after the graph runs.
"""
from __future__ import annotations

import collections
import enum
import types
from typing import Any

import torch

from ..graph import Graph, Proxy, TensorMeta, Tracer, dense_strides
from ..graph import layout
from ..graph.layout import strides_in_order
from ..graph.symbolic import ShapeEnv, dim_text, min_size, python_expr, substitute
from ..ops.overlap import borrow
from ..ops.standins import strided_copy
from ..ops.registry import aliases
from .errors import GraphBreak, RaisedError
from .guards import GuardSet, is_constant
from .sources import Namespace, Source

_MODULE_TYPES = (torch.nn.Module,)
_OPERATOR_TYPES = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)  # (guarded by identity)
_IMMUTABLE_MODULES = ("torch", "math", "builtins", "operator", "functools", "itertools", "collections",
                      "typing", "numbers", "inspect", "warnings", "dataclasses", "enum", "abc", "types",
                      "copy", "numpy", "transformers", "contextlib", "logging", "os", "sys", "re")


def trusted_module(mod: types.ModuleType) -> bool:
    """Library modules whose attributes kiln treats as fixed (their reads are not guarded)."""
    return mod.__name__.split(".")[0] in _IMMUTABLE_MODULES


class Capture:
    """Everything one capture of one frame collects."""

    def __init__(self, name: str, root: Any = None, dynamic: bool | None = None,
                 dynamic_dims: "dict[tuple[str, int], int] | None" = None,
                 options: "dict[str, Any] | None" = None):
        self.ns = Namespace()
        self.guards = GuardSet(self.ns)
        # symbolic sizes: `dynamic` is compile's flag (True: every input dim; False: none; None: the dims
        # marked with kiln.mark_dynamic and those `dynamic_dims` names, after a recompile they caused, each
        # with the least size its symbol stands for)
        self.dynamic = dynamic
        self.dynamic_dims = dynamic_dims or {}
        self.shape_env = ShapeEnv()
        self.shape_env.on_fact = self._shape_fact
        self.symbol_exprs: dict[Any, str] = {}  # symbol -> its first source's expression (`x.shape[1]`)
        self.symbol_names: dict[Any, str] = {}  # symbol -> readable (`x.size(1)`)
        self.int_inputs: list[tuple[Source, int]] = []  # ints read from outside, guarded as constants
        self.alias_inputs: list[tuple[Source, tuple]] = []  # (source, shape): another source's tensor
        self.graph = Graph(name)
        self.tracer = Tracer(self.graph, options=options)  # (options: the compile's config flags)
        # its graphs serve later calls with other values: ops whose output shape depends on the values
        # (x[mask], nonzero) are refused (kiln.ops.registry), so they run outside the graph
        self.tracer.static_shapes = True
        self.tracer.sourced = True  # (every tensor through a guarded source: kiln.ops.record._lift)
        self.sources: dict[int, tuple[Any, Source]] = {}
        self.tensor_proxies: dict[int, Proxy] = {}
        self.proxy_sources: dict[int, Source] = {}
        self.param_proxies: set[int] = set()
        self.inputs: list[tuple[Source, torch.Tensor, bool]] = []  # (source, tensor, by identity)
        self.mirrors: dict[int, tuple[Any, Source, list]] = {}  # id(copy) -> (copy, source, snapshot)
        self.local_objects: dict[int, Any] = {}
        self.local_cells: dict[int, Any] = {}
        self.attr_writes: dict[tuple[int, str], tuple[Any, Source, str, Any]] = {}
        self.global_writes: dict[tuple[int, str], tuple[dict, Source, Any]] = {}
        self.cell_writes: dict[int, tuple[Any, Source, Any]] = {}
        self.keep: list[Any] = []
        self.example_storages: set[int] = set()  # the memory of the inputs whose examples are themselves
        self.mirror_of: dict[int, Any] = {}  # id(outside list/dict) -> its copy
        # an outside tuple is traced as a tuple of traced items: id(outside) -> (copy, source, outside), and
        # the same keyed by id(copy) (id() of the copy is the outside tuple's id)
        self.tuple_copies: dict[int, tuple[Any, Source, Any]] = {}
        self.tuple_origins: dict[int, tuple[Any, Source, Any]] = {}
        self.root = root
        self.autocast_entry: tuple = ()  # torch.autocast's state when the frame was entered (guarded)
        self.autocast_saved: tuple = ()  # all of it (kiln.ops.autocast.saved), guarded when code reads it
        self._module_paths: dict[int, Source] | None = None
        self.grad_changes = 0
        self.generators: list[Any] = []  # GeneratorValues made in this capture

    # ---- reading values from outside ----
    def wrap(self, value: Any, source: Source) -> Any:
        """The symbolic value for an outside value found at `source`, guarded as it is read."""
        if isinstance(value, torch.Tensor):
            return self._wrap_tensor(value, source)
        if type(value) is int and self._dynamic_int(source, value):
            return self._symbolic_int(source, value)
        if is_constant(value):
            if type(value) is int:
                self.int_inputs.append((source, value))
            self.guards.constant(source, value)
            return value
        known = self.sources.get(id(value))
        if known is not None and known[0] is value:
            if known[1].expr != source.expr:
                self.guards.add(f"{source.expr} is {known[1].expr}", f"{source.name} is {known[1].name}",
                                "alias")
            return value
        typ = type(value)
        mirror = self.mirror_of.get(id(value))
        if mirror is not None:
            return mirror
        if typ is tuple or (isinstance(value, tuple) and hasattr(value, "_fields")):
            copied = self.tuple_copies.get(id(value))
            if copied is not None and copied[2] is value:
                # the same outside tuple read again is the same traced tuple (`T is T`), guarded to stay so
                if copied[1].expr != source.expr:
                    self.guards.add(f"{source.expr} is {copied[1].expr}", f"{source.name} is {copied[1].name}",
                                    "alias")
                return copied[0]
            self.guards.length(source, value)
            items = [self.wrap(v, source.item(i)) for i, v in enumerate(value)]
            copy = tuple(items) if typ is tuple else typ(*items)
            self.tuple_copies[id(value)] = (copy, source, value)
            self.tuple_origins[id(copy)] = (copy, source, value)
            attrs = getattr(value, "__dict__", None)
            if isinstance(attrs, dict):  # a subclass of a NamedTuple class: its own attributes too
                self.guards.keys(source.attr("__dict__"), attrs)
                copy.__dict__.update({k: self.wrap(v, source.attr(k)) for k, v in attrs.items()})
            return copy
        if typ is list:
            self.guards.length(source, value)
            copy: Any = []
            self._mirror(copy, source, value)
            copy.extend(self.wrap(v, source.item(i)) for i, v in enumerate(value))
            self.mirrors[id(copy)] = (copy, source, list(copy))
            return copy
        if typ is dict or (isinstance(value, dict) and typ.__module__ == "collections"):
            if not all(is_constant(k) or _fixed_key(k) for k in value):
                raise GraphBreak(f"dict {source.name} has keys kiln does not guard", "")
            self.guards.keys(source, value)
            copy = typ()
            self._mirror(copy, source, value)
            # the builtin base's __setitem__: Counter.update would add counts, OrderedDict keeps its order
            setitem = collections.OrderedDict.__setitem__ if isinstance(copy, collections.OrderedDict) \
                else dict.__setitem__
            for k, v in value.items():
                setitem(copy, k, self.wrap(v, source.item(k, None if is_constant(k) else self.ns)))
            self.mirrors[id(copy)] = (copy, source, list(copy.items()))
            return copy
        if isinstance(value, (set, frozenset)):
            if all(is_constant(v) for v in value):
                self.guards.type_of(source, value)
                self.guards.add(f"{source.expr} == {self.ns.literal(frozenset(value))}",
                                f"{source.name} == {value!r}", "constant")
                return set(value) if typ is set else value
            raise GraphBreak(f"set {source.name} holds values kiln does not guard")
        if isinstance(value, types.BuiltinMethodType) and isinstance(value.__self__, type):
            # a classmethod of a C type (`chain.from_iterable`): a new bound object on every read
            self.guards.identity(source.attr("__self__"), value.__self__)
            self.guards.constant(source.attr("__name__"), value.__name__)
        elif isinstance(value, (_MODULE_TYPES + (types.FunctionType, types.BuiltinFunctionType, type,
                                                  types.ModuleType) + _OPERATOR_TYPES)):
            self.guards.identity(source, value)
        elif isinstance(value, types.MethodType):
            self.guards.identity(source.attr("__func__"), value.__func__)
            self.wrap(value.__self__, source.attr("__self__"))
        else:
            self.guards.type_of(source, value)
        self.register(value, source)
        return value

    def register(self, value: Any, source: Source) -> None:
        if id(value) not in self.sources:
            self.sources[id(value)] = (value, source)

    def source_of(self, value: Any) -> Source | None:
        known = self.sources.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        if isinstance(value, torch.nn.Module) and self.root is not None:
            src = self.module_paths().get(id(value))
            if src is not None:
                self.wrap(value, src)
                return src
        return None

    def module_paths(self) -> dict[int, Source]:
        """Sources of every submodule of the compiled module (for modules reached by native calls)."""
        if self._module_paths is None:
            self._module_paths = {}
            root_src = self.source_of(self.root)
            if root_src is not None:
                stack = [(self.root, root_src)]
                while stack:
                    mod, src = stack.pop()
                    for name, child in mod._modules.items():
                        if child is not None and id(child) not in self._module_paths:
                            child_src = src.attr("_modules").item(name)
                            self._module_paths[id(child)] = child_src
                            stack.append((child, child_src))
        return self._module_paths

    def _wrap_tensor(self, t: torch.Tensor, source: Source) -> Proxy:
        known = self.tensor_proxies.get(id(t))
        if known is not None:
            first = self.proxy_sources.get(id(known))
            if first is not None and first.expr != source.expr:
                self.guards.add(f"{source.expr} is {first.expr}", f"{source.name} is {first.name}", "alias")
                self.alias_inputs.append((source, tuple(t.shape)))  # (automatic dynamic compares it too)
            return known
        if t.is_nested:  # (before the guards, which read sizes a nested tensor does not have)
            raise GraphBreak(f"{source.name} is a nested tensor; kiln captures plain strided tensors")
        by_identity = isinstance(t, torch.nn.Parameter) or source.in_module() or source.kind == "global"
        meta = None if by_identity else self._symbolic_meta(source, t)
        if by_identity:
            self.guards.parameter(source, t)
        elif meta is not None:
            self._guard_symbolic_tensor(source, t, meta)
        else:
            self.guards.tensor(source, t)
        if t.layout != torch.strided or t.is_sparse or t.is_quantized or type(t) not in (torch.Tensor,
                                                                                          torch.nn.Parameter):
            raise GraphBreak(f"{source.name} is a {type(t).__name__} with layout {t.layout}; kiln captures "
                             "plain strided tensors")
        name = source.name
        for part in ("._modules[", "._parameters[", "._buffers[", "["):
            name = name.replace(part, ".")
        name = "".join(c if c.isalnum() else "_" for c in name).strip("_")
        while "__" in name:
            name = name.replace("__", "_")
        name = name.removeprefix("self_") or "input"
        with torch.no_grad():
            example = self._example_of(t)
        node = self.graph.placeholder(name[-48:].strip("_"), meta if meta is not None else TensorMeta.of(t))
        proxy = Proxy(node, example=example)
        aliases(self.graph).input_name[proxy] = node.name
        self.tensor_proxies[id(t)] = proxy
        self.proxy_sources[id(proxy)] = source
        if isinstance(t, torch.nn.Parameter):
            self.param_proxies.add(id(proxy))
        self.inputs.append((source, t, by_identity))
        self.keep.extend((t, proxy))
        return proxy

    # ---- symbolic sizes ----
    def _dynamic_dims_of(self, source: Source, t: torch.Tensor) -> list[int]:
        if self.dynamic is False or type(t) is not torch.Tensor or t.layout != torch.strided:
            return []
        static = getattr(t, "_kiln_static_dims", ())
        marked = getattr(t, "_kiln_dynamic_dims", ())
        return [d for d in range(t.dim()) if d not in static and
                (self.dynamic is True or d in marked or (source.expr, d) in self.dynamic_dims)]

    def _symbolic_meta(self, source: Source, t: torch.Tensor) -> TensorMeta | None:
        """The meta of an input with symbolic sizes in its dynamic dims (None: all static). Strides become
        expressions when the layout is a dense permutation (contiguous, transposed); any other layout
        keeps the tensor static."""
        dims = self._dynamic_dims_of(source, t)
        if not dims or not (t.is_contiguous() or dense_strides(t.shape, t.stride())):
            return None
        shape: list[Any] = list(t.shape)
        for d in dims:
            one = self.dynamic_dims.get((source.expr, d)) == 1
            shape[d] = self.shape_env.size(int(t.shape[d]), f"{source.name}.size({d})", one=one)
            sym = getattr(shape[d], "expr", None)
            if sym is not None and sym not in self.symbol_exprs:
                self.symbol_exprs[sym] = f"{source.expr}.shape[{d}]"
                self.symbol_names[sym] = f"{source.name}.size({d})"
        if all(isinstance(s, int) for s in shape):
            return None
        order = sorted(range(t.dim()), key=lambda d: (t.stride(d), -d))
        strides = strides_in_order(shape, order)
        if tuple(substitute(strides, self.shape_env.hints)) != tuple(t.stride()):
            return None  # (a size-1 dim placed oddly): not worth a symbolic layout
        return TensorMeta(tuple(shape), t.dtype, t.device, strides, t.requires_grad, t.storage_offset())

    def _dynamic_int(self, source: Source, value: int) -> bool:
        """An int argument is symbolic with dynamic=True, or after a recompile its change caused."""
        if self.dynamic is False or value < 2 or source.kind not in ("local", "item", "attr"):
            return False
        return self.dynamic is True and source.kind == "local" or (source.expr, -1) in self.dynamic_dims

    def _symbolic_int(self, source: Source, value: int) -> Any:
        size = self.shape_env.size(value, source.name)
        sym = size.expr
        if sym not in self.symbol_exprs:
            self.symbol_exprs[sym] = source.expr
            self.symbol_names[sym] = source.name
            self.guards.add(f"type({source.expr}) is int and {source.expr} >= 2",
                            f"{source.name}: int >= 2 (symbolic {sym})", "shape")
        else:
            first = self.symbol_exprs[sym]
            self.guards.add(f"type({source.expr}) is int and {source.expr} == {first}",
                            f"{source.name} == {self.symbol_names[sym]}", "shape")
        return size

    def _guard_symbolic_tensor(self, source: Source, t: torch.Tensor, meta: TensorMeta) -> None:
        e = source.expr
        typ = self.ns.hold(type(t), "type")
        dtype = self.ns.hold(t.dtype, "dtype")
        device = self.ns.hold(t.device, "device")
        parts = [f"type({e}) is {typ} and {e}.dtype is {dtype} and {e}.dim() == {t.dim()} and "
                 f"{e}.requires_grad is {t.requires_grad} and {e}.device == {device}"]
        shown = []
        for d, size in enumerate(meta.shape):
            sym = getattr(size, "expr", None)
            if sym is None:
                parts.append(f"{e}.shape[{d}] == {size}")
                shown.append(str(size))
                continue
            first = self.symbol_exprs[sym]
            if first == f"{e}.shape[{d}]":
                parts.append(f"{e}.shape[{d}] >= {min_size(sym)}")
            else:
                parts.append(f"{e}.shape[{d}] == {first}")
            shown.append(str(sym))
        strides = ", ".join(str(st) if isinstance(st, int) else python_expr(st.expr, self.symbol_exprs)
                            for st in meta.strides)
        parts.append(f"{e}.stride() == ({strides}{',' if len(meta.strides) == 1 else ''})")
        self.guards.add(" and ".join(parts),
                        f"{source.name}: {type(t).__name__} {str(t.dtype).removeprefix('torch.')}"
                        f"[{', '.join(shown)}] strides=({', '.join(dim_text(st) for st in meta.strides)}) device={t.device} "
                        f"requires_grad={t.requires_grad}", "tensor")

    def _example_of(self, t: torch.Tensor) -> torch.Tensor:
        """What the ops of the capture run on for input `t`: `t` itself, detached and borrowed (a run that
        could write it copies it first), when its elements are distinct memory and no input before it shares
        that memory. Else a copy with its strides, so that two inputs over one storage stay apart as eager's
        separate tensors are (an expanded tensor's copy is dense). Copying every input, as capture did, held
        a second copy of the model's weights while tracing: 1.6 GiB more for a 2 GiB LLaMA."""
        d = t.detach()
        storage = d.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() > 0 and key not in self.example_storages and \
                layout.is_non_overlapping(tuple(d.shape), tuple(d.stride())):
            self.example_storages.add(key)
            return borrow(d)
        if t.numel() >= 1 << 24:
            return borrow(d)  # (too big to copy: the input itself)
        return strided_copy(d)

    def _shape_fact(self, fact: Any) -> None:
        """A fact the capture relied on about symbolic sizes becomes a guard (the tensor guards that bind its
        symbols come first: a symbol exists only once its tensor was read)."""
        self.guards.add(python_expr(fact, self.symbol_exprs), python_expr(fact, self.symbol_names), "shape")

    def _mirror(self, copy: Any, source: Source, original: Any) -> None:
        self.mirrors[id(copy)] = (copy, source, [])
        self.mirror_of[id(original)] = copy
        self.keep.extend((copy, original))

    def check_mirror_write(self, copy: Any) -> None:
        """A module's own parameter, buffer and submodule dicts are read all over the capture from the real
        module (iteration, len, calls): changing them (ModuleList.append) must happen for real."""
        source = self.mirrors[id(copy)][1]
        if source.expr.endswith(("._modules", "._parameters", "._buffers")):
            raise GraphBreak(f"changing {source.name} (a module's submodules, parameters or buffers) inside "
                             "compiled code", "build the module structure outside the compiled function")

    # ---- objects made during capture ----
    def is_local(self, value: Any) -> bool:
        return id(value) in self.local_objects

    def new_local(self, value: Any) -> Any:
        self.local_objects[id(value)] = value
        return value

    def changed_mirrors(self) -> list[tuple[Any, Source]]:
        changed = []
        for copy, source, snapshot in self.mirrors.values():
            now = list(copy.items()) if isinstance(copy, dict) else list(copy)
            if len(now) != len(snapshot) or any(_differs(a, b) for a, b in zip(now, snapshot)):
                changed.append((copy, source))
        return changed

    # ---- writes to outside state ----
    def write_attr(self, obj: Any, name: str, value: Any) -> None:
        origin = self.tuple_origins.get(id(obj))
        if origin is not None and origin[0] is obj:
            # an outside tuple traced as a copy (a NamedTuple subclass's instance has a __dict__): the copy
            # answers later reads, the outside tuple gets the write
            try:
                object.__setattr__(obj, name, value)
            except (AttributeError, TypeError) as e:
                raise RaisedError(e, f"setting attribute {name!r}") from None
            self.attr_writes[(id(origin[2]), name)] = (origin[2], origin[1], name, value)
            return
        source = self.source_of(obj)
        if source is None:
            raise GraphBreak(f"setting attribute {name!r} of a {type(obj).__name__} kiln cannot reload")
        if isinstance(obj, torch.nn.Module) and (name in obj._parameters or name in obj._modules or
                                                 name in obj._buffers or isinstance(value, torch.nn.Module)):
            raise GraphBreak(f"assigning module attribute {name!r} (a parameter, buffer or submodule)")
        self.attr_writes[(id(obj), name)] = (obj, source, name, value)

    def read_attr_overlay(self, obj: Any, name: str) -> Any:
        entry = self.attr_writes.get((id(obj), name))
        return _MISSING if entry is None else entry[3]


def _fixed_key(key: Any) -> bool:
    """A dict key that is a class, function or typing form: immutable, compared by identity or structure,
    so the guard on the dict's keys (a tuple compared with ==) decides lookups exactly."""
    return isinstance(key, (type, types.FunctionType, types.BuiltinFunctionType, types.UnionType,
                            enum.Enum)) or type(key).__module__ == "typing"


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == 2 == len(b):
        return a[0] is not b[0] and a[0] != b[0] or a[1] is not b[1]
    return a is not b


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
MISSING = _MISSING
