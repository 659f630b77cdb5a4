"""The cpp backend's runtime: disk cache (reuse, corrupt entries, other processes), missing compiler,
debug dumps, the registered backends `cpp` and `auto`."""
import logging
import os
import runpy
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln.ops
from kiln import config
from kiln.backends import lookup_backend
from kiln.backends.cpp import CompiledGraph, compile_graph
from kiln.lower.printer import constants_of
from kiln.runtime import CompilerNotFound, forget_loaded

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


def fn(x, y):
    return torch.relu(x * y + 1)


def inputs():
    return torch.randn(5, 7), torch.randn(5, 7)


SCRIPT = textwrap.dedent("""
    import torch, kiln.ops
    from kiln.backends.cpp import compile_graph
    def fn(x, y):
        return torch.relu(x * y + 1)
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    c = compile_graph(kiln.ops.trace(fn, x, y), [x, y])
    torch.testing.assert_close(c(x, y), fn(x, y))
""")


def run_in_new_process(cache_dir):
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_RAISE_ON_ERROR="1")
    subprocess.run([sys.executable, "-c", SCRIPT], check=True, env=env, cwd=os.getcwd())


def test_disk_cache_reuse_and_corrupt_entry(tmp_path):
    x, y = inputs()
    with config.patch(cache_dir=str(tmp_path), raise_on_error=True):
        compile_graph(kiln.ops.trace(fn, x, y), [x, y])
        entries = list((tmp_path / "cpp").glob("*.so"))
        assert len(entries) == 1
        stamp = entries[0].stat().st_mtime_ns
        forget_loaded()
        c = compile_graph(kiln.ops.trace(fn, x, y), [x, y])  # a cache hit: not rebuilt
        assert entries[0].stat().st_mtime_ns == stamp
        torch.testing.assert_close(c(x, y), fn(x, y))
    run_in_new_process(tmp_path)  # a second process reuses the entry
    assert entries[0].stat().st_mtime_ns == stamp
    entries[0].unlink()  # never write into a loaded object: replace it
    entries[0].write_bytes(b"not an ELF file")
    run_in_new_process(tmp_path)  # the corrupt entry is rebuilt
    assert entries[0].read_bytes()[:4] == b"\x7fELF"


def test_missing_compiler_falls_back_or_raises(tmp_path):
    x, y = inputs()
    graph = kiln.ops.trace(fn, x, y)
    with config.patch(cache_dir=str(tmp_path), cxx="kiln-no-such-compiler"):
        with pytest.warns(UserWarning, match="kiln-no-such-compiler"):
            compiled = lookup_backend("cpp")(graph, [x, y])
        torch.testing.assert_close(compiled(x, y), fn(x, y))
        with config.patch(raise_on_error=True), pytest.raises(CompilerNotFound, match="not on PATH"):
            lookup_backend("cpp")(graph, [x, y])


def test_debug_dir_dumps_artifacts(tmp_path):
    x, y = inputs()
    with config.patch(cache_dir=str(tmp_path / "cache"), debug_dir=str(tmp_path / "debug"),
                      raise_on_error=True):
        compile_graph(kiln.ops.trace(fn, x, y), [x, y])
    (graph_dir,) = [p for p in (tmp_path / "debug").iterdir() if p.is_dir()]  # (and index.txt)
    names = sorted(p.name for p in graph_dir.iterdir())
    assert names == ["00_to_prims.py", "01_dce.py", "02_cse.py", "03_lower.py", "04_fold_bias.py",
                     "05_fuse.py", "06_order.py", "07_plan.py", "09_build.py", "kernels.cpp"]
    assert 'extern "C"' in (graph_dir / "kernels.cpp").read_text()
    assert (graph_dir / "05_fuse.py").read_text().startswith("# cpp fn: after pass fuse (")
    assert "def kiln_call(" in (graph_dir / "09_build.py").read_text()
    _run_each_dump(graph_dir, x, y)


