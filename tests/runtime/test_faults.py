"""Fault injection: the toolchain, the kernel cache and the process fail under a compiled program.

Each test runs tests/runtime/fault_program.py in a fresh process (a pointwise chain and a reduction compiled
by the cpp backend, checked against eager) with one fault in place. Each fault costs speed, never
correctness: kiln runs the graph eagerly or rebuilds, with exactly one warning naming the cause and the
remedy; with raise_on_error a fault that would cost the kernels raises; afterwards, compiling works again.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import kiln
import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.runtime import cache, forget_loaded

CXX = shutil.which(config.get("cxx"))
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

PROGRAM = os.path.join(os.path.dirname(__file__), "fault_program.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))  # the checkout whose kiln runs


def environment(tmp_path, cache_dir=None, **extra):
    """The program's environment: kiln's flags unset but the cache's, temporary files under tmp_path."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(PYTHONPATH=ROOT, KILN_CACHE_DIR=str(cache_dir or tmp_path / "cache"), OMP_NUM_THREADS="1",
               TMPDIR=str(tmp_path / "tmp"))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(plan, env):
    return subprocess.Popen([sys.executable, PROGRAM, json.dumps(plan)], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def report_of(process, timeout=120):
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"the program failed (status {process.returncode}):\n{stderr}"
    lines = [line for line in stdout.splitlines() if line.startswith("KILN-REPORT ")]
    assert len(lines) == 1, stdout + stderr
    return json.loads(lines[0].removeprefix("KILN-REPORT "))


def run_program(plan, env):
    return report_of(start(plan, env))


def entries(cache_dir, suffix=None):
    """Every file in the cache's cpp directory (kernel entries and any temporary) but the entries that sit
    beside the kernels (graph wrappers, kiln.backends.graph_cache; entry functions and guard text,
    kiln.graph.memo); with `suffix`, only the files with that suffix."""
    directory = os.path.join(cache_dir, "cpp")
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    if suffix is not None:
        return [n for n in names if n.endswith(suffix)]
    return [n for n in names if not n.endswith((".graph", ".code", ".text"))]


def assert_one_warning(phase, *fragments):
    assert len(phase["warnings"]) == 1, phase["warnings"]
    for fragment in fragments:
        assert fragment in phase["warnings"][0], phase["warnings"][0]


def assert_fell_back(phase, *fragments):
    """Right result from the graph run with torch, and one warning naming the cause and the remedy."""
    assert phase.get("raised") is None, phase
    assert phase["correct"] and phase["eager"] == 1 and phase["compiled"] == 0, phase
    assert_one_warning(phase, "running it with torch", *fragments)


def assert_compiled_quietly(phase):
    assert phase.get("raised") is None, phase
    assert phase["correct"] and phase["compiled"] == 1 and phase["eager"] == 0, phase
    assert phase["warnings"] == []


def wrapper(path, body):
    """A shell script standing in for the C++ compiler (`--version` answers as the real one)."""
    path.write_text(f'#!/bin/sh\ncase " $* " in *" --version "*) exec {CXX} "$@";; esac\n{body}\n')
    path.chmod(0o755)
    return str(path)


# ---- the toolchain ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["KILN_CXX names a missing program", "PATH without g++"])
def test_no_compiler(tmp_path, how):
    if how == "PATH without g++":
        (tmp_path / "bin").mkdir()
        for tool in ("as", "ld"):  # the rest of the toolchain stays (the recovery names g++ by its path)
            os.symlink(shutil.which(tool), tmp_path / "bin" / tool)
        env = environment(tmp_path, KILN_CXX="g++", PATH=tmp_path / "bin")
        cause = "'g++' is not on PATH"
    else:
        env = environment(tmp_path, KILN_CXX=tmp_path / "no-such" / "g++")
        cause = "does not exist or is not executable"
    report = run_program({"raise": True, "recover": {"cxx": CXX}}, env)
    assert_fell_back(report["fault"], "CompilerNotFound", cause, "install g++", "KILN_CXX")
    assert report["raise"]["raised"] == "CompilerNotFound"
    assert_compiled_quietly(report["recover"])


def test_compiler_fails_on_generated_source(tmp_path):
    message = "kernels.cpp:1:1: error: simulated compiler failure"
    cxx = wrapper(tmp_path / "bad-cxx", f'echo "{message}" >&2\nexit 1')
    env = environment(tmp_path, KILN_CXX=cxx)
    report = run_program({"raise": True, "recover": {"cxx": CXX}}, env)
    phase = report["fault"]
    assert_fell_back(phase, "BuildError", "exited with status 1", "simulated compiler failure",
                     "please report it", "KILN_CXX")
    kept = phase["warnings"][0].split("the source is kept at ")[1].split(" ")[0]
    assert os.path.dirname(kept) == str(tmp_path / "tmp")
    assert 'extern "C"' in open(kept).read()  # the failing source, for the report
    assert report["raise"]["raised"] == "BuildError"
    assert_compiled_quietly(report["recover"])
    assert len(entries(tmp_path / "cache")) == 1  # the recovered build; no temporary of the failed ones


def test_shared_object_fails_to_load(tmp_path):
    missing = tmp_path / "missing.cpp"  # links, but needs a symbol nothing defines: dlopen refuses it
    missing.write_text('extern "C" void kiln_test_absent(void);\nextern "C" void kiln_test_use(void) '
                       '{ kiln_test_absent(); }\n')
    cxx = wrapper(tmp_path / "cxx", f'exec {CXX} "$@" {missing}')
    env = environment(tmp_path, KILN_CXX=cxx)
    report = run_program({"raise": True, "recover": {"cxx": CXX}}, env)
    assert_fell_back(report["fault"], "KernelLoadError", "fails to load",
                     "undefined symbol: kiln_test_absent", "KILN_CXX")
    assert report["raise"]["raised"] == "KernelLoadError"
    assert_compiled_quietly(report["recover"])
    assert len(entries(tmp_path / "cache")) == 1  # the broken objects were not kept


# ---- the cache -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built_entries(tmp_path_factory):
    """The cache entry of `fn` as a fresh process writes it, and the object of another function with the
    same kernels' names and arguments (it loads where fn's does, and computes something else)."""
    tmp_path = tmp_path_factory.mktemp("entries")
    report = run_program({}, environment(tmp_path))
    assert_compiled_quietly(report["fault"])
    (name,) = entries(tmp_path / "cache")
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    forget_loaded()
    with config.patch(cache_dir=str(tmp_path / "other"), raise_on_error=True):
        compile_graph(kiln.ops.trace(lambda x, y: torch.relu(x * y - 1).sum(dim=1), x, y), [x, y])
    (other,) = entries(tmp_path / "other")
    data = (tmp_path / "cache" / "cpp" / name).read_bytes()
    other_data = (tmp_path / "other" / "cpp" / other).read_bytes()
    assert b"kiln_segment0" in data and b"kiln_segment0" in other_data
    return name, data, other_data


def corrupt(kind, data, other):
    body = data[:-cache.TRAILER_SIZE]
    if kind == "garbage":
        return b"not a shared object at all\n" * 20
    if kind == "truncated":
        return data[:len(data) // 2]
    if kind == "flipped bytes":
        middle = len(body) // 2
        return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 16]) + data[middle + 16:]
    if kind == "another object, this trailer":  # a loadable ELF computing something else
        return other[:-cache.TRAILER_SIZE] + data[-cache.TRAILER_SIZE:]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, reason", [
    ("garbage", "has no kiln trailer"),
    ("truncated", "has no kiln trailer"),
    ("flipped bytes", "failed its integrity check"),
    ("another object, this trailer", "failed its integrity check"),
])
def test_corrupt_entry_is_rebuilt(tmp_path, built_entries, kind, reason):
    name, data, other = built_entries
    bad = corrupt(kind, data, other)
    (tmp_path / "bad.so").write_bytes(bad)
    entry = tmp_path / "cache" / "cpp" / name
    entry.parent.mkdir(parents=True, mode=0o700)
    entry.write_bytes(bad)
    report = run_program({"raise": True, "refault": [str(entry), str(tmp_path / "bad.so")]},
                         environment(tmp_path))
    for phase in ("fault", "raise"):  # rebuilding loses nothing: raise_on_error has nothing to raise
        assert report[phase].get("raised") is None, report[phase]
        assert report[phase]["correct"] and report[phase]["compiled"] == 1, report[phase]
        assert_one_warning(report[phase], str(entry), reason, "rebuilding it", "kiln cache clear")
    assert entries(tmp_path / "cache") == [name]
    cache.verify_entry(str(entry), name[:-3])  # the rebuilt entry is whole


