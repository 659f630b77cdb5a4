"""Lowering: a prim graph → a LoopGraph.

Each prim node becomes a `Box`: a shape, a dtype and a loader `loader(h, index)` computing one element with
scalar ops. Elementwise prims compose loaders (so a pointwise chain is inlined into its consumer by
default); view prims remap the index (broadcast, permute, slice, reshape fold into index arithmetic, never
copies); reductions always materialize a buffer. A box is materialized (`realize`) when it is an output,
read by an extern or fallback, or read by several consumers while being expensive to recompute. A prim
without a lowering runs as a Fallback node through its reference implementation — always correct.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import sympy
import torch

from .. import config, prims
from ..counters import counters
from ..graph import Graph, Node, TensorMeta, flatten, map_structure
from ..graph.layout import contiguous_strides, is_non_overlapping_and_dense
from ..graph.symbolic import SymInt
from ..prims import Prim
from ..prims.shape import view_strides
from . import arange_index, concat, indirect, matvec, reduce_order, windows
from .box import Box, buffer_box as _buffer_box
from .index import linear_index, simplify_index, unravel
from .sizes import dense, dim, dims, hint, is_positive, is_static, known_le, nonnegative, same
from .conv_layout import (ConvLayout, channels_last_layout, channels_last_strides, eager_nhwc,
                          is_channels_last)
from .ir import (BufferRef, ComputedBuffer, ExternNode, InputBuffer, Layout, LoopGraph, OutputView,
                 Pointwise, Reduction, Scan, ViewRef)
from .ops import BINARY_OPS, UNARY_OPS, WideConvertHandler, cast_scalar
from .target import Target

log = config.channel("fusion")

# Inline a pointwise value into each of several consumers only while it is this cheap (CountHandler units).
INLINE_REUSE_COST = 8
# A padded value read by this many consumers (a pooling window's taps: kiln.ops.nn_pool) is computed once into
# a padded buffer. Inlined, each tap is a load under its own bounds test, and g++ 12 leaves an inner loop with
# four or more such masked loads scalar: PoolFormer's 3x3 average pools (9 taps, in its NHWC kernels over 16
# channels) ran at 6-8% of the copy bandwidth, 60 us of its 2.3 ms call each.
PAD_REALIZE_READERS = 4
# A per-channel vector broadcast into an NHWC kernel of at least this many elements is computed once into a
# buffer; below, recomputing it per pixel (a few vector ops per 16 elements) costs less than the buffer's
# allocation in the wrapper (~4 us)
VECTOR_BUFFER_MIN = 32768
# the least elements of a kernel into which a broadcast int64 -> float conversion is computed in a buffer of
# its own first, on a target that cannot vectorize the conversion (Target.wide_int_to_float_simd)
WIDE_CONVERT_MIN = 4096


class Unlowerable(Exception):
    """A prim application this lowering does not handle; it runs as a fallback."""


_ints = dims  # sizes as the loop IR holds them: ints, or expressions of symbolic sizes


def _dense_strides(meta: TensorMeta) -> tuple[int, ...]:
    """The meta's strides when they are non-overlapping and dense, else row-major strides."""
    shape, strides = _ints(meta.shape), _ints(meta.strides)
    if not is_static((shape, strides)):
        return strides if dense(shape, strides) else contiguous_strides(shape)
    return strides if is_non_overlapping_and_dense(shape, strides) else contiguous_strides(shape)


def _eager_strides(meta: TensorMeta) -> tuple[int, ...]:
    """A fallback's result keeps eager's strides, overlapping ones included (`as_strided` with a zero or
    repeated stride, `expand`): a view op's output stays a view, never a restrided copy. Kernels only read
    such a buffer (its elements at those strides), and it is never pooled or written in place."""
    return _ints(meta.strides)


