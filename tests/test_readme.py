"""The README's claims that a test can check: its first two commands; the files it cites and links exist (a
linked module has a docstring to read); the environment variables, KILN_LOGS channels, CLI commands,
kiln.compile arguments, backends, modes and install extras it lists are kiln's; the supported-versions
section; what `dynamic=True` does; that the cpp backend needs a C++ compiler."""
from __future__ import annotations

import ast
import inspect
import pathlib
import re
import tomllib
import warnings

import torch

import kiln
from kiln import cli, config

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FLAT = " ".join(README.split())  # (claims read across line breaks)


def section(heading: str) -> str:
    """The text under `## heading` up to the next `## ` heading."""
    start = README.index(f"\n## {heading}\n") + len(heading) + 5
    end = README.find("\n## ", start)
    return README[start:end if end >= 0 else None]


def table_column(text: str, header: str) -> list[str]:
    """The first cells (backticked names) of the markdown table whose first header cell is `header`."""
    block = text[text.index(f"| {header} |"):].split("\n\n", 1)[0]
    return [re.findall(r"`([^`]+)`", row.split(" | ")[0]) for row in block.splitlines()[2:]]


def test_first_two_commands_unchanged():
    commands = README.split("```bash\n", 1)[1].splitlines()[:2]
    assert commands[0].startswith("pip install torch==2.13.0 -e '.[models,plots]' && "
                                  "kiln bench --suite quick")
    assert commands[1].startswith("pip install torch==2.13.0 -e '.[test]' && python -m pytest -q -n 2")


def test_every_cited_file_exists():
    cited = set(re.findall(r"[\w./-]+\.(?:md|py)\b", README))
    # (paths in the layout block are relative to kiln/)
    missing = [path for path in sorted(cited) if "/" in path or path.endswith(".md")
               if not (ROOT / path).exists() and not (ROOT / "kiln" / path).exists()]
    assert "DESIGN.md" not in README and not missing, missing


def test_every_link_exists_and_each_linked_module_has_a_docstring():
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert links and all(not link.startswith("http") for link in links)
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing
    bare = [link for link in links if link.endswith(".py")
            if not ast.get_docstring(ast.parse((ROOT / link).read_text()))]
    assert not bare, bare
    docs = section("Documentation")
    assert "[bench/README.md](bench/README.md)" in docs and "kiln/capture/__init__.py" in docs


def test_environment_variables_are_kilns_flags():
    flags = {"KILN_" + name.upper() for name in config.flag_names()}
    named = set(re.findall(r"\bKILN_[A-Z_]+[A-Z]\b", README))
    # (and the variables tools/python.sh reads, which build interpreters, not kiln's behaviour)
    script = set(re.findall(r"\$\{(KILN_[A-Z_]+)", (ROOT / "tools" / "python.sh").read_text()))
    assert named - flags - script == set(), named - flags - script
    listed = {name for cells in table_column(section("Reference"), "variable") for name in cells}
    assert listed and listed <= flags, listed - flags


def test_log_channels_are_configs():
    listed = [name for cells in table_column(section("Reference"), "channel") for name in cells[:1]]
    assert listed == list(config.CHANNELS)
    for cells in table_column(section("Reference"), "channel"):
        for verbose in cells[1:]:  # (`+name` in a row: the channel says what it adds)
            if verbose.startswith("+"):
                assert verbose[1:] == cells[0] and cells[0] in config.VERBOSE, cells
    assert "KILN_LOGS=help" in FLAT and "`+name` also its details" in FLAT and "`-name` silences" in FLAT


def test_cli_commands_exist():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    rows = table_column(section("Reference"), "command")
    listed = {re.match(r"kiln (--version|\w+)", cell)[1] for cells in rows for cell in cells
              if cell.startswith("kiln ")}
    assert listed == set(commands) | {"--version"}, listed
    assert set(commands["cache"]._actions[-1].choices) == {"info", "clear"}
    for cells in rows:  # the options a row names are that command's
        command = re.match(r"kiln (\w+)", cells[0])
        if command and command[1] in ("bench", "explain"):
            options = {o for a in commands[command[1]]._actions for o in a.option_strings}
            named = {re.match(r"--[\w-]+", c)[0] for c in cells[1:] if c.startswith("--")}
            assert named <= options, named - options
    usage = section("Usage")
    assert "both run the quick suite by default" in " ".join(usage.split())
    assert parser.parse_args(["bench"]).suite == parser.parse_args(["explain"]).suite == "quick"