def test_three_processes_fill_one_empty_cache(tmp_path):
    env = environment(tmp_path)
    processes = [start({}, env) for _ in range(3)]
    for process in processes:
        assert_compiled_quietly(report_of(process)["fault"])
    (name,) = entries(tmp_path / "cache")  # one entry, no temporary
    cache.verify_entry(str(tmp_path / "cache" / "cpp" / name), name[:-3])
    (graph,) = entries(tmp_path / "cache", ".graph")  # and one graph-cache entry, whole
    cache.read_verified(str(tmp_path / "cache" / "cpp" / graph), graph[:-len(".graph")])


def test_cache_directory_cannot_be_created(tmp_path):
    (tmp_path / "file").write_text("a regular file where the cache directory's parent should be")
    report = run_program({"raise": True, "recover": {"cache_dir": str(tmp_path / "good")}},
                         environment(tmp_path, tmp_path / "file" / "cache"))
    phase = report["fault"]
    assert phase["correct"] and phase["compiled"] == 1  # built in a private directory instead
    assert_one_warning(phase, "cannot create the kernel cache directory", str(tmp_path / "file" / "cache"),
                       "Not a directory", "private temporary directory", "set KILN_CACHE_DIR")
    assert report["raise"]["correct"] and report["raise"]["compiled"] == 1  # nothing lost, nothing raised
    assert_compiled_quietly(report["recover"])
    assert report["private_directory"].startswith(str(tmp_path / "tmp"))
    assert os.listdir(tmp_path / "tmp") == []  # the private directory is removed at exit
    assert len(entries(tmp_path / "good")) == 1


