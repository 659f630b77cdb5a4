"""The graph cache (kiln.backends.graph_cache): a compiled graph's wrapper kept beside its kernels, so a
new process compiling the same graph skips the passes. A hit must give what a fresh compile gives (values,
counters, the IR when asked for), any change to what the compile reads must miss, and what the key cannot
describe is not cached, counted."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.counters import counters
from kiln.runtime import forget_loaded

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


def program(x, w):
    h = torch.nn.functional.gelu(x @ w + 1)
    return {"sum": h.sum(-1), "pair": (torch.softmax(h, -1), 3)}


def examples():
    return [torch.randn(4, 6), torch.randn(6, 5)]


def compile_fresh(fn, inputs, **flags):
    """compile_graph as a new process would run it: nothing loaded in memory, the disk cache as it is."""
    forget_loaded()
    with config.patch(raise_on_error=True, **flags):
        return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def cache_counts():
    return dict(counters["cache"])


def test_a_hit_equals_the_compile_it_replaces(tmp_path):
    inputs = examples()
    with config.patch(cache_dir=str(tmp_path)):
        counters.clear()
        cold = compile_fresh(program, inputs)
        # (without "runtime": the malloc setup it counts happens once per process, at its first compile)
        cold_counts = {k: dict(v) for k, v in counters.items() if k not in ("cache", "runtime")}
        assert not cold.from_cache and cache_counts().get("graph misses") == 1
        counters.clear()
        warm = compile_fresh(program, inputs)
        assert warm.from_cache and cache_counts().get("graph hits") == 1
        # the hit adds the counts the compile added (explain reads the same after a warm start)
        assert {k: dict(v) for k, v in counters.items() if k not in ("cache", "runtime")} == cold_counts
        for _ in range(2):  # (the second call reuses pooled buffers)
            got, want = warm(*inputs), program(*inputs)
            torch.testing.assert_close(got["sum"], want["sum"])
            torch.testing.assert_close(got["pair"][0], want["pair"][0])
            assert got["pair"][1] == 3
        torch.testing.assert_close(cold(*inputs)["sum"], want["sum"])
        before = {k: dict(v) for k, v in counters.items()}
        # the IR is rebuilt on demand, equal to the cold compile's, counting nothing
        assert warm.kernel_count == cold.kernel_count and warm.cpp_source == cold.cpp_source
        assert warm.wrapper_source == cold.wrapper_source
        assert {k: dict(v) for k, v in counters.items()} == before


def test_a_changed_layout_runs_on_the_fallback_after_a_hit(tmp_path):
    inputs = examples()
    with config.patch(cache_dir=str(tmp_path)):
        compile_fresh(program, inputs)
        warm = compile_fresh(program, inputs)
        assert warm.from_cache
        x = torch.randn(6, 4).t()  # same shape, other strides: the wrapper's check sends it to torch
        torch.testing.assert_close(warm(x, inputs[1])["sum"], program(x, inputs[1])["sum"])
        assert counters["cpp"]["input layout changed: ran the graph with torch"] >= 1


@pytest.mark.parametrize("shape,compiled_strides,call_strides", [
    ((2, 3, 1, 1), (3, 1, 0, 0), (3, 1, 1, 1)),  # a pooled gradient: trailing size-1 dims
    ((2, 1, 3), (3, 3, 1), (3, 7, 1)),  # a size-1 dim between others
    ((1, 1), (1, 1), (5, 9)),  # every dim of size 1
])
def test_strides_of_size_one_dims_do_not_send_the_graph_to_torch(tmp_path, shape, compiled_strides,
                                                                   call_strides):
    """Found training Hugging Face's ResNet: the backward's gradient input came with other strides in its
    size-1 dims than the compile's, and every step ran the backward graph with torch."""
    def fn(x, y):
        return torch.tanh(x) * y

    def strided(strides, seed):
        torch.manual_seed(seed)
        return torch.randn(64).as_strided(shape, strides)

    with config.patch(cache_dir=str(tmp_path)):
        compiled = compile_fresh(fn, [strided(compiled_strides, 0), torch.randn(shape)])
        x, y = strided(call_strides, 1), torch.randn(shape)
        before = counters["cpp"]["input layout changed: ran the graph with torch"]
        torch.testing.assert_close(compiled(x, y), fn(x, y))
        assert counters["cpp"]["input layout changed: ran the graph with torch"] == before
        if len(shape) > 1 and shape[-1] != 1:  # a changed stride of a dim that is not size 1 still falls back
            z = torch.randn(shape[::-1]).transpose(0, -1)
            torch.testing.assert_close(compiled(z, y), fn(z, y))
            assert counters["cpp"]["input layout changed: ran the graph with torch"] == before + 1