class Lowering:
    """State of one lowering run: the loop graph being built and the value of each prim node."""

    def __init__(self, graph: Graph, target: Target):
        self.graph = graph
        self.target = target
        self.names = (f"buf{i}" for i in itertools.count())
        self.loop = LoopGraph(graph.name, [], [], [], None, [])
        self.env: dict[int, Any] = {}
        self.users: dict[Node, list[Node]] = graph.users()
        self.aliased_by_output = _aliased_by_output(graph, target)
        # what is laid out NHWC around convolutions (kiln.lower.conv_layout)
        self.conv_layout = channels_last_layout(graph) if target.channels_last_convs else ConvLayout()
        self.channels_last = self.conv_layout.values
        # cats computed in place by their inputs (kiln.lower.concat), and the values only they read
        self.concat_places = concat.plan_concats(graph, self.users, self.aliased_by_output) \
            if target.concat_in_place else {}
        self.concat_homed = concat.homed_values(self.concat_places, self.users)
        self.concat_roots: dict[int, Any] = {}

    # -- buffers --
    def new_name(self) -> str:
        return next(self.names)

    def realize(self, box: Box, meta: TensorMeta | None = None, node: Node | None = None) -> str:
        """The name of a buffer holding the box's value at its natural (full, dense) layout: the meta's
        strides (when dense), or NHWC for a `node` the convolution layout chose (kiln.lower.conv_layout)."""
        if box.view is not None:
            name, strides, offset = box.view
            buf = self.loop.buffers[name]
            if (buf.layout.shape, buf.layout.strides, buf.layout.offset) == (box.shape, strides, offset):
                return name
        if box.realized is not None:
            return box.realized
        strides = _dense_strides(meta) if meta is not None and _ints(meta.shape) == box.shape else \
            contiguous_strides(box.shape)
        if node is not None and id(node) in self.channels_last and _ints(node.meta.shape) == box.shape:
            strides = channels_last_strides(box.shape)
        name = self.new_name()
        box.realized = name
        loader = box.loader
        buf = ComputedBuffer(name, box.dtype, Layout(box.shape, strides),
                             Pointwise(box.shape, lambda h, index: loader(h, index)))
        self.add_node(buf)
        return name

    def realized_box(self, box: Box, meta: TensorMeta | None = None, node: Node | None = None) -> Box:
        name = self.realize(box, meta, node)
        buf = self.loop.buffers[name]
        return _buffer_box(name, buf.dtype, buf.shape, buf.layout.strides, buf.layout.offset)

    def add_node(self, node: Any) -> None:
        self.loop.nodes.append(node)
        if isinstance(node, ExternNode):
            for out in node.outputs:
                self.loop.buffers[out.name] = out
        else:
            self.loop.buffers[node.name] = node

    # -- the walk --
    def run(self) -> LoopGraph:
        position = 0
        # the final value of a mutated input is a buffer anyway (it is written back): computed once there,
        # and read by the ops after it from there, instead of recomputed from the input's old value (which
        # lets the memory plan write it into the input itself)
        final = {id(n) for n in self.graph.mutated_inputs.values()}
        for node in self.graph.nodes:
            if node.op == "placeholder":
                self.env[id(node)] = self.input(node, position)
                position += 1
            elif node.op == "constant":
                self.env[id(node)] = self.constant(node)
            elif node.op == "getitem":
                self.env[id(node)] = self.env[id(node.args[0])][node.args[1]]
            elif node.op == "call_prim":
                self.env[id(node)] = self.call_prim(node)
                value = self.env[id(node)]
                if id(node) in final and isinstance(value, Box) and value.view is None and \
                        isinstance(node.meta, TensorMeta) and _ints(node.meta.shape) == value.shape:
                    self.env[id(node)] = self.realized_box(value, node.meta)
            elif node.op == "call_torch":
                self.env[id(node)] = self.fallback(node, node.target, _torch_name(node), kind="fallback")
            elif node.op == "output":
                self.loop.output = map_structure(self.output_value, node.args[0])
        for name, node in self.graph.mutated_inputs.items():
            pos = next(i for i, ph in enumerate(self.graph.placeholders) if ph.name == name)
            self.loop.mutations.append((pos, self.output_value(node)))
        return self.loop

    def input(self, node: Node, position: int) -> Box:
        meta = node.meta
        self.check_dtype(meta.dtype, node)
        strides = _ints(meta.strides)
        buf = InputBuffer(node.name, meta.dtype, Layout(_ints(meta.shape), strides),
                          position=position)
        self.loop.inputs.append(buf)
        self.loop.buffers[buf.name] = buf
        return _buffer_box(buf.name, buf.dtype, buf.shape, strides)

    def constant(self, node: Node) -> Any:
        value = node.target
        if not isinstance(value, torch.Tensor):
            return value
        self.check_dtype(value.dtype, node)
        buf = InputBuffer(f"const_{node.name}", value.dtype,
                          Layout(tuple(value.shape), tuple(value.stride())), constant=value)
        self.loop.constants.append(buf)
        self.loop.buffers[buf.name] = buf
        return _buffer_box(buf.name, buf.dtype, buf.shape, buf.layout.strides)

    def check_dtype(self, dtype: torch.dtype, node: Node) -> None:
        if not self.target.computes(dtype):
            raise NotImplementedError(f"{self.target.name} backend: dtype {dtype} of {node.name} is not "
                                      "supported")

    def output_value(self, value: Any) -> Any:
        if isinstance(value, Node):
            box = self.env[id(value)]
            if not isinstance(box, Box):
                return box
            if box.view is not None:
                name, strides, offset = box.view
                layout = self.loop.buffers[name].layout
                if (layout.shape, layout.strides, layout.offset) == (box.shape, strides, offset) and \
                        not _is_graph_input(self.loop.buffers[name]):
                    return BufferRef(name)
                return OutputView(name, box.shape, strides, offset)
            return BufferRef(self.realize(box, value.meta))
        return value

    def call_prim(self, node: Node) -> Any:
        prim = node.target
        fn = LOWERINGS.get(prim)
        if fn is None and "view" in prim.tags:
            fn = lower_view
        metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
        supported = all(isinstance(m, TensorMeta) and self.target.computes(m.dtype) for m in metas)
        extern = prim.name in self.target.extern_prims
        if extern and self.target.matvec_kernels and matvec.applies(node):
            fn, extern = _lower_matvec, False
        if fn is not None and supported and not extern:
            args = map_structure(lambda v: self.env[id(v)] if isinstance(v, Node) else v, node.args)
            kwargs = map_structure(lambda v: self.env[id(v)] if isinstance(v, Node) else v, node.kwargs)
            try:
                box = fn(self, node, *args, **kwargs)
            except Unlowerable as e:
                log.debug("prims.%s of %s runs as a fallback: %s", prim.name, node.name, e)
            else:
                readers = len(self.users.get(node, ()))
                if isinstance(box, Box) and box.view is None and readers > 1 and id(node) not in self.concat_homed \
                        and (box.cost() > INLINE_REUSE_COST or (prim is prims.pad and readers >= PAD_REALIZE_READERS)):
                    box = self.realized_box(box, node.meta, node)
                return box
        kind = "extern" if extern else "fallback"
        return self.fallback(node, prim.ref, f"prims.{prim.name}", kind, prim.rules.get("inplace_ref"))

    def fallback(self, node: Node, target: Any, target_name: str, kind: str,
                 inplace_target: Any = None) -> Any:
        """Run `target` on whole tensors in the wrapper (inputs realized)."""
        def arg(v: Any) -> Any:
            if isinstance(v, Node):
                value = self.env[id(v)]
                if isinstance(value, Box) and value.view is not None:
                    name, strides, offset = value.view
                    layout = self.loop.buffers[name].layout
                    if (layout.shape, layout.strides, layout.offset) == (value.shape, strides, offset):
                        return BufferRef(name)
                    return ViewRef(name, value.shape, strides, offset)  # a view: passed without a copy
                if isinstance(value, Box):
                    return BufferRef(self.realize(value, v.meta, v))
                return value
            return v
        args = map_structure(arg, node.args)
        kwargs = map_structure(arg, node.kwargs)
        if id(node) in self.conv_layout.results and isinstance(node.args[1], Node) and \
                id(node.args[1]) in self.channels_last and not _nhwc_operand(args[0], self.loop.buffers):
            weight = self.env[id(node.args[1])]  # the NHWC copy kiln.lower.conv_layout asked for
            copy = Box(weight.shape, weight.dtype, weight.loader)
            args = (args[0], BufferRef(self.realize(copy, node.args[1].meta, node.args[1]))) + tuple(args[2:])
        metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
        if not metas:
            raise NotImplementedError(f"{self.target.name} backend: {target_name} returns no tensor")
        outputs = []
        for m in metas:
            if not isinstance(m, TensorMeta):
                raise NotImplementedError(f"{self.target.name} backend: {target_name} returns a non-tensor "
                                          f"({m})")
            self.check_dtype(m.dtype, node)
            shape = _ints(m.shape)
            strides = _eager_strides(m)
            if target_name == "prims.convolution" and self.nhwc_result(node, args):
                strides = channels_last_strides(shape)
            outputs.append(InputBuffer(self.new_name(), m.dtype, Layout(shape, strides)))
        counters[kind][target_name] += 1
        self.add_node(ExternNode(outputs[0].name if len(outputs) == 1 else self.new_name(), kind, target,
                                 target_name, args, kwargs, outputs, isinstance(node.meta, tuple),
                                 inplace_target))
        boxes = tuple(_buffer_box(o.name, o.dtype, o.shape, o.layout.strides) for o in outputs)
        return boxes if isinstance(node.meta, tuple) else boxes[0]


    def nhwc_result(self, node: Node, args: tuple) -> bool:
        """A convolution returns NHWC (torch keeps an NHWC input's or weight's layout): where eager's
        operands are NHWC, or where kiln.lower.conv_layout chose it and an operand is NHWC here."""
        if eager_nhwc(node):
            return True
        return id(node) in self.conv_layout.results and \
            any(_nhwc_operand(a, self.loop.buffers) for a in args[:2])


