"""A bench that is right or says it is not: the speedup's spread over interleaved pairs, the mark on a
speedup within noise, the mark on a busy run (table, markdown, plots), the plot legend, and one real run
whose JSON carries the load, the copy bandwidth and the spreads."""
import importlib.util
import json
import subprocess
import sys

import pytest

from kiln.bench import machine, plots, report, runner, worker


def _row(model, compiler, speedup, q1=None, q3=None, status="pass"):
    row = {"model": model, "compiler": compiler, "mode": "inference", "batch": 2, "status": status,
           "time_ms": 1.0, "eager_ms": speedup, "speedup": speedup}
    if q1 is not None:
        row.update(speedup_q1=q1, speedup_q3=q3, speedup_min=q1 - 0.1, speedup_max=q3 + 0.1)
    return row


def test_ratio_spread_of_synthetic_pairs():
    eager = [2.0] * 9
    compiled = [1.0, 1.0, 2.0, 1.0, 0.5, 1.0, 1.0, 4.0, 1.0]     # per-pair ratios 2, 2, 1, 2, 4, 2, 2, .5, 2
    spread = worker.ratio_spread(eager, compiled)
    assert (spread["speedup_min"], spread["speedup_max"]) == (0.5, 4.0)
    assert spread["speedup_pair_median"] == 2.0
    assert spread["speedup_q1"] == 2.0 and spread["speedup_q3"] == 2.0
    assert worker.ratio_spread([1.0], [1.0]) == {}


def test_a_spread_wider_than_the_distance_from_1_is_marked():
    noisy = _row("a", "kiln", 1.07, q1=0.98, q3=1.16)        # IQR 0.18 > 0.07
    clear = _row("b", "kiln", 1.50, q1=1.40, q3=1.60)        # IQR 0.20 < 0.50
    slower = _row("c", "kiln", 0.70, q1=0.60, q3=0.85)       # IQR 0.25 < 0.30: a real slowdown
    bare = _row("d", "kiln", 1.07)                           # no pairs (an old run): not judged
    assert [report.unreliable(r) for r in (noisy, clear, slower, bare)] == [True, False, False, False]
    assert report.speedup_cell(noisy) == "1.07x ?" and report.speedup_cell(clear) == "1.50x"
    text = report.table([noisy, clear, slower])
    line = next(line for line in text.splitlines() if line.startswith("a "))
    assert "1.07x ?" in line and "0.98-1.16" in line
    assert "1 of them within noise ?" in text and "?: the speedup's spread" in text
    md = report.markdown({"meta": {}, "rows": [noisy, clear]})
    assert "| a | kiln | pass | 1.070 | 1.000 | 1.07x ? | 0.98-1.16 |" in md
    assert report.summarize([noisy, clear])["kiln"]["unreliable"] == 1


def test_busy_load_or_slow_copy_marks_the_run():
    idle = {"copy_gbps": 20.0, "copy_gbps_median": 18.0}
    quiet = {"load": 1.2, "copy_gbps": 19.0, "copy_gbps_median": 17.5}
    assert machine.busy_reasons([quiet, quiet], idle, cpus=2) == []
    loaded = dict(quiet, load=5.5)
    assert machine.busy_reasons([quiet, loaded], idle, cpus=2) == ["load 5.5 on 2 CPUs"]
    slow = dict(quiet, copy_gbps_median=6.0)
    assert machine.busy_reasons([slow], idle, cpus=2) == ["copy bandwidth 6 GB/s, idle 18"]
    assert machine.busy_reasons([slow], None, cpus=2) == []      # no idle reference: load only
    # a row's own load during its timing counts too
    meta = {"cpus": 2, "machine_before": quiet, "machine_after": quiet, "machine_idle": idle}
    rows = [dict(_row("a", "kiln", 1.5), load_before=1.0, load_after=3.5)]
    meta["busy"] = runner.run_busy_reasons(meta, rows)
    assert meta["busy"] == ["load 3.5 on 2 CPUs"]
    text = report.table(rows, dict(meta, threads=1))
    assert text.splitlines()[0] == ("*** BUSY MACHINE (load 3.5 on 2 CPUs): times and speedups are not to "
                                    "be trusted ***")
    assert "machine: 2 CPUs, 1 thread(s); before: load 1.2, copy 17.5 GB/s" in text
    assert "**BUSY MACHINE" in report.markdown({"meta": meta, "rows": rows})
    assert not report.table(rows, dict(meta, busy=[])).startswith("***")