def test_compile_signature_arguments_backends_and_modes():
    from kiln.backends import lookup_backend
    from kiln.graph.pipeline import MODES
    params = inspect.signature(kiln.compile).parameters.values()
    text = ", ".join(("*, " if p.kind is p.KEYWORD_ONLY and i == 1 else "") +
                     f"{p.name}={p.default!r}".replace("'", '"') for i, p in enumerate(params))
    assert f"kiln.compile({text})" in FLAT, text
    reference = section("Reference")
    arguments = [cells[0] for cells in table_column(reference, "argument")]
    assert arguments == [p.name for p in params][1:]
    backend_row = reference[reference.index("| `backend` |"):].split("\n", 1)[0]
    for name in ("auto", "cpp", "triton", "eager", "prims"):
        assert f"`{name}`" in backend_row and callable(lookup_backend(name))
    mode_row = reference[reference.index("| `mode` |"):].split("\n", 1)[0].split(" | ", 1)[1]
    assert {m for m in re.findall(r"`([\w-]+)`", mode_row)} <= set(MODES)


def test_install_extras_and_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    install = section("Install")
    extras = set(re.findall(r"-e '\.\[([\w,]+)\]'", install))
    assert {e for group in extras for e in group.split(",")} == set(project["optional-dependencies"])
    deps = {re.match(r"[\w-]+", d)[0] for d in project["dependencies"]}
    assert deps == {"torch", "numpy", "sympy"} and "it needs torch, numpy and sympy" in install
    for package in ("pytest", "pytest-xdist", "hypothesis", "expecttest", "transformers", "triton"):
        assert any(d.startswith(package) for d in project["optional-dependencies"]["test"]), package


def test_supported_versions_section():
    assert "\n## Supported Python and torch versions\n" in README
    text = " ".join(section("Supported Python and torch versions").split())
    versions = ", ".join(f"{a}.{b}" for a, b in kiln.CAPTURE_PYTHONS[:-1])
    assert f"bytecode of CPython {versions} and {'.'.join(map(str, kiln.CAPTURE_PYTHONS[-1]))}" in text
    for a, b in kiln.CAPTURE_PYTHONS:
        assert f"| {a}.{b} |" in text
    assert (ROOT / "tools" / "python.sh").exists()
    from kiln.graph.torch_internals import TESTED
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_dep = next(d for d in project["dependencies"] if d.startswith("torch"))
    low, high = TESTED[0].rsplit(".", 1)[0], TESTED[-1].rsplit(".", 1)[0]
    assert torch_dep == f"torch>={low},<{high[:-1]}{int(high[-1]) + 1}", torch_dep
    assert f"admits {low} to {high}" in text and all(v in text for v in TESTED)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tools/python.sh" in ci and "--against" in ci
    assert all(f"{a}.{b}:" in ci for a, b in kiln.CAPTURE_PYTHONS if (a, b) not in ((3, 11), (3, 12)))


def test_dynamic_true_is_supported_without_a_warning():
    assert "`dynamic=True` is supported" in FLAT and "`dynamic=True` warn" not in FLAT
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = kiln.compile(lambda x: x * 2, backend="eager", dynamic=True)
        for n in (3, 5, 7):
            torch.testing.assert_close(compiled(torch.ones(n)), torch.full((n,), 2.0))
    assert sum(kiln.counters["captures"].values()) == 1 and not kiln.counters["recompiles"]


def test_says_a_cpp_compiler_is_needed():
    assert "needs a C++ compiler, `g++` on the PATH" in FLAT and config.get("cxx") == "g++"