def _aliased_by_output(graph: Graph, target: Target) -> set[int]:
    """Nodes an output, or an extern's argument, reaches through view prims only. Their values live in
    buffers laid out as eager lays them out (so an output view gets eager's strides), and the views are
    passed on as strided views (an extern reads them without a copy; the kernel writing the base stays in
    the shape of its producer, so it fuses)."""
    marked: set[int] = set()
    for value in flatten(graph.output_value):
        if isinstance(value, Node):
            marked.add(id(value))
    for name, node in graph.mutated_inputs.items():
        marked.add(id(node))
    for node in graph.nodes:
        runs_whole = node.op == "call_torch" or (
            node.op == "call_prim" and (node.target.name in target.extern_prims or (
                node.target not in LOWERINGS and "view" not in node.target.tags)))
        if runs_whole:
            for arg in node.inputs():
                marked.add(id(arg))
    for node in reversed(graph.nodes):
        if id(node) in marked and node.op == "call_prim" and "view" in node.target.tags and node.args:
            if isinstance(node.args[0], Node):
                marked.add(id(node.args[0]))
    return marked


def _nhwc_operand(ref: Any, buffers: dict) -> bool:
    """An extern's argument that is an NHWC tensor (a buffer laid out so, or such a view of one)."""
    if isinstance(ref, BufferRef):
        layout = buffers[ref.name].layout
        return layout.offset == 0 and is_channels_last(layout.shape, layout.strides)
    return isinstance(ref, ViewRef) and is_channels_last(ref.shape, ref.strides)