@pytest.mark.parametrize("change", ["flag", "strides", "dtype", "shape", "graph"])
def test_whatever_the_compile_reads_is_in_the_key(tmp_path, change):
    inputs = examples()
    fn, flags = program, {}
    with config.patch(cache_dir=str(tmp_path)):
        compile_fresh(program, inputs)
        if change == "flag":
            flags = {"cpp_in_place": False}
        elif change == "strides":
            inputs = [torch.randn(6, 4).t(), inputs[1]]
        elif change == "dtype":
            inputs = [t.double() for t in inputs]
        elif change == "shape":
            inputs = [torch.randn(3, 6), inputs[1]]
        else:
            def fn(x, w):
                return {"sum": torch.nn.functional.gelu(x @ w - 1).sum(-1)}
        counters.clear()
        other = compile_fresh(fn, inputs, **flags)
        assert not other.from_cache and cache_counts().get("graph misses") == 1
        torch.testing.assert_close(other(*inputs)["sum"], fn(*inputs)["sum"])


def test_a_large_tensor_constant_is_not_cached_and_counted(tmp_path):
    big = torch.randn(200, 200)  # 160 kB: over graph_cache.MAX_CONSTANT_BYTES

    def fn(x):
        return x + big

    x = torch.randn(200, 200)
    with config.patch(cache_dir=str(tmp_path)):
        counters.clear()
        c = compile_fresh(fn, [x])
        assert any(k.startswith("graphs not cached: a tensor constant") for k in counters["cache"])
        assert not list((tmp_path / "cpp").glob("*.graph"))
        torch.testing.assert_close(c(x), fn(x))


def test_a_fallback_calling_an_operator_overload_is_cached(tmp_path):
    """Found compiling the stages torch.distributed.pipelining's `pipeline()` splits (exported code calls
    torch.ops.aten overloads): an OpOverload does not pickle, and such graphs were compiled afresh in every
    process ("graphs not cached: a wrapper constant does not pickle")."""
    def fn(x):
        return torch.ops.aten._cdist_forward.default(x, x, 2.0, None) * 2 + 1

    x = torch.rand(4, 6)
    with config.patch(cache_dir=str(tmp_path)):
        counters.clear()
        cold = compile_fresh(fn, [x])
        assert counters["fallback"]["torch.ops.aten._cdist_forward.default"] >= 1
        assert not any(k.startswith("graphs not cached") for k in counters["cache"]), dict(counters["cache"])
        warm = compile_fresh(fn, [x])
        assert warm.from_cache
        torch.testing.assert_close(warm(x), fn(x))
        torch.testing.assert_close(cold(x), fn(x))


def test_evicted_kernels_and_a_corrupt_entry_compile_afresh(tmp_path):
    inputs = examples()
    with config.patch(cache_dir=str(tmp_path)):
        compile_fresh(program, inputs)
        for so in (tmp_path / "cpp").glob("*.so"):
            so.unlink()
        counters.clear()
        c = compile_fresh(program, inputs)
        assert not c.from_cache and cache_counts().get("graph misses: its kernels were evicted") == 1
        torch.testing.assert_close(c(*inputs)["sum"], program(*inputs)["sum"])
        (entry,) = (tmp_path / "cpp").glob("*.graph")
        data = entry.read_bytes()
        entry.unlink()
        entry.write_bytes(data[:20] + bytes(b ^ 0xFF for b in data[20:40]) + data[40:])
        entry.chmod(0o600)
        counters.clear()
        c = compile_fresh(program, inputs)
        assert not c.from_cache and cache_counts().get("graph entries refused") == 1
        torch.testing.assert_close(c(*inputs)["sum"], program(*inputs)["sum"])
        assert compile_fresh(program, inputs).from_cache  # rewritten whole


def test_the_flag_turns_it_off(tmp_path):
    with config.patch(cache_dir=str(tmp_path), graph_cache=False):
        compile_fresh(program, examples())
        assert compile_fresh(program, examples()).from_cache is False
    assert not list((tmp_path / "cpp").glob("*.graph"))


WARM = textwrap.dedent("""
    import json, sys, torch, kiln
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    compiled = kiln.compile(model)
    with torch.no_grad():
        out = compiled(x)
        loaded = "sympy" in sys.modules  # (before torch.testing, which imports it)
        torch.testing.assert_close(out, model(x))
    counts = {k: dict(v) for k, v in kiln.counters.items()}
    print("REPORT " + json.dumps({"sympy": loaded, "counters": counts}))
""")


def run_model(cache_dir):
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_RAISE_ON_ERROR="1")
    out = subprocess.run([sys.executable, "-c", WARM], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__))))
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def test_a_new_process_hits_and_never_imports_sympy(tmp_path):
    cold = run_model(tmp_path)
    warm = run_model(tmp_path)
    assert warm["counters"]["cache"].get("graph hits") == 1
    assert warm["counters"]["cache"].get("entry functions loaded", 0) >= 1
    # static sizes: neither the capture nor the hit needs sympy (~0.4 s of a warm start to import)
    assert warm["sympy"] is False
    strip = {k: v for k, v in cold["counters"].items() if k != "cache"}
    assert {k: v for k, v in warm["counters"].items() if k != "cache"} == strip
