"""kiln.profile: one row per kernel the cpp backend generated and per extern call, bytes and FLOPs from the
buffers' sizes, JSON round trip, the roofline PNG, and a normal compile that has no timing code."""
from __future__ import annotations

import importlib.util
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config, profiler
from kiln.bench import machine
from kiln.backends import GraphCompiler
from kiln.backends.cpp import compile_graph
from kiln.capture.cache import CompiledFunction
from kiln.graph.pipeline import CompileContext

FAKE_PEAKS = {"copy_gbps": 20.0, "matmul_gflops": 100.0, "threads": 1, "cpu": "test", "measured": "now",
              "load": 0.5, "cpus": 2, "busy": False}


def small(a, b, w):
    y = F.gelu(a * b + 1).sum(-1)  # one fused reduction kernel: reads a and b, writes y
    z = a @ w  # an extern mm
    return y + z.sum(-1)


def broken(x):
    y = torch.relu(x) * 2
    print("graph break")  # the call breaks here: two graphs, both profiled
    return y.sum() + 1


A, B, W = torch.randn(64, 128), torch.randn(64, 128), torch.randn(128, 32)


@pytest.fixture(scope="module")
def report():
    real = profiler.machine_peaks
    profiler.machine_peaks = lambda remeasure=False: dict(FAKE_PEAKS, cached=True)
    try:
        result = kiln.profile(small, A, B, W, repeat=3, warmup=1)
    finally:
        profiler.machine_peaks = real
    return result


def test_result_equals_eager(report):
    torch.testing.assert_close(report.result, small(A, B, W), rtol=1e-4, atol=1e-4)


def test_one_row_per_kernel_and_extern(report):
    compiled = report.compiled_graphs
    assert len(compiled) == 1 and len(report.graphs) == 1
    kernels = [r for r in report.rows if r.kind == "kernel"]
    assert len(kernels) == sum(c.kernel_count for c in compiled) >= 2
    assert [r.name for r in kernels] == [g.name for c in compiled for g in c.kernels]
    externs = [r for r in report.rows if r.kind == "extern"]
    assert len(externs) == sum(n.kind == "extern" for c in compiled for n in c.externs)
    assert any(r.op in ("prims.mm", "torch.addmm") for r in externs)


def test_bytes_flops_and_origins(report):
    gelu = [r for r in report.rows if r.kind == "kernel" and any("F.gelu(a * b + 1)" in o for o in r.origins)]
    assert len(gelu) == 1
    row = gelu[0]
    assert row.bytes == A.nbytes + B.nbytes + 64 * 4  # reads a and b, writes y (64 floats)
    assert row.flops > 0 and row.flops % (64 * 128) == 0  # ops per element x the elements of a * b
    mm = next(r for r in report.rows if r.kind == "extern")
    assert mm.bytes == A.nbytes + W.nbytes + 64 * 32 * 4
    assert mm.flops == 2 * 64 * 128 * 32
    assert any("a @ w" in o for o in mm.origins)


def test_times_rates_and_labels(report):
    for r in report.rows:
        assert r.time_us > 0, r
        assert r.label in profiler.LABELS
        assert r.gbps == pytest.approx(r.bytes / (r.time_us * 1e-6) / 1e9)
        assert r.pct_bandwidth == pytest.approx(100 * r.gbps / FAKE_PEAKS["copy_gbps"])
    assert report.wall_us > 0
    assert 0.0 <= report.outside_kernels_share <= 1.0
    g = report.graphs[0]
    assert g.total_us >= g.rows_us * 0.5 and g.wrapper_us >= 0 and g.calls == 1


def test_label_rule():
    fast = profiler.ProfileRow("g", "kernel", "k", "", 2.0, 10 ** 6, 0)
    fast.judge(FAKE_PEAKS)
    assert fast.label == "overhead-bound"  # under OVERHEAD_US
    stream = profiler.ProfileRow("g", "kernel", "k", "", 100.0, 10 ** 6, 10 ** 5)
    stream.judge(FAKE_PEAKS)  # 1 MB in 100 us: the roofline time (50 us at 20 GB/s) is half of it
    assert stream.label == "memory-bound"
    matmul = profiler.ProfileRow("g", "extern", "b", "", 100.0, 10 ** 5, 10 ** 7)
    matmul.judge(FAKE_PEAKS)
    assert matmul.label == "compute-bound"
    tiny = profiler.ProfileRow("g", "kernel", "k", "", 50.0, 1000, 1000)
    tiny.judge(FAKE_PEAKS)
    assert tiny.label == "overhead-bound"  # far below both roofs