def _is_graph_input(buf: Any) -> bool:
    return isinstance(buf, InputBuffer) and (buf.position >= 0 or buf.constant is not None)


def _torch_name(node: Node) -> str:
    return node.target_name()


# ---- the lowering table -----------------------------------------------------------------------------------

LOWERINGS: dict[Prim, Callable[..., Any]] = {}


def lowering(*targets: Prim) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn(ctx, node, *args, **kwargs) -> Box` as the lowering of prims: `@lowering(prims.where)`."""
    for p in targets:
        if not isinstance(p, Prim):
            raise TypeError(f"@lowering takes prims (kiln.prims.where), got {p!r}")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for p in targets:
            LOWERINGS[p] = fn
        return fn
    return register


def _operand(value: Any, dtype: torch.dtype) -> Callable[..., Any]:
    """A loader for a Box or a Python number (converted to dtype, as the prim converts it)."""
    if isinstance(value, Box):
        return value.loader
    if isinstance(value, SymInt):  # a symbolic size used as a number: read from the kernel's size arguments
        expr = dim(value)
        return lambda h, index: h.to_dtype(h.index_expr(sympy.sympify(expr), torch.int64), dtype)
    if isinstance(value, complex):
        raise Unlowerable("complex scalar")
    scalar = cast_scalar(value, dtype)
    return lambda h, index: h.constant(scalar, dtype)


def _elementwise(name: str) -> Callable[..., Any]:
    def lower(ctx: Lowering, node: Node, *args: Any) -> Box:
        tensors = [a for a in args if isinstance(a, Box)]
        dtype = tensors[0].dtype
        loaders = [_operand(a, dtype) for a in args]
        if name == "pow" and not dtype.is_floating_point:
            raise Unlowerable("integer pow")
        if name in ("remainder", "fmod", "div") and not dtype.is_floating_point and not (
                len(args) == 2 and type(args[1]) is int and args[1] not in (0, -1) and dtype != torch.bool):
            # (torch raises on a zero divisor; the minimum integer over -1 overflows: only a constant divisor
            # that can do neither is computed in a kernel, `perm // top_k`)
            raise Unlowerable("integer division (torch raises on a zero divisor)")

        def load(h: Any, index: list) -> Any:
            return h.op(name, *[ld(h, index) for ld in loaders])
        return Box(node.meta.shape, node.meta.dtype, load)
    return lower


# An elementwise prim whose scalar op has its name is that op applied to its operands' elements.
for _prim in prims.PRIMS.values():
    if _prim.name in UNARY_OPS | BINARY_OPS:
        LOWERINGS[_prim] = _elementwise(_prim.name)


@lowering(prims.where)
def lower_where(ctx: Lowering, node: Node, pred: Box, a: Any, b: Any) -> Box:
    dtype = node.meta.dtype
    la, lb = _operand(a, dtype), _operand(b, dtype)
    return Box(node.meta.shape, dtype, lambda h, i: h.where(pred.loader(h, i), la(h, i), lb(h, i)))


@lowering(prims.convert_element_type)
def lower_convert(ctx: Lowering, node: Node, a: Box, dtype: torch.dtype) -> Box:
    return Box(a.shape, dtype, lambda h, i: h.to_dtype(a.loader(h, i), dtype))


@lowering(prims.clone)
def lower_clone(ctx: Lowering, node: Node, a: Box, memory_format: Any = None) -> Box:
    # (NHWC where kiln.lower.conv_layout chose it: the copy into eager's layout after a 1x1 convolution's product)
    return ctx.realized_box(Box(a.shape, a.dtype, a.loader), node.meta, node)


@lowering(prims.stop_gradient)
def lower_stop_gradient(ctx: Lowering, node: Node, a: Box) -> Box:
    return Box(a.shape, a.dtype, a.loader)  # a's elements (only the gradient stops, in kiln.autograd)


@lowering(prims.grad_all_reduce)
def lower_grad_all_reduce(ctx: Lowering, node: Node, a: Box, group_name: str) -> Box:
    return Box(a.shape, a.dtype, a.loader)  # a's elements (the all-reduce is its gradient's, in autograd)