@pytest.mark.parametrize("first_failing", [1, 2], ids=["writing the source", "sealing the entry"])
def test_disk_full_while_writing(tmp_path, first_failing):
    report = run_program({"enospc_from": first_failing, "raise": True, "recover": {}},
                         environment(tmp_path))
    assert_fell_back(report["fault"], "CacheWriteError", "No space left on device", "free space",
                     "KILN_CACHE_DIR")
    assert report["raise"]["raised"] == "CacheWriteError"
    assert_compiled_quietly(report["recover"])
    assert len(entries(tmp_path / "cache")) == 1  # the recovered entry; no temporary, no partial entry


def _dead(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.split()[:2] == ["State:", "Z"] for line in f)
    except FileNotFoundError:
        return True


def test_ctrl_c_while_compiling_then_rerun(tmp_path):
    marker = tmp_path / "compiler-started"
    cxx = wrapper(tmp_path / "slow-cxx", f'sleep 60 &\necho $! > {marker}.tmp\nmv {marker}.tmp {marker}\n'
                                         f'wait $!\nexec {CXX} "$@"')
    process = start({}, environment(tmp_path, KILN_CXX=cxx))
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr, stderr
    assert _dead(int(marker.read_text())), "the compiler's helpers outlived the interrupt"
    assert entries(tmp_path / "cache") == []  # no temporary, no partial entry
    assert_compiled_quietly(run_program({}, environment(tmp_path))["fault"])
    assert len(entries(tmp_path / "cache")) == 1
