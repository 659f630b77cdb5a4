"""The IR: Graph, Node, TensorMeta; printing as runnable Python; verify, dce, cse; the interpreter."""
from .graph import Graph
from .interpreter import run, torch_callable
from .meta import TensorMeta, contiguous_strides, dense_strides, dtype_abbrev
from .node import Node, flatten, map_structure, torch_name
from .passes import GraphVerifyError, cse, dce, inline, run_passes, to_prims, verify
from .printer import compile_python, count_ops, python_code
from .proxy import DataDependentError, Deferred, Proxy, Tracer, current_tracer, traced_flag, tracing

__all__ = [
    "Graph", "Node", "TensorMeta", "Proxy", "Deferred", "Tracer", "DataDependentError", "GraphVerifyError",
    "flatten", "map_structure", "torch_name", "run", "contiguous_strides", "dense_strides", "dtype_abbrev",
    "cse", "dce",
    "inline", "run_passes", "to_prims", "verify", "compile_python", "count_ops", "python_code",
    "current_tracer", "traced_flag", "tracing", "torch_callable",
]