def lower_view(ctx: Lowering, node: Node, a: Box, *args: Any, **kwargs: Any) -> Box:
    """Any view prim, from its node's meta (a view prim's meta rule gives eager's shape, strides and storage
    offset exactly).

    Over a buffer laid out as the input's meta, the view reads the buffer with the meta's strides, at the
    buffer's own offset moved as far as the view moves eager's storage offset (offsets in the loop IR count
    from a buffer's first element, the meta's from its storage's start). A computed value is addressed as if
    it were contiguous, and the view becomes an index map onto it.
    """
    source = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    if a.view is None and id(node) in ctx.aliased_by_output and source is not None:
        a = ctx.realized_box(a, source.meta, source)
    out = node.meta
    if a.view is None and not kwargs:
        simple = _simple_view(node, a, args)
        if simple is not None:
            return simple
    if a.view is not None:
        name, strides, offset = a.view
        buf = ctx.loop.buffers[name]
        if node.target is prims.as_strided and isinstance(buf, InputBuffer) and buf.position >= 0:
            # it addresses the input's storage from its start: the result depends on the input's storage
            # offset, which the compiled graph does not check; torch computes it on the real input
            raise Unlowerable("as_strided of a graph input")
        if source is not None and _laid_out_as(source.meta, a.shape, strides):
            moved = dim(out.storage_offset) - dim(source.meta.storage_offset)
            return _buffer_box(name, a.dtype, _ints(out.shape), _ints(out.strides), _start(offset + moved))
        # the buffer is laid out otherwise than eager lays out the value (kiln made it dense)
        if not _viewable_over(node, a.shape, strides, args) and id(node) not in ctx.aliased_by_output:
            # a view eager's layout allows and kiln's does not: the index map below reads the buffer
            return lower_view(ctx, node, Box(a.shape, a.dtype, a.loader), *args, **kwargs)
        out = _view_over(node, a.shape, strides, offset, args, kwargs)
        return _buffer_box(name, a.dtype, _ints(out.shape), _ints(out.strides), _start(out.storage_offset))
    in_shape = a.shape
    if source is not None and _laid_out_as(source.meta, in_shape, contiguous_strides(in_shape)):
        out_offset = _start(dim(out.storage_offset) - dim(source.meta.storage_offset))
    else:
        out = _view_over(node, in_shape, contiguous_strides(in_shape), 0, args, kwargs)
        out_offset = _start(out.storage_offset)
    out_shape, out_strides = _ints(out.shape), _ints(out.strides)
    loader = a.loader
    # The view's index map, simplified once over placeholders bounded by the view's shape: chains of
    # reshapes then stay linear in size (composing raw unravels nests every dim's expression in each
    # of the next view's dims, and sympy time grows exponentially with the chain).
    places = [sympy.Dummy(f"v{d}", integer=True, nonnegative=True) for d in range(len(out_shape))]
    template = unravel(linear_index(places, out_strides, out_offset), in_shape)
    if all(is_positive(s) for s in out_shape):
        template = [simplify_index(e, dict(zip(places, out_shape))) for e in template]

    def load(h: Any, index: list) -> Any:
        sub = dict(zip(places, index))
        return loader(h, [e if e.is_Integer else e.xreplace(sub) for e in template])
    return Box(out_shape, a.dtype, load)


def _simple_view(node: Node, a: Box, args: tuple) -> Box | None:
    """A slice, squeeze or expand_dims of a computed value, as its index map written directly (the general
    path unravels the meta's strides and simplifies them with sympy, ~2 ms a view: a depthwise
    convolution's window taps are hundreds of these); None for any other view or symbolic arguments."""
    out_shape = _ints(node.meta.shape)
    loader = a.loader
    if node.target is prims.slice and len(args) >= 2:
        start, steps = args[0], (args[2] if len(args) > 2 and args[2] is not None else (1,) * len(a.shape))
        if not all(isinstance(v, int) for v in (*start, *steps)):
            return None
        return Box(out_shape, a.dtype, lambda h, index: loader(
            h, [i if (s == 0 and t == 1) else s + t * i for i, s, t in zip(index, start, steps)]))
    if node.target is prims.squeeze and args:
        dims = set(args[0])
        keep = [d for d in range(len(a.shape)) if d not in dims]

        def squeezed(h: Any, index: list) -> Any:
            full = [sympy.Integer(0)] * len(a.shape)
            for d, i in zip(keep, index):
                full[d] = i
            return loader(h, full)
        return Box(out_shape, a.dtype, squeezed)
    if node.target is prims.expand_dims and args:
        dims = set(args[0])
        return Box(out_shape, a.dtype, lambda h, index: loader(
            h, [i for d, i in enumerate(index) if d not in dims]))
    return None


def _start(offset: Any) -> int:
    """A view's offset from its value's first element; only as_strided can point before it (into eager's
    storage, which the value's buffer need not have)."""
    offset = dim(offset)
    if not nonnegative(offset):
        raise Unlowerable("a view starting before the first element of its input (or not at every size)")
    return offset


def _symint(value: Any, env: Any) -> Any:
    return SymInt.make(value, env) if isinstance(value, sympy.Basic) else value


