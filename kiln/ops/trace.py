"""The tracing entry for tests and backends: a graph from a function made only of torch calls.

`trace(fn, *example_inputs)` runs `fn` on proxies (Python control flow runs for real; a branch on a tensor
value raises DataDependentError) and returns the torch-level Graph, each node holding its decomposition.
Real user programs go through the bytecode frontend in `kiln.capture` instead.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from ..graph import Graph, Proxy, TensorMeta, flatten, map_structure, tracing
from .registry import aliases, call


class _RecordMode(TorchFunctionMode):
    """Routes every torch call during a trace to kiln, so factories (torch.zeros(3)) are recorded too."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if any(isinstance(a, Proxy) for a in flatten((args, kwargs))):
            return call(func, args, kwargs)
        if not any(isinstance(a, torch.Tensor) for a in flatten((args, kwargs))) and _is_factory(func):
            return call(func, args, kwargs)
        return func(*args, **kwargs)


def _is_factory(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    module = getattr(func, "__module__", "") or ""
    return module.startswith("torch") and not name.startswith("_") and name not in _NOT_FACTORIES


_NOT_FACTORIES = {"is_tensor", "is_storage", "get_default_dtype", "is_grad_enabled", "manual_seed",
                  "set_default_dtype", "promote_types", "result_type", "can_cast", "is_floating_point",
                  "is_complex", "broadcast_shapes", "Size", "finfo", "iinfo", "get_rng_state",
                  "set_rng_state", "initial_seed", "seed", "device", "dtype"}


def _parameter_names(fn: Callable[..., Any], count: int) -> list[str]:
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(count)]


def trace(fn: Callable[..., Any], *args: Any, examples: bool = True, **kwargs: Any) -> Graph:
    """Trace `fn(*args, **kwargs)` into a torch-level graph; tensors among the arguments become inputs.

    With `examples=True` each op also runs eagerly on the example values, so the decompositions' output
    metadata is checked against eager and ops without a meta implementation still get their shapes.
    """
    graph = Graph(getattr(fn, "__name__", "forward").replace("<", "_").replace(">", "_"))
    names = iter(_parameter_names(fn, len(args)))
    al = aliases(graph)
    counter = [0]

    def make_input(v: Any, name: str) -> Any:
        if isinstance(v, torch.Tensor):
            p = Proxy(graph.placeholder(name, TensorMeta.of(v)), example=v if examples else None)
            al.input_name[p] = p.node.name
            counter[0] += 1
            return p
        return v
    proxy_args = []
    for a in args:
        base = next(names)
        if isinstance(a, torch.Tensor):
            proxy_args.append(make_input(a, base))
        else:
            proxy_args.append(map_structure(lambda v: make_input(v, f"{base}_{counter[0]}"), a))
    proxy_kwargs = {k: map_structure(lambda v, k=k: make_input(v, k), v) for k, v in kwargs.items()}
    with tracing(graph), _RecordMode():
        out = fn(*proxy_args, **proxy_kwargs)
    out = map_structure(lambda v: v.node if isinstance(v, Proxy) else v, out)
    graph.output(out)
    return graph
