"""Memory: the bench's RSS comparison with eager (worker phase `memory`, runner, report), and the bound and
release of the buffer pool the generated wrappers keep across calls."""
import shutil

import pytest
import torch

import kiln
import kiln.ops
from kiln import config
from kiln.bench import report, runner, worker
from kiln.codegen.wrapper import pooled_bytes, release_pools


def _memory_rows():
    base = {"mode": "inference", "batch": 2, "status": "pass"}
    return [
        dict(base, model="a", compiler="eager", rss_base_mb=200.0, rss_peak_mb=300.0, rss_steady_mb=210.0,
             rss_first_peak_mb=300.0),
        dict(base, model="a", compiler="kiln", rss_base_mb=200.0, rss_peak_mb=315.0, rss_steady_mb=252.0,
             rss_first_peak_mb=400.0),
        dict(base, model="b", compiler="eager", rss_base_mb=100.0, rss_peak_mb=100.0, rss_steady_mb=100.0),
        dict(base, model="b", compiler="kiln", rss_base_mb=100.0, rss_peak_mb=125.0, rss_steady_mb=100.0),
        dict(base, model="c", compiler="kiln", memory_error="RuntimeError: boom"),
    ]


def test_memory_table_compares_each_compiler_with_eager():
    rows = _memory_rows()
    cells = {(line[0], line[1]): line for line in report.memory_cells(rows)}
    assert cells[("a", "kiln")][3:7] == ["315", "252", "1.05x", "1.20x"]
    assert cells[("b", "kiln")][5] == "1.25x"
    assert cells[("c", "kiln")][2] == "error: RuntimeError: boom"
    summary = report.memory_summary(rows)
    assert summary == ["kiln memory: peak RSS within 10% of eager's for 1/2 models; over: b 1.25x"]
    text = report.table(rows)
    assert "peak/eager" in text and summary[0] in text
    assert "## Memory" in report.markdown({"meta": {}, "rows": rows})
    assert "peak/eager" not in report.table([{"model": "a", "compiler": "eager", "status": "pass"}])


def test_runner_adds_a_memory_run_per_row(tmp_path):
    jobs = []

    def launch(job, timeout_s):
        jobs.append(job["phase"])
        if job["phase"] == "memory":
            peak = 100.0 if job["backend"] == "eager" else 104.0
            return {"status": "pass", "rss_base_mb": 90.0, "rss_peak_mb": peak, "rss_steady_mb": 95.0,
                    "rss_first_peak_mb": 120.0, "peak_reset": True}
        return {"status": "pass", "compiled_ms": 1.0, "eager_ms": 1.0, "speedup": 1.0, "compile_s": 0.0}
    options = runner.Options(models=["mlp"], backends=("eager", "kiln"), out=str(tmp_path), plots=False,
                             progress=False, warm=False, memory=True)
    rows = runner.run(options, launch=launch)["rows"]
    assert jobs == ["measure", "memory", "measure", "memory"]
    assert [r["rss_peak_mb"] for r in rows] == [100.0, 104.0]
    assert "within 10% of eager's for 1/1 models" in report.table(rows)


def test_memory_only_runs_nothing_else(tmp_path):
    jobs = []

    def launch(job, timeout_s):
        jobs.append(job["phase"])
        return {"status": "pass", "rss_base_mb": 90.0, "rss_peak_mb": 100.0, "rss_steady_mb": 95.0}
    options = runner.Options(models=["mlp"], backends=("eager", "kiln"), out=str(tmp_path), plots=False,
                             progress=False, memory=True, memory_only=True)
    rows = runner.run(options, launch=launch)["rows"]
    assert jobs == ["memory", "memory"] and [r["status"] for r in rows] == ["pass", "pass"]
    assert [r["rss_steady_mb"] for r in rows] == [95.0, 95.0]


def test_worker_memory_phase_measures_this_process():
    result = worker.run_job({"phase": "memory", "model": "mlp", "backend": "eager", "mode": "inference",
                             "batch": 2})
    if result["status"] == "unavailable":
        pytest.skip(result["error"])
    assert result["status"] == "pass", result
    assert result["rss_peak_mb"] >= result["rss_base_mb"] > 0 and result["rss_steady_mb"] > 0


# ---- the buffer pool of the generated wrappers -----------------------------------------------------------

def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)  # the kernel sums in its own order


@pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")
@pytest.mark.parametrize("runs", [False, True], ids=["steps", "runs"])
def test_pool_is_bounded_and_released(tmp_path, runs):
    """Buffers of 128 KiB or more are kept for the next call, within pool_max_bytes; kiln.reset() frees them.
    With runs (kiln.codegen.cpp_native) the whole graph is one run, whose arena holds both the doubled input
    and the product (the product is no torch result any more): twice the bytes, kept or refused whole."""
    from kiln.backends.cpp import compile_graph

    def fn(x):
        return torch.mm(x * 2, x).sum(1)  # x * 2: freed after the mm, kept for the next call
    x = torch.randn(256, 256)
    nbytes = 256 * 256 * 4  # the sum's 1 KiB is below wrapper.POOL_MIN_BYTES: malloc reuses it for free
    kept = 2 * nbytes if runs else nbytes
    with config.patch(cache_dir=str(tmp_path), raise_on_error=True, native_runs=runs):
        compiled = compile_graph(kiln.ops.trace(fn, x), [x])
        small = compile_graph(kiln.ops.trace(fn, x[:64, :64].clone()), [x[:64, :64].clone()])
    expected = fn(x)
    release_pools()
    assert pooled_bytes() == 0
    _close(small(x[:64, :64].clone()), fn(x[:64, :64].clone()))
    assert pooled_bytes() == 0  # 16 KiB buffers are not pooled
    _close(compiled(x), expected)
    assert pooled_bytes() == kept
    _close(compiled(x), expected)  # the pooled intermediate is reused
    assert pooled_bytes() == kept
    for bound, now in ((kept, kept), (kept - 1, 0), (0, 0), (-1, kept)):
        release_pools()
        with config.patch(pool_max_bytes=bound):
            _close(compiled(x), expected)
            assert pooled_bytes() == now, bound
    kiln.reset()
    assert pooled_bytes() == 0
    _close(compiled(x), expected)


@pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")
def test_training_graphs_keep_no_pool_and_no_examples(tmp_path):
    """A training step's forward and backward keep no buffers across calls (a pool would hold the forward's
    through the backward, over eager's peak), and a compiled graph keeps no example tensor alive (a graph
    cache hit kept its examples for rebuilding the IR: activation-sized memory for as long as it lived)."""
    import gc
    import weakref

    def fn(x, w):
        return torch.tanh(torch.mm(x * 2, w)).sum()
    w = torch.randn(256, 256, requires_grad=True)
    for attempt in range(2):                 # cold, then a graph-cache hit
        x = torch.randn(256, 256)
        probe = weakref.ref(x)
        with config.patch(cache_dir=str(tmp_path), raise_on_error=True):
            compiled = kiln.compile(fn)
            release_pools()
            compiled(x, w).backward()
            compiled(x, w).backward()
        assert pooled_bytes() == 0
        expected = w.grad.clone()
        w.grad = None
        fn(x, w).backward()
        torch.testing.assert_close(expected / 2, w.grad)
        w.grad = None
        del x
        gc.collect()
        assert probe() is None, f"attempt {attempt}: the example input is still alive"
        with torch.no_grad():
            y = torch.randn(256, 256)
            kiln.compile(fn)(y, w)
        assert pooled_bytes() > 0            # inference graphs still pool
        kiln.reset()
