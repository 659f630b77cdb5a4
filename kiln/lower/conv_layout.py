"""Channels-last (NHWC) layout around 2-D convolutions: which values the lowering lays out that way.

oneDNN runs a depthwise or strided convolution over an NHWC input 1.5-2.7x faster than over NCHW
(MobileNet's depthwise 3x3 convolutions at batch 8, one thread: 184 -> 114 us, 192 -> 88 us), and torch
returns an NHWC result for an NHWC input. The values between convolutions (BatchNorm, activations,
residual adds) are free to take any layout where nothing outside the graph sees them, so kiln lays them
out NHWC as well: the elementwise kernels then walk every operand contiguously (their loops follow the
stored layout, `kiln.schedule.fusion`), instead of transposing at every convolution.

Which convolutions run NHWC (`_wants_nhwc`): in a graph with a grouped (depthwise) convolution, all of them;
otherwise a dense convolution whose result has at least NHWC_MIN_PIXELS pixels (N * H * W). On small images
the weights' reorder per call costs about what the layout saves (ResNets at batch 1 ran 0.78-0.99x with every
convolution NHWC), on large ones NHWC wins (the zoo's resnet18 at batch 8: 8.0 -> 7.3 ms). A value is laid out
channels-last when it is 4-D with static sizes, more than one channel and more than one pixel (so the NHWC
strides differ from the NCHW ones in every dim that matters), no graph output or mutated input reaches it
through views (outputs keep eager's strides), and it is either the input of such a convolution or computed
elementwise (or padded, concatenated, copied) from a channels-last convolution result or from a
channels-last view (a 1x1 convolution's product rows seen as images, `kiln.ops.conv_gemm`, whose copy into
eager's layout then stays NHWC), unless it is the input of a
convolution that stays NCHW (that value's kernel writes NCHW: the transpose happens once, where the images are
small). A convolution whose input stays NCHW (the graph's input image) gets an NHWC copy of its weight
instead, which makes torch return an NHWC result just the same. Every layout is correct: kernels address any
strides, and the wrapper copies an extern's result whose strides differ from the expected ones (`_restride`);
the choice here only decides the speed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import prims
from ..graph import Graph, Node, TensorMeta, flatten
from ..graph.layout import NHWC_MIN_PIXELS, contiguous_strides
from .sizes import is_static


def channels_last_strides(shape: tuple) -> tuple:
    """NHWC strides of an (N, C, H, W) shape, as torch's `memory_format=torch.channels_last`."""
    n, c, h, w = shape
    sn, sh, sw, sc = contiguous_strides((n, h, w, c))
    return (sn, sc, sh, sw)


def eligible_shape(shape: tuple) -> bool:
    """A 4-D static shape whose NHWC strides differ from its NCHW ones where it matters (C > 1, H*W > 1)."""
    shape = tuple(shape)
    return len(shape) == 4 and is_static(shape) and shape[1] > 1 and shape[2] * shape[3] > 1


def is_channels_last(shape: tuple, strides: tuple) -> bool:
    return eligible_shape(shape) and tuple(strides) == channels_last_strides(tuple(shape))


def eager_nhwc(node: Node) -> bool:
    """A 2-D convolution eager runs in NHWC (its input or weight is channels-last): its result is NHWC too."""
    if not _is_conv2d(node) or not eligible_shape(node.meta.shape):
        return False
    return any(isinstance(a, Node) and isinstance(a.meta, TensorMeta) and
               is_channels_last(a.meta.shape, a.meta.strides) for a in node.args[:2])


def _is_conv2d(node: Node) -> bool:
    if not (node.op == "call_prim" and node.target is prims.convolution and node.args):
        return False
    x = node.args[0]
    transposed = prims.convolution.params(node)["transposed"]
    return isinstance(x, Node) and isinstance(x.meta, TensorMeta) and len(x.meta.shape) == 4 and \
        not transposed


def _groups(node: Node) -> int:
    groups = prims.convolution.params(node)["groups"]
    return groups if isinstance(groups, int) else 1


def _output_aliased(graph: Graph) -> set[int]:
    """Nodes a graph output or a mutated input's final value reaches through view prims only."""
    marked = {id(v) for v in flatten(graph.output_value) if isinstance(v, Node)}
    marked |= {id(n) for n in graph.mutated_inputs.values()}
    for node in reversed(graph.nodes):
        if id(node) in marked and node.op == "call_prim" and "view" in node.target.tags and node.args:
            if isinstance(node.args[0], Node):
                marked.add(id(node.args[0]))
    return marked


@dataclasses.dataclass
class ConvLayout:
    """What the lowering lays out NHWC: `values` (ids of prim nodes realized in NHWC strides, and of
    weights given an NHWC copy) and `results` (ids of convolutions whose result buffer is NHWC)."""

    values: set[int] = dataclasses.field(default_factory=set)
    results: set[int] = dataclasses.field(default_factory=set)