def test_table_and_json_round_trip(report, tmp_path):
    text = str(report)
    for r in report.rows:
        assert r.name in text
    assert "outside every kernel" in text and "wrappers' own time" in text
    data = json.loads(report.to_json())
    assert len(data["rows"]) == len(report.rows)
    again = profiler.ProfileReport.from_json(report.to_json())
    assert again.to_dict() == data
    path = report.save_json(str(tmp_path / "p.json"))
    with open(path) as f:
        assert json.load(f) == data


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_roofline_png(report, tmp_path):
    path = report.plot(str(tmp_path / "roof.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how(report, tmp_path, monkeypatch):
    from kiln import profile_plot
    monkeypatch.setattr(profile_plot, "available", lambda: False)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        report.plot(str(tmp_path / "roof.png"))


def _compile_with(options):
    got = []

    def backend(graph, example_inputs, context=None):
        compiled = compile_graph(graph, example_inputs, context)
        got.append(compiled)
        return compiled
    fn = CompiledFunction(small, GraphCompiler(backend, CompileContext(options=options)), family=object())
    fn(A, B, W)
    return got[0]


def test_normal_compile_has_no_timing_code():
    normal, profiled = _compile_with({}), _compile_with({"profile": True})
    assert normal.timings is None and profiled.timings is not None
    for word in ("omp_get_wtime", "kiln_times"):
        assert word not in normal.cpp_source and word in profiled.cpp_source
    for word in ("_kiln_now", "_kiln_timing"):
        assert word not in normal.wrapper_source and word in profiled.wrapper_source
    assert normal.cpp_source != profiled.cpp_source  # a separate entry in the kernel cache
    # the same kernels either way, the profiled source only adds the timing lines
    # (a run's entry takes and passes on one times array per step: kiln_times<step>)
    stripped = "\n".join(line for line in profiled.cpp_source.splitlines() if "omp_get_wtime" not in line)
    stripped = re.sub(r", (double\* (__restrict__ )?)?kiln_times\d*", "", stripped)
    assert stripped == normal.cpp_source.rstrip("\n") or stripped + "\n" == normal.cpp_source


def test_graph_break_profiles_every_graph(monkeypatch, capsys):
    monkeypatch.setattr(profiler, "machine_peaks", lambda remeasure=False: dict(FAKE_PEAKS, cached=True))
    x = torch.randn(1000)
    report = profiler.profile(broken, x, repeat=2, warmup=0)
    assert len(report.graphs) == 2
    assert {r.graph for r in report.rows} == {g.name for g in report.graphs}
    torch.testing.assert_close(report.result, broken(x))


def test_fallback_rows(monkeypatch):
    monkeypatch.setattr(profiler, "machine_peaks", lambda remeasure=False: dict(FAKE_PEAKS, cached=True))

    def with_sort(x):
        return torch.sort(x * 2, dim=-1).values + 1
    x = torch.randn(8, 16)
    report = profiler.profile(with_sort, x, repeat=2, warmup=0)
    torch.testing.assert_close(report.result, with_sort(x))
    kinds = {r.kind for r in report.rows}
    assert "fallback" in kinds or "extern" in kinds, report
    other = [r for r in report.rows if r.kind in ("fallback", "extern")]
    assert other and all(r.time_us > 0 and r.bytes > 0 for r in other)


def test_machine_peaks_measured_once_and_cached(tmp_path, monkeypatch):
    calls = []

    def measure():
        calls.append(1)
        return dict(FAKE_PEAKS)
    monkeypatch.setattr(machine, "measure_peaks", measure)
    with config.patch(cache_dir=str(tmp_path)):
        first = profiler.machine_peaks()
        second = profiler.machine_peaks()
    assert len(calls) == 1 and not first["cached"] and second["cached"]
    assert second["copy_gbps"] == FAKE_PEAKS["copy_gbps"]
    assert (tmp_path / "profile" / profiler.PEAKS_FILE).exists()


def test_machine_peaks_measured_busy_are_measured_again(tmp_path, monkeypatch):
    loads = [7.5, 0.4, 0.4]   # the first measurement under load 7.5 on 2 CPUs

    def measure():
        load = loads.pop(0)
        return dict(FAKE_PEAKS, copy_gbps=5.0 if load > 2 else 20.0, load=load, busy=load > 2)
    monkeypatch.setattr(machine, "measure_peaks", measure)
    with config.patch(cache_dir=str(tmp_path)):
        busy = profiler.machine_peaks()
        assert machine.cached_peaks(threads=torch.get_num_threads()) is None   # not trusted
        idle = profiler.machine_peaks()
        again = profiler.machine_peaks()
    assert (busy["copy_gbps"], busy["cached"]) == (5.0, False)
    assert (idle["copy_gbps"], idle["cached"]) == (20.0, False)
    assert again["cached"] and again["load"] == 0.4 and loads == [0.4]


def test_machine_peaks_store_their_spread_and_load():
    peaks = machine.measure_peaks()
    assert peaks["copy_gbps_median"] <= peaks["copy_gbps"]
    assert peaks["matmul_gflops_median"] <= peaks["matmul_gflops"]
    assert peaks["cpus"] >= 1 and isinstance(peaks["busy"], bool)
    assert peaks["load"] is None or peaks["busy"] == (peaks["load"] > peaks["cpus"])


def test_cache_clear_removes_the_roofs(tmp_path, monkeypatch, capsys):
    from kiln import cli
    monkeypatch.setattr(machine, "measure_peaks", lambda: dict(FAKE_PEAKS))
    with config.patch(cache_dir=str(tmp_path)):
        profiler.machine_peaks()
        assert (tmp_path / "profile" / profiler.PEAKS_FILE).exists()
        assert cli.main(["cache", "clear"]) == 0
    assert not (tmp_path / "profile" / profiler.PEAKS_FILE).exists()
    assert "machine roofs" in capsys.readouterr().out


def test_measure_peaks_is_positive():
    peaks = profiler.measure_peaks()
    assert peaks["copy_gbps"] > 0.1 and peaks["matmul_gflops"] > 0.1 and math.isfinite(peaks["copy_gbps"])


def test_bench_profile_only_writes_table_json_and_png(tmp_path, monkeypatch):
    from kiln.bench import runner, worker
    monkeypatch.setattr(profiler, "machine_peaks", lambda remeasure=False: dict(FAKE_PEAKS, cached=True))
    options = runner.Options(models=["mlp"], out=str(tmp_path), profile_only=True, profile_repeat=2,
                             progress=False, plots=False)
    results = runner.run(options, launch=lambda job, timeout: worker.run_job(job))
    assert results["rows"] == []
    (entry,) = results["profiles"]
    assert entry["status"] == "pass", entry
    assert "kiln.profile MLP" in entry["table"]
    for ext in ("txt", "json") + (("png",) if importlib.util.find_spec("matplotlib") else ()):
        assert (tmp_path / "profile" / f"mlp.{ext}").exists()
    with open(tmp_path / "profile" / "mlp.json") as f:
        assert any(r["kind"] == "extern" for r in json.load(f)["rows"])


def test_cli_parses_profile_flags():
    from kiln.cli import build_parser
    args = build_parser().parse_args(["bench", "--models", "mlp", "--profile"])
    assert args.profile and not args.profile_only
    assert build_parser().parse_args(["bench", "--profile-only"]).profile_only


def test_graph_handed_to_torch_is_a_row(monkeypatch):
    monkeypatch.setattr(profiler, "machine_peaks", lambda remeasure=False: dict(FAKE_PEAKS, cached=True))

    def on_complex(x):
        return (x * 2).abs() + 1
    x = torch.randn(8, dtype=torch.complex64)
    report = profiler.profile(on_complex, x, repeat=2, warmup=0)
    torch.testing.assert_close(report.result, on_complex(x))
    (row,) = report.rows
    assert row.kind == "torch graph" and row.time_us > 0 and row.bytes is None
    assert report.graphs[0].note.startswith("handed to torch")
    assert "graph(s) run with torch" in str(report)


def test_flops_count_per_channel_math_once_per_channel(monkeypatch):
    monkeypatch.setattr(profiler, "machine_peaks", lambda remeasure=False: dict(FAKE_PEAKS, cached=True))
    bn = torch.nn.BatchNorm2d(8).eval()
    x = torch.randn(4, 8, 16, 16)

    def norm_relu(x):
        return torch.relu(bn(x))
    with torch.no_grad():
        report = profiler.profile(norm_relu, x, repeat=2, warmup=0)
    (row,) = [r for r in report.rows if r.kind == "kernel"]
    # a few ops per element (sub, mul, add, max); rsqrt(var + eps) and its products once per channel
    assert x.numel() <= row.flops <= 5 * x.numel() + 16 * 8
    assert row.bytes == 2 * x.nbytes + 4 * 8 * 4  # x in, out, four per-channel vectors


def test_training_step_profiles_the_backward_too(monkeypatch):
    monkeypatch.setattr(profiler, "machine_peaks", lambda remeasure=False: dict(FAKE_PEAKS, cached=True))
    conv = torch.nn.Conv2d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 8, 8)

    def step(x):
        loss = conv(x).relu().sum()
        loss.backward()
        return loss
    with config.patch(conv_gemm_max_macs=0):  # the extern's backward, whose FLOPs this checks
        report = profiler.profile(step, x, repeat=2, warmup=0)
    graphs = {r.graph for r in report.rows}
    assert any(g.endswith(".backward") for g in graphs), graphs
    conv_backward = [r for r in report.rows if r.op.endswith("convolution_backward")]
    assert conv_backward and conv_backward[0].time_us > 0
    (node,) = [n for c in report.compiled_graphs for n in c.externs if n.target_name.endswith("_backward")]
    mask = node.args[10]  # the gradients it computes: input, weight, bias
    assert conv_backward[0].flops == 2 * 2 * 8 * 64 * 4 * 9 * (mask[0] + mask[1]) + 2 * 8 * 64 * mask[2]