def _laid_out_as(meta: TensorMeta, shape: tuple, strides: tuple) -> bool:
    """Whether a value of this meta is laid out with exactly these strides (size-1 dims' too: they appear in
    index expressions)."""
    return _ints(meta.shape) == shape and _ints(meta.strides) == strides


def _viewable_over(node: Node, shape: tuple, strides: tuple, args: tuple) -> bool:
    """False for a prims.view whose sizes no strides over (shape, strides) give (it spans dims kiln's
    layout keeps apart); True for every other view."""
    return node.target is not prims.view or not args or \
        view_strides(shape, strides, _ints(node.meta.shape)) is not None


def _view_over(node: Node, shape: tuple, strides: tuple, offset: int, args: tuple,
               kwargs: dict) -> TensorMeta:
    """The view's meta over an input laid out as (shape, strides, offset) rather than as its meta says."""
    if node.target is prims.as_strided:
        # its storage offset counts from the start of eager's storage, which this layout does not stand for
        raise Unlowerable("as_strided of a value kiln lays out otherwise than eager")
    env = next((v.env for v in node.meta.shape if isinstance(v, SymInt)), None)
    if env is not None:  # symbolic sizes stay SymInts: a decision no guard checked raises (never a guess)
        shape, strides = [_symint(v, env) for v in shape], [_symint(v, env) for v in strides]
        offset = _symint(offset, env)
    probe = TensorMeta(shape, node.meta.dtype, node.meta.device, strides, storage_offset=offset)
    return node.target.meta(probe, *args, **kwargs)


@lowering(prims.broadcast_in_dim)
def lower_broadcast(ctx: Lowering, node: Node, a: Box, shape: Any, dims: Any) -> Box:
    if a.view is not None or id(node) in ctx.aliased_by_output:
        return lower_view(ctx, node, a, shape, dims)
    in_shape = a.shape
    out_shape = _ints(shape)
    zero = sympy.Integer(0)
    kept = [_broadcast_keeps(in_shape[i], out_shape[d]) for i, d in enumerate(dims)]
    if ctx.channels_last and len(out_shape) == 4 and [d for keep, d in zip(kept, dims) if keep] == [1] and \
            a.cost() > 2 and hint(sympy.Mul(*out_shape)) >= VECTOR_BUFFER_MIN:
        # a computed per-channel vector (eval BatchNorm's scale and shift) is computed once, not per pixel:
        # in an NHWC kernel the channel is the vectorized inner index, where no compiler hoists it
        a = ctx.realized_box(a)
    elif not ctx.target.wide_int_to_float_simd and hint(sympy.Mul(*out_shape)) >= WIDE_CONVERT_MIN and \
            hint(sympy.Mul(*out_shape)) >= 4 * hint(sympy.Mul(*in_shape)) and _converts_wide_int(ctx, a):
        # an int64 -> float conversion broadcast into a larger kernel (BERT's `(1 - mask.float()) * -1e4`
        # added to every head's scores): computed into its own small buffer, else the consumer's inner
        # loop, exp included, stays scalar where the target has no vector conversion (AVX2)
        a = ctx.realized_box(a)

    def load(h: Any, index: list) -> Any:
        return a.loader(h, [index[d] if keep else zero for keep, d in zip(kept, dims)])
    return Box(out_shape, a.dtype, load)


def _converts_wide_int(ctx: Lowering, a: Box) -> bool:
    finder = WideConvertHandler({name: b.dtype for name, b in ctx.loop.buffers.items()})
    a.loader(finder, [sympy.Integer(0)] * len(a.shape))
    return finder.found


def _broadcast_keeps(size: Any, out: Any) -> bool:
    """Whether a broadcast input dim of `size` walks the output dim (else it is a size-1 dim, index 0).

    A symbolic size is compared by value, not by its spelling: `s1 - 2` may be 1 at every size the graph
    runs at. The capture decided it: broadcast_in_dim's meta rule asks `size == out`, then `size == 1`, and
    guards the answers. So where the hints are equal, `size == out` holds at every call the graph serves
    (walk); where they differ, `size == 1` does (index 0)."""
    if is_static((size, out)):
        return size != 1
    return same(size, out) or hint(size) == hint(out)


@lowering(prims.rev)
def lower_rev(ctx: Lowering, node: Node, a: Box, dims: Any) -> Box:
    shape = a.shape

    def load(h: Any, index: list) -> Any:
        return a.loader(h, [shape[d] - 1 - i if d in dims else i for d, i in enumerate(index)])
    return Box(shape, a.dtype, load)


@lowering(prims.cat)
def lower_cat(ctx: Lowering, node: Node, tensors: Any, dim: int) -> Box:
    place = ctx.concat_places.get(id(node))
    if place is not None and concat.computes_in_place(place, tensors):
        return concat.lower_in_place(ctx, node, tensors, place)
    return concat.inline_cat(node, tensors, dim)