def _run_each_dump(graph_dir, *inputs):
    """Every dumped .py runs as a file, and the function it defines computes the graph."""
    ran = []
    for path in sorted(graph_dir.glob("*.py")):
        namespace = runpy.run_path(str(path))  # (as `python 09_build.py`: imports included, nothing else)
        defined = [namespace[k] for k in ("fn", "run", "kiln_call") if k in namespace]
        if path.name != "07_plan.py":  # (the plan is comments: allocations and frees per step)
            assert len(defined) == 1, (path.name, sorted(namespace))
            torch.testing.assert_close(defined[0](*inputs), fn(*inputs), msg=path.name)
        ran.append(path.name)
    assert len(ran) == 9, ran


def test_every_dump_runs_with_constants_and_views(tmp_path):
    """The dumps of a graph holding a constant tensor and returning a view run too."""
    x, y = inputs()
    table = torch.arange(7.0)

    def held(x, y):
        return (torch.relu(x * y + 1) + table).t()
    with config.patch(cache_dir=str(tmp_path / "cache"), debug_dir=str(tmp_path / "debug"),
                      raise_on_error=True):
        c = compile_graph(kiln.ops.trace(held, x, y), [x, y])
    (graph_dir,) = [p for p in (tmp_path / "debug").iterdir() if p.is_dir()]
    for path in sorted(graph_dir.glob("*.py")):
        namespace = runpy.run_path(str(path))
        if "run" in namespace:  # the loop IR takes its constant buffers as an argument
            out = namespace["run"](x, y, constants=constants_of(c.loop))
        elif path.name != "07_plan.py":
            out = namespace["held" if "held" in namespace else "kiln_call"](x, y)
        else:
            continue
        torch.testing.assert_close(out, held(x, y), msg=path.name)
        assert out.stride() == held(x, y).stride(), path.name


def test_debug_dir_index_and_default_directory(tmp_path, monkeypatch):
    """KILN_DEBUG_DIR=1 is ./kiln_debug (not a folder named 1); index.txt names each graph's directory with
    its frame and file:line; the first dump says where they go, once per directory."""
    from kiln.runtime import debug_dump
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(debug_dump, "_announced", set())
    said = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # (kiln's channels print on stderr)
    logging.getLogger("kiln.kernels").addHandler(handler)
    x = torch.randn(4, 8)

    def scaled(t):
        return (t * 2).relu().sum(-1)
    try:
        with config.patch(cache_dir=str(tmp_path / "cache"), debug_dir="1", raise_on_error=True):
            kiln.reset()
            kiln.compile(scaled, backend="cpp")(x)
            kiln.compile(DumpedNet(), backend="cpp")(x)
    finally:
        logging.getLogger("kiln.kernels").removeHandler(handler)
    assert not (tmp_path / "1").exists()
    dumps = tmp_path / "kiln_debug"
    dirs = sorted(p.name for p in dumps.iterdir() if p.is_dir())
    assert len(dirs) == 2 and dirs[0].startswith("DumpedNet_forward_") and dirs[1].startswith("scaled_"), dirs
    index = (dumps / "index.txt").read_text().splitlines()
    code = scaled.__code__
    assert f"{dirs[1]}  {scaled.__qualname__} ({code.co_filename}:{code.co_firstlineno})" in index, index
    assert any(line.startswith(f"{dirs[0]}  DumpedNet.forward (") for line in index), index
    (message,) = [m for m in said if "KILN_DEBUG_DIR" in m]
    assert str(dumps) in message and "default directory" in message and "index.txt" in message, message


class DumpedNet(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) + 1


def test_auto_picks_cpp_for_cpu(tmp_path):
    x, y = inputs()
    with config.patch(cache_dir=str(tmp_path), raise_on_error=True):
        compiled = lookup_backend("auto")(kiln.ops.trace(fn, x, y), [x, y])
    assert isinstance(compiled, CompiledGraph)
    torch.testing.assert_close(compiled(x, y), fn(x, y))


def test_two_processes_build_the_same_entry_at_once(tmp_path):
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), KILN_RAISE_ON_ERROR="1")
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, cwd=os.getcwd()) for _ in range(2)]
    assert [p.wait() for p in procs] == [0, 0]
    entries = list((tmp_path / "cpp").glob("*"))
    # no temporary left behind: the kernels and the graph's wrapper (kiln.backends.graph_cache)
    assert sorted(e.suffix for e in entries) == [".graph", ".so"]
