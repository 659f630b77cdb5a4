"""Decompositions make their constants on the input's device.

CI has no GPU, and on the CPU a constant made without `device=` lands on the right device by accident.
Tracing on the meta device (no examples run) shows what a CUDA input would get: a constant on the CPU
makes a strict prim refuse to mix devices (the op then runs with torch, slower) or reaches a GPU kernel
as a CPU pointer (the triton backend raised for max_pool on an H200: bench/gpu_opinfo.py). Each case here
was one of those before it was fixed.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln.graph
from kiln.graph import TensorMeta
from kiln.ops import trace
from kiln.prims import creation

CASES = {
    "max_pool2d with indices": lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
    "max_pool1d": lambda x: F.max_pool1d(x.flatten(2), 3, 2),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, 3),
    "avg_pool2d border divisors": lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "index_fill": lambda x: x.index_fill(1, torch.tensor([0, 2], device=x.device), 1.5),
    "list index": lambda x: x[:, [0, 2]],
    "index_put": lambda x: x.index_put((torch.tensor([1], device=x.device),), torch.tensor(2.0, device=x.device)),
    "cov": lambda x: torch.cov(x.reshape(6, -1)),
    "pdist": lambda x: F.pdist(x.reshape(6, -1)),
}


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


@pytest.mark.parametrize("name", list(CASES))
def test_constants_follow_the_input_device(name):
    x = torch.empty(2, 3, 8, 8, device="meta")
    graph = trace(CASES[name], x, examples=False)
    assert graph.fallbacks() == [], [n.target_name() for n in graph.fallbacks()]
    prim_graph = kiln.graph.to_prims(graph)
    assert [n.target_name() for n in prim_graph.fallbacks()] == []
    devices = {t.device.type for n in prim_graph.nodes for t in _tensors((n.args, n.kwargs))}
    devices |= {n.meta.device.type for n in prim_graph.nodes if isinstance(n.meta, TensorMeta)}
    assert devices == {"meta"}, f"{name}: tensors on {devices}"


def test_a_bare_cuda_device_names_its_index(monkeypatch):
    # torch.ones(3, device="cuda").device is cuda:0: a factory's meta must say so too, or adding it to a
    # cuda:0 tensor fails the prims' same-device check (logspace on an H200 ran with torch for this)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert creation._device("cuda") == torch.device("cuda", 0)
    assert creation._device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert creation._device("cpu") == torch.device("cpu")