@lowering(prims.index_select, prims.index_put, prims.gather, prims.index)
def lower_index(ctx: Lowering, node: Node, *args: Any, **kwargs: Any) -> Box:
    # an index the graph computes as an arange is index arithmetic (kiln.lower.arange_index); an index
    # tensor, a load through it where the target's kernels check such loads (kiln.lower.indirect)
    loader = arange_index.loader(node, *args, **kwargs)
    if loader is not None:
        return Box(node.meta.shape, node.meta.dtype, loader)
    found = indirect.loader(ctx, node, *args, **kwargs) if ctx.target.indirect_indexing else None
    if found is None:
        raise Unlowerable("an index not known at compile time")
    # computed whole, never inlined into a reader of a few elements: eager checks every index it is given
    box = ctx.realized_box(Box(node.meta.shape, node.meta.dtype, found[0]), node.meta, node)
    ctx.loop.index_checks[box.view[0]] = found[1]
    return box


@lowering(prims.im2col)
def lower_im2col(ctx: Lowering, node: Node, x: Box, *window: Any) -> Box:
    if x.view is None:  # each element is read once per kernel offset: compute it once, into a buffer
        x = ctx.realized_box(x, node.args[0].meta, node.args[0])
    return Box(node.meta.shape, node.meta.dtype, windows.im2col_loader(x.shape, x.loader, node.meta.dtype,
                                                                        *window))


@lowering(prims.col2im)
def lower_col2im(ctx: Lowering, node: Node, cols: Box, input_shape: Any, *window: Any) -> Box:
    return Box(node.meta.shape, node.meta.dtype, windows.col2im_loader(cols.shape, cols.loader,
                                                                        node.meta.dtype, *window))


@lowering(prims.pad)
def lower_pad(ctx: Lowering, node: Node, a: Box, value: Any, config_: Any) -> Box:
    """Constant padding (negative low/high crop): load where the index falls inside `a`."""
    if any(interior != 0 for _, _, interior in config_):
        raise Unlowerable("interior padding")
    dtype = a.dtype
    pad_value = _operand(value, dtype)
    lows = [int(lo) for lo, _, _ in config_]
    sizes = a.shape

    def load(h: Any, index: list) -> Any:
        shifted = [i - lo for i, lo in zip(index, lows)]
        cond = None
        for d, (i, lo) in enumerate(zip(index, lows)):
            if lo <= 0 and known_le(dim(node.meta.shape[d]), lo + sizes[d]):
                continue  # this dim never leaves `a`
            pos = h.index_expr(i, torch.int64)
            end = sympy.sympify(lo + sizes[d])
            inside = h.op("logical_and", h.op("ge", pos, h.constant(lo, torch.int64)),
                          h.op("lt", pos, h.constant(int(end), torch.int64) if end.is_Integer else
                               h.index_expr(end, torch.int64)))
            cond = inside if cond is None else h.op("logical_and", cond, inside)
        if cond is None:
            return a.loader(h, shifted)
        return h.masked(cond, lambda: a.loader(h, shifted), lambda: pad_value(h, index), dtype)
    return Box(node.meta.shape, dtype, load)


# ---- reductions --------------------------------------------------------------------------------

def _reduction(ctx: Lowering, node: Node, a: Box, dims: tuple, rtype: str, dtype: torch.dtype,
               value_fn: Callable[..., Any] | None = None) -> Box:
    dims = tuple(dims)
    keep = [d for d in range(len(a.shape)) if d not in dims]
    ranges = tuple(a.shape[d] for d in keep)
    loader = a.loader
    rank = len(a.shape)

    def probe(h: Any, rindex: list) -> Any:   # the input at a reduced position (outer index 0)
        full = [sympy.Integer(0)] * rank
        for d, r in zip(dims, rindex):
            full[d] = r
        return loader(h, full)
    dims, rranges = reduce_order.memory_order(dims, tuple(a.shape[d] for d in dims), rtype, probe)

    def full_index(index: list, rindex: list) -> list:
        full = [None] * rank
        for d, i in zip(keep, index):
            full[d] = i
        for d, r in zip(dims, rindex):
            full[d] = r
        return full

    def fn(h: Any, index: list, rindex: list) -> Any:
        value = loader(h, full_index(index, rindex))
        return value_fn(h, value, index) if value_fn is not None else value
    name = ctx.new_name()
    buf = ComputedBuffer(name, dtype, Layout(ranges, contiguous_strides(ranges)),
                         Reduction(ranges, rranges, rtype, fn))
    ctx.add_node(buf)
    return _buffer_box(name, dtype, ranges, buf.layout.strides)


def _lower_matvec(ctx: Lowering, node: Node, a: Box, b: Box) -> Box:
    """A one-row product as the sum over K of its float32 terms (kiln.lower.matvec)."""
    total = _reduction(ctx, node, matvec.product(a, b), (2,), "sum", torch.float32)
    dtype = node.meta.dtype
    return total if dtype == torch.float32 else \
        Box(total.shape, dtype, lambda h, index: h.to_dtype(total.loader(h, index), dtype))


