"""kiln's structure (DESIGN.md, Pipeline and Boundaries), read from the source with ast; nothing is imported.

  - no import cycles between modules: every import counts, also one inside a function or under
    `if TYPE_CHECKING:`, and relative imports are resolved;
  - imports follow the stage order (ORDER below); kiln/__init__.py and kiln/api.py are the top: they may
    import any stage, and only a stage allowed "api" may import them;
  - no module is over 800 lines;
  - only kiln/config.py reads the environment (os.environ, os.getenv).

An edge from a package's __init__ to its own modules is left out of the cycle search: a package that imports
its modules to re-export or register them is not a cycle of meaning. `from pkg import name` is an import of
the module pkg.name when there is one, and of pkg otherwise.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import textwrap

KILN = pathlib.Path(__file__).resolve().parent.parent / "kiln"
MAX_LINES = 800

# The stages each stage may import, besides itself and the ground (config, counters).
ORDER = {
    "graph": set(),
    "prims": {"graph"},
    "ops": {"prims", "graph"},
    "capture": {"ops", "prims", "graph"},
    "autograd": {"ops", "prims", "graph"},
    "lower": {"prims", "graph"},
    "schedule": {"lower", "prims", "graph"},
    "codegen": {"schedule", "lower", "prims", "graph", "runtime"},
    "runtime": {"graph"},
    "backends": {"autograd", "lower", "schedule", "codegen", "runtime", "prims", "ops", "graph"},
    "testing": {"ops", "prims", "graph", "capture", "backends", "api"},
    "bench": {"testing", "api", "backends", "graph"},
}
GROUND = {"config", "counters"}
ENV_READS = {"environ", "environb", "getenv", "getenvb"}


# ---- reading the source ------------------------------------------------------------------------------------

def module_files(package: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every module under `package` by dotted name (a package by its own name, not `pkg.__init__`)."""
    root = package.parent
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str | None:
    """The absolute module a `from` import with `level` dots names, seen from `module`."""
    if level == 0:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > len(base):
        return None  # beyond the top package
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(module: str, path: pathlib.Path, known: set[str]) -> dict[str, int]:
    """The known modules `module` imports anywhere in its file, each with the first line importing it."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str | None, line: int) -> None:
        if target in known and target != module:
            found[target] = min(line, found.get(target, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module)
            if source is None:
                continue
            names_a_value = False
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    add(f"{source}.{alias.name}", node.lineno)
                else:
                    names_a_value = True
            if names_a_value:
                add(source, node.lineno)
    return found


def import_graph(package: pathlib.Path) -> dict[str, dict[str, int]]:
    files = module_files(package)
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}


# ---- the checks ----------------------------------------------------------------------------------------

def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The sets of modules that import each other, directly or around a loop (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(graph):
        if root in index:
            continue
        enter(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    enter(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def import_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """One line per cycle: its modules, and the imports that close it (`a:12 -> b` is line 12 of a)."""
    edges = {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in graph.items()}
    lines = []
    for component in strongly_connected(edges):
        inside = set(component)
        links = [f"{m}:{graph[m][t]} -> {t}" for m in component for t in sorted(edges[m] & inside)]
        lines.append(f"{' <-> '.join(component)}  ({'; '.join(links)})")
    return lines


def stage_of(module: str) -> str:
    """`kiln.ops.registry` -> "ops"; the package itself is the public API, as kiln/api.py is."""
    parts = module.split(".")
    return "api" if len(parts) == 1 else parts[1]


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    lines = []
    for module, targets in sorted(graph.items()):
        stage = stage_of(module)
        if stage not in ORDER:
            continue  # the top (kiln/__init__.py, api, cli) and the ground may import any stage
        for target, line in sorted(targets.items()):
            other = stage_of(target)
            if other != stage and other not in GROUND and other not in ORDER[stage]:
                lines.append(f"{module}:{line} imports {target} ({stage} -> {other})")
    return lines


def big_modules(files: dict[str, pathlib.Path]) -> list[str]:
    lines = []
    for path in files.values():
        count = len(path.read_text().splitlines())
        if count > MAX_LINES:
            lines.append(f"{path.relative_to(KILN.parent)}: {count} lines")
    return lines


def environment_reads(source: str, filename: str) -> list[str]:
    """`file:line: what` for each read of the environment through the os module."""
    tree = ast.parse(source, filename)
    os_names = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname for a in node.names if a.name == "os" and a.asname}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_READS and isinstance(node.value, ast.Name) \
                and node.value.id in os_names:
            hits.append(f"{filename}:{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and node.level == 0:
            for alias in node.names:
                if alias.name in ENV_READS:
                    hits.append(f"{filename}:{node.lineno}: from os import {alias.name}")
    return sorted(hits, key=lambda hit: int(hit.split(":")[1]))


# ---- kiln --------------------------------------------------------------------------------------------------

def _listed(lines: list[str]) -> str:
    return "\n  " + "\n  ".join(lines)


@functools.cache
def _kiln_graph() -> dict[str, dict[str, int]]:
    return import_graph(KILN)


def test_no_import_cycles():
    cycles = import_cycles(_kiln_graph())
    assert not cycles, f"{len(cycles)} import cycles between kiln's modules:{_listed(cycles)}"


def test_imports_follow_the_stage_order():
    violations = layer_violations(_kiln_graph())
    assert not violations, f"{len(violations)} imports against the stage order (ORDER):{_listed(violations)}"


def test_no_module_over_800_lines():
    big = big_modules(module_files(KILN))
    assert not big, f"{len(big)} modules over {MAX_LINES} lines (split them by concept):{_listed(big)}"


def test_only_config_reads_the_environment():
    config = KILN / "config.py"
    hits = [hit for name, path in module_files(KILN).items() if path != config
            for hit in environment_reads(path.read_text(), str(path.relative_to(KILN.parent)))]
    assert not hits, f"environment reads outside kiln/config.py (add a flag there):{_listed(hits)}"


# ---- the checker itself, on a small made-up package -------------------------------------------------------

def _package(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "kiln"


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    package = _package(tmp_path, {
        "kiln/__init__.py": "from . import ops\n",
        "kiln/ops/__init__.py": "from . import a, b\n",
        "kiln/ops/a.py": "from .b import helper\n",
        "kiln/ops/b.py": "def helper():\n    from ..ops import a\n    return a\n",
        "kiln/ops/c.py": "from ..prims import p\nfrom ..graph.leaf import x\n",
        "kiln/prims/__init__.py": "p = 1\n",
        "kiln/graph/leaf.py": "import kiln.ops.c\nx = 1\n",
    })
    graph = import_graph(package)
    assert graph["kiln.ops.a"] == {"kiln.ops.b": 1}
    assert graph["kiln.ops.b"] == {"kiln.ops.a": 2}
    assert graph["kiln.ops.c"] == {"kiln.prims": 1, "kiln.graph.leaf": 2}
    assert import_cycles(graph) == [
        "kiln.graph.leaf <-> kiln.ops.c  (kiln.graph.leaf:1 -> kiln.ops.c; kiln.ops.c:2 -> kiln.graph.leaf)",
        "kiln.ops.a <-> kiln.ops.b  (kiln.ops.a:1 -> kiln.ops.b; kiln.ops.b:2 -> kiln.ops.a)",
    ]  # and not kiln.ops <-> kiln.ops.a: a package importing its own modules
    assert layer_violations(graph) == ["kiln.graph.leaf:1 imports kiln.ops.c (graph -> ops)"]


def test_the_checker_finds_environment_reads():
    source = "import os as o\nfrom os import getenv\nv = o.environ.get('X')\nos.path.join('a')\n"
    assert environment_reads(source, "m.py") == ["m.py:2: from os import getenv", "m.py:3: o.environ"]
