"""Debug dumps that run as printed (KILN_DEBUG_DIR): every global a dumped module reads is imported or
assigned at its top.

- `graph_module`: a prim graph (the passes to_prims, dce, cse) as a module defining the graph's function;
  it imports torch and kiln's prims, and spells each object the graph holds.
- `cpp_wrapper_module`: the C++ backend's wrapper (the pass build) as a module defining `kiln_call`; it
  builds `kernels.cpp` from beside itself (run it as a file: `python 09_build.py`, or with `__file__` set),
  loads the segments' entry points and spells the wrapper's constants. Inputs unlike the compile's
  (shape, strides, dtype) raise where the compiled graph would have run with torch.

A tensor constant is spelled by its values (at most MAX_PRINTED_ELEMENTS of them); another object with no
Python spelling (kiln.lower.printer.literal) is pickled into the dump when that is small. Anything else is
`unprintable(...)`, which says what it was when called.
"""
from __future__ import annotations

import pickle
from typing import Any

import torch

from ..graph import Graph, TensorMeta, contiguous_strides
from ..graph.pipeline import CompileState
from ..lower.printer import literal

# a constant pickled into a dump at most this large, a tensor printed with at most this many elements
# (larger ones are unprintable)
MAX_PICKLED_BYTES = 1 << 20
MAX_PRINTED_ELEMENTS = 4096
# globals the printed prim graph takes from its imports
_GRAPH_IMPORTS = {"torch": "import torch", "inf": "from math import inf, nan", "nan": None,
                  "device": "from torch import device", "prims": "from kiln import prims"}
_SPELLING_IMPORT = "from kiln.lower.reference import rebuild, resolve, unprintable  # noqa: F401"


def value_text(value: Any) -> str:
    """Python text evaluating to `value`: its literal, else its pickle (when small), else unprintable."""
    if isinstance(value, torch.Tensor):
        return _tensor_text(value)
    text = literal(value)
    if "unprintable(" not in text:
        return text
    try:
        data = pickle.dumps(value)
    except Exception:
        return text
    return f"pickle.loads({data!r})" if len(data) <= MAX_PICKLED_BYTES else text


def _tensor_text(t: torch.Tensor) -> str:
    """`torch.tensor([...], dtype=...)` with the tensor's values, shape and strides (a small CPU one)."""
    what = f"a constant tensor {TensorMeta.of(t).short()}"
    if t.device.type != "cpu" or t.layout != torch.strided or t.numel() > MAX_PRINTED_ELEMENTS or \
            t.is_complex() or t.requires_grad:
        return f"unprintable({what!r})"
    text = f"torch.tensor({literal(t.detach().contiguous().flatten().tolist())}, dtype={t.dtype})"
    shape, strides = tuple(t.shape), tuple(t.stride())
    if strides == contiguous_strides(shape):
        return f"{text}.reshape({literal(shape)})"
    return f"torch.empty_strided({literal(shape)}, {literal(strides)}, dtype={t.dtype}).copy_({text}" \
           f".reshape({literal(shape)}))"


def _split_header(source: str) -> tuple[list[str], list[str]]:
    """The leading comment lines of `source`, and the rest."""
    lines = source.splitlines()
    at = 0
    while at < len(lines) and lines[at].startswith("#"):
        at += 1
    return lines[:at], lines[at:]


def _module(header: list[str], imports: list[str], assignments: list[str], body: list[str]) -> str:
    if any("pickle.loads(" in line for line in assignments):
        imports = ["import pickle"] + imports
    parts = ["\n".join(header + [""] + imports + [_SPELLING_IMPORT])]
    if assignments:
        parts.append("\n".join(assignments))
    parts.append("\n".join(body))
    return "\n\n".join(parts) + "\n"


def graph_module(graph: Graph, header: str) -> str:
    """The graph as a runnable module defining its function (see the module docstring)."""
    source, env = graph.python_code(header)
    imports, assignments = [], []
    for name, value in env.items():
        if name == "prims":
            from .. import prims
            if all(getattr(prims, n, None) is p for n, p in vars(value).items()):
                imports.append(_GRAPH_IMPORTS[name])
                continue
        elif name in _GRAPH_IMPORTS:
            if _GRAPH_IMPORTS[name] is not None:
                imports.append(_GRAPH_IMPORTS[name])
            continue
        assignments.append(f"{name} = {value_text(value)}")
    head, body = _split_header(source)
    return _module(head, imports, assignments, body)


def cpp_wrapper_module(state: CompileState) -> str:
    """The C++ wrapper of a compiled graph as a runnable module defining `kiln_call` (see the module
    docstring)."""
    imports = ["import os", "", "import torch", "",
               "from kiln.codegen.wrapper_runtime import helper_globals, load_entry",
               "from kiln.runtime import build"]
    assignments = ["globals().update(helper_globals())  # _restride, _view, _pool...: what every wrapper reads"]
    if state.entry_specs:
        assignments.append('_kernels = build(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), '
                           '"kernels.cpp")).read())')
    for name, symbol, nargs, nsizes in state.entry_specs:
        assignments.append(f"{name} = load_entry(_kernels, {symbol!r}, {nargs}, {nsizes})")
    for name, value in state.constants.items():
        assignments.append(f"{name} = {value_text(value)}")
    assignments += ["", "", "def _fallback(*inputs):",
                    '    raise RuntimeError("this dumped kiln_call takes inputs like the compile\'s (shapes, '
                    'strides, dtypes); for others the compiled graph runs with torch")']
    if "_kiln_now" in state.wrapper_source:  # kiln.profile's compile: the wrapper times its steps
        imports.append("from time import perf_counter_ns as _kiln_now")
        assignments.append(f"_kiln_timing = {value_text(getattr(state, 'timings', None))}")
    head, body = _split_header(state.wrapper_source)
    return _module(head, imports, assignments, body)