def _simple_reduction(rtype: str) -> Callable[..., Any]:
    def lower(ctx: Lowering, node: Node, a: Box, dims: Any) -> Box:
        if not dims and rtype in ("argmax", "argmin"):
            return Box(node.meta.shape, torch.int64, lambda h, i: h.constant(0, torch.int64))
        if not dims:
            return ctx.realized_box(Box(a.shape, a.dtype, a.loader), node.meta)
        return _reduction(ctx, node, a, dims, rtype, node.meta.dtype)
    return lower


LOWERINGS[prims.sum] = _simple_reduction("sum")
LOWERINGS[prims.prod] = _simple_reduction("prod")
LOWERINGS[prims.amax] = _simple_reduction("max")
LOWERINGS[prims.amin] = _simple_reduction("min")
LOWERINGS[prims.argmax] = _simple_reduction("argmax")
LOWERINGS[prims.argmin] = _simple_reduction("argmin")


@lowering(prims.var)
def lower_var(ctx: Lowering, node: Node, a: Box, dims: Any, correction: Any) -> Box:
    """Two passes in one kernel: mean, then sum((x - mean)^2) / (N - correction)."""
    if not a.dtype.is_floating_point:
        raise Unlowerable("var of a non-float tensor")
    dims = tuple(dims)
    if not dims:
        raise Unlowerable("var over no dims")
    n = 1
    for d in dims:
        n *= a.shape[d]
    dtype = a.dtype
    # half types are summed in float32 and rounded once at the end, as eager does (summed in float16, the
    # variance of 2000 values near 40 overflows to inf)
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    src = a if acc == dtype else Box(a.shape, acc, lambda h, i: h.to_dtype(a.loader(h, i), acc))
    total = _reduction(ctx, node, src, dims, "sum", acc)

    if is_static(n):
        count = lambda h: h.constant(float(n), acc)  # noqa: E731
        denominator = lambda h: h.constant(max(float(n) - float(correction), 0.0), acc)  # noqa: E731
    else:  # the element count from the kernel's size arguments (as exact as the float of an int)
        if float(correction) != int(correction) or not nonnegative(n - int(correction)):
            raise Unlowerable("var with a correction that may exceed a symbolic element count")
        count = lambda h: h.to_dtype(h.index_expr(sympy.sympify(n), torch.int64), acc)  # noqa: E731
        denominator = lambda h: h.to_dtype(  # noqa: E731
            h.index_expr(sympy.sympify(n - int(correction)), torch.int64), acc)

    def centered_sq(h: Any, value: Any, index: list) -> Any:
        mean = h.op("div", total.loader(h, index), count(h))
        diff = h.op("sub", value, mean)
        return h.op("mul", diff, diff)
    squares = _reduction(ctx, node, src, dims, "sum", acc, centered_sq)

    def load(h: Any, index: list) -> Any:
        value = h.op("div", squares.loader(h, index), denominator(h))
        return value if acc == dtype else h.to_dtype(value, dtype)
    return Box(squares.shape, dtype, load)


def lower(graph: Graph, target: Target) -> LoopGraph:
    """Lower a prim graph (from `kiln.graph.to_prims`) to the loop IR for `target`."""
    return Lowering(graph, target).run()


# ---- scans ----------------------------------------------------------------------------------------------

def _scan(scan_type: str) -> Callable[..., Any]:
    def lower(ctx: Lowering, node: Node, a: Box, dim: int) -> Box:
        if not a.shape:
            return ctx.realized_box(Box(a.shape, a.dtype, a.loader), node.meta)
        dim = dim % len(a.shape)
        name = ctx.new_name()
        buf = ComputedBuffer(name, a.dtype, Layout(a.shape, contiguous_strides(a.shape)),
                             Scan(a.shape, dim, scan_type, a.loader))
        ctx.add_node(buf)
        return _buffer_box(name, a.dtype, a.shape, buf.layout.strides)
    return lower


LOWERINGS[prims.cumsum] = _scan("sum")
LOWERINGS[prims.cumprod] = _scan("prod")


# ---- creation -------------------------------------------------------------------------------------------

@lowering(prims.full)
def lower_full(ctx: Lowering, node: Node, shape: Any, value: Any, dtype: torch.dtype,
               device: Any = None) -> Box:
    if node.meta.device.type != "cpu":
        raise Unlowerable("full on another device")
    return Box(node.meta.shape, dtype, _operand(value, dtype))


@lowering(prims.iota)
def lower_iota(ctx: Lowering, node: Node, length: int, start: Any, step: Any, dtype: torch.dtype,
               device: Any = None) -> Box:
    if dtype.is_floating_point or node.meta.device.type != "cpu":
        raise Unlowerable("floating iota (eager's arange kernel rounds its own way)")
    start, step = dim(start), dim(step)  # a symbolic start (arange(pos, pos + n)) is a size argument

    def load(h: Any, index: list) -> Any:
        return h.to_dtype(h.index_expr(start + step * index[0], torch.int64), dtype)
    return Box(node.meta.shape, dtype, load)
