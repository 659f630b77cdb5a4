"""kiln/ never uses torch's own compiler stack (DESIGN.md, Boundaries): an AST scan of every module.

The scan sees `import torch._dynamo`, `from torch import fx`, `from torch._inductor.x import y`,
attribute uses such as `torch._dynamo.reset()` or `torch.compile(...)` (also through `import torch as t`),
and `importlib.import_module("torch.fx")` / `__import__("torch.jit")` with a constant name.
"""
from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

FORBIDDEN = (
    "torch.compile", "torch._dynamo", "torch._inductor", "torch.fx", "torch._prims", "torch._prims_common",
    "torch._refs", "torch._decomp", "torch._functorch", "torch.func", "torch.export", "torch.jit",
    "torch._subclasses", "torch._C._dynamo",
)
KILN = pathlib.Path(__file__).resolve().parent.parent / "kiln"


def forbidden(dotted: str) -> str | None:
    """The forbidden module that `dotted` is or lies inside, or None."""
    for name in FORBIDDEN:
        if dotted == name or dotted.startswith(name + "."):
            return name
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def scan_source(source: str, filename: str = "<source>") -> list[str]:
    """`file:line: what` for each use of a forbidden module in one Python source."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}  # local name -> the torch module (or object) it stands for
    hits: list[str] = []

    def hit(node: ast.AST, dotted: str, how: str) -> None:
        name = forbidden(dotted)
        if name is not None:
            hits.append(f"{filename}:{node.lineno}: {how} {dotted} (inside forbidden {name})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                hit(node, a.name, "import")
                if a.name == "torch" or a.name.startswith("torch."):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            hit(node, node.module, "from-import")
            if node.module == "torch" or node.module.startswith("torch."):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    hit(node, full, "from-import")
                    aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is None:
                continue
            root, _, rest = dotted.partition(".")
            if root in aliases:
                hit(node, aliases[root] + ("." + rest if rest else ""), "use of")
        elif isinstance(node, ast.Call):
            func = _dotted(node.func) or ""
            if func.endswith("import_module") or func == "__import__":
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value,
                                                                                        str):
                    hit(node, node.args[0].value, "dynamic import of")
    return sorted(set(hits), key=lambda h: (h.split(":")[0], int(h.split(":")[1])))


def scan_tree(root: pathlib.Path = KILN) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        hits += scan_source(path.read_text(), str(rel))
    return hits


def test_kiln_never_imports_the_torch_compiler_stack():
    assert KILN.is_dir()
    hits = scan_tree()
    assert not hits, "kiln/ uses torch's compiler stack (DESIGN.md, Boundaries):\n" + "\n".join(hits)


@pytest.mark.parametrize("source, expected", [
    ("import torch._dynamo", "torch._dynamo"),
    ("import torch.fx as fx", "torch.fx"),
    ("from torch import _inductor", "torch._inductor"),
    ("from torch._prims_common import is_float_dtype", "torch._prims_common"),
    ("from torch.export import export", "torch.export"),
    ("import torch\ntorch._dynamo.reset()", "torch._dynamo"),
    ("import torch\nf = torch.compile(g)", "torch.compile"),
    ("import torch as t\nt.jit.script(f)", "torch.jit"),
    ("from torch import _C\n_C._dynamo.eval_frame", "torch._C._dynamo"),
    ("import torch\nx = torch._refs.add", "torch._refs"),
    ("import importlib\nimportlib.import_module('torch._decomp')", "torch._decomp"),
    ("from torch import func\nfunc.vmap(f)", "torch.func"),
])
def test_scan_finds_forbidden_uses(source, expected):
    hits = scan_source(textwrap.dedent(source), "kiln/example.py")
    assert hits, source
    assert all(h.startswith("kiln/example.py:") for h in hits)
    assert any(f"forbidden {expected})" in h for h in hits), hits


@pytest.mark.parametrize("source", [
    "import torch\ntorch.add(x, 1)",
    "import torch.nn.functional as F\nF.gelu(x)",
    "from torch.overrides import TorchFunctionMode",
    "import torch\ntorch.testing.assert_close(a, b)",
    "from torch.utils import cpp_extension",
    "import torch\ntorch._prims_commonly_named = 1",  # a prefix that is not the module
    "import torch\nx = torch.functional",
    "import torch\nx.compile()",  # not torch
    "s = 'torch._dynamo is only named in a string'",
])
def test_scan_allows_the_eager_runtime(source):
    assert scan_source(source, "kiln/example.py") == []


def test_scan_names_file_and_line():
    hits = scan_source("import torch\n\n\nimport torch.fx\n", "kiln/graph/x.py")
    assert hits == ["kiln/graph/x.py:4: import torch.fx (inside forbidden torch.fx)"]