# oneDNN's half-precision convolutions lose far more to NCHW, at nearly every size (`bench/bench_conv.py
# --layout --dtype bfloat16 --threads 1`, NCHW -> NHWC input and weight, load 12): resnet18's stages at
# batch 1 98 -> 56, 92 -> 54, 102 -> 60, 144 -> 135 us; at batch 8 252 -> 110, 170 -> 88, 278 -> 99,
# 505 -> 357 us; one strided case lost (8x8 -> 4x4, 64 -> 128 channels at batch 8: 163 -> 222 us). Under
# autocast the weight is a cast kiln computes anyway, and the cast's kernel writes it NHWC for nothing.
HALF_DTYPES = (torch.bfloat16, torch.float16)


def _wants_nhwc(conv: Node, grouped_graph: bool) -> bool:
    """Whether a 2-D convolution runs faster NHWC: every one in a graph with a grouped (depthwise)
    convolution, every half-precision one (HALF_DTYPES), a dense one when its result has many pixels
    (NHWC_MIN_PIXELS)."""
    if grouped_graph or conv.meta.dtype in HALF_DTYPES:
        return True
    n, _, h, w = conv.meta.shape
    return is_static((n, h, w)) and n * h * w >= NHWC_MIN_PIXELS


def channels_last_layout(graph: Graph) -> ConvLayout:
    """Which values around the graph's 2-D convolutions are NHWC (see the module doc)."""
    convs = [n for n in graph.nodes if _is_conv2d(n)]
    grouped = any(_groups(c) > 1 for c in convs)
    wanted = {id(c) for c in convs if _wants_nhwc(c, grouped)}
    if not wanted:
        return ConvLayout()
    outputs = _output_aliased(graph)
    # the inputs of convolutions that stay NCHW: an elementwise value feeding one is written NCHW
    nchw_inputs = {id(c.args[0]) for c in convs if id(c) not in wanted}

    def free(node: Node) -> bool:
        meta = node.meta
        return node.op == "call_prim" and isinstance(meta, TensorMeta) and id(node) not in outputs and \
            eligible_shape(meta.shape)
    # a convolution whose result is an output keeps eager's layout: its input stays as it is
    chosen = {id(c.args[0]) for c in convs if id(c) in wanted and free(c.args[0]) and free(c)}
    # values whose buffer will be NHWC: the chosen ones, and convolutions reading an NHWC input or weight
    nhwc: set[int] = set(chosen)
    results: set[int] = set()
    for node in graph.nodes:
        if _is_conv2d(node):
            x, w = node.args[0], node.args[1]
            meta: Any = x.meta
            if not free(node):
                continue
            if id(x) in nhwc or is_channels_last(meta.shape, meta.strides):
                results.add(id(node))   # torch returns NHWC for an NHWC input, wanted or not
            elif id(node) in wanted and isinstance(w, Node) and isinstance(w.meta, TensorMeta) and \
                    eligible_shape(w.meta.shape):
                # an NCHW input (the graph's image): an NHWC copy of the weight makes torch return NHWC,
                # so the layers after it need no transposing kernel
                chosen.add(id(w))
                results.add(id(node))
            nhwc |= results
        elif node.op == "call_prim" and node.target is prims.pad and free(node) and \
                id(node) not in nchw_inputs and id(node.args[0]) in nhwc:
            # the padded input of a convolution kiln computes itself (kiln.ops.conv_gemm's windows): NHWC
            # from an NHWC value, a contiguous copy instead of a transposing one (MobileNet at batch 8: its
            # 8x8 stage's pad kernel took 330 us of a 3.2 ms call, gathering channels 128 apart)
            chosen.add(id(node))
            nhwc.add(id(node))
        elif node.op == "call_prim" and node.target is prims.cat and free(node) and \
                id(node) not in nchw_inputs and any(id(a) in nhwc for a in node.inputs()):
            # a concatenation of NHWC values (DenseNet's feature maps): its buffer is NHWC too, so copying
            # a convolution's result into it walks both contiguously (kiln.lower.concat)
            chosen.add(id(node))
            nhwc.add(id(node))
        elif node.op == "call_prim" and "view" in node.target.tags and isinstance(node.meta, TensorMeta) and \
                is_channels_last(node.meta.shape, node.meta.strides):
            # a channels-last view: a 1x1 convolution's product rows seen as images (kiln.ops.conv_gemm); the
            # values computed from it stay NHWC, as from a convolution's NHWC result
            nhwc.add(id(node))
        elif node.op == "call_prim" and ("elementwise" in node.target.tags or node.target is prims.clone) and \
                free(node) and id(node) not in nchw_inputs:
            # (a clone: the copy into eager's layout after such a product, a remap its readers absorb)
            shape = tuple(node.meta.shape)
            if any(id(a) in nhwc and isinstance(a.meta, TensorMeta) and tuple(a.meta.shape) == shape
                   for a in node.inputs()):
                chosen.add(id(node))
                nhwc.add(id(node))
    return ConvLayout(chosen, results)