def _figures(monkeypatch, rows, meta, tmp_path):
    import matplotlib.figure
    saved = []
    original = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return original(fig, *args, **kwargs)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    paths = plots.write(rows, str(tmp_path), meta)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["speedup.png", "compile_time.png"]
    return saved


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib (plots extra)")
def test_plots_legend_and_busy_mark(monkeypatch, tmp_path):
    rows = [_row("a", "eager", 1.0), _row("a", "kiln", 1.07, q1=0.98, q3=1.16),
            dict(_row("a", "torch.compile", 1.3, q1=1.2, q3=1.4), compile_cold_s=10.0)]
    quiet = _figures(monkeypatch, rows, {"busy": []}, tmp_path)
    legend = [t.get_text() for t in quiet[0].axes[0].get_legend().get_texts()]
    assert legend == ["kiln", "torch.compile"]                 # nothing failed: no "failed" entry
    assert "1.07 ?" in [t.get_text() for t in quiet[0].axes[0].texts]
    assert all(not fig.texts for fig in quiet)                 # a quiet run: no mark

    rows.append(_row("b", "kiln", 0.0, status="fail_accuracy"))
    busy = _figures(monkeypatch, rows, {"busy": ["load 4 on 2 CPUs"], "threads": 1}, tmp_path)
    legend = [t.get_text() for t in busy[0].axes[0].get_legend().get_texts()]
    assert legend == ["kiln", "torch.compile", "failed (error / accuracy)"]
    for fig in busy:                                           # every plot says the run was busy
        assert any("BUSY MACHINE (load 4 on 2 CPUs)" in t.get_text() for t in fig.texts)


def test_defaults_are_one_thread_and_enough_pairs():
    assert runner.Options().threads == 1
    assert worker.MIN_REPS >= 20
    from kiln import cli
    args = cli.build_parser().parse_args(["bench"])
    assert args.threads == 1


def test_real_quick_run_records_load_bandwidth_and_spreads(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "kiln.cli", "bench", "--suite", "quick", "--models", "mlp",
                           "--backends", "eager,kiln", "--budget", "0.2", "--no-warm", "--no-plots",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((out / "results.json").read_text())
    meta = data["meta"]
    for key in ("machine_before", "machine_after"):
        assert meta[key]["load"] >= 0 and meta[key]["copy_gbps"] > 0.1
        assert 0 < meta[key]["copy_gbps_median"] <= meta[key]["copy_gbps"]
    assert isinstance(meta["busy"], list) and meta["threads"] == 1
    kiln_row = next(r for r in data["rows"] if r["compiler"] == "kiln")
    assert kiln_row["status"] == "pass", kiln_row
    assert kiln_row["reps"] >= worker.MIN_REPS
    assert kiln_row["speedup_min"] <= kiln_row["speedup_q1"] <= kiln_row["speedup_pair_median"] \
        <= kiln_row["speedup_q3"] <= kiln_row["speedup_max"]
    assert kiln_row["load_before"] is not None and kiln_row["load_after"] is not None
    # the bandwidth copies (256 MB) run in their own process: a worker inherits its parent's peak RSS
    eager_row = next(r for r in data["rows"] if r["compiler"] == "eager")
    assert eager_row["peak_mem_mb"] < 100, eager_row
    assert "pairs IQR" in done.stdout and "machine: " in done.stdout
    assert ("BUSY MACHINE" in done.stdout) == bool(meta["busy"])
