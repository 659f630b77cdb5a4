"""bench/compile_worker.py (kiln only: inductor's cold compile is too slow for a test) and the compile-time
summary of bench/bench_kernels.py."""
import json
import os
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_kernels  # noqa: E402


def run_worker(cache, case="softmax", size=64):
    command = [sys.executable, str(BENCH / "compile_worker.py"), "--case", case, "--compiler", "kiln",
               "--cache", str(cache), "--size", str(size), "--steady-window", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kiln_worker_cold_then_warm(tmp_path):
    cold = run_worker(tmp_path)
    assert cold["case"] == "softmax" and cold["compiler"] == "kiln"
    assert cold["compile_s"] > 0 and cold["first_call_s"] >= cold["compile_s"] and cold["import_s"] > 0
    assert cold["steady_calls"] >= 5
    # one graph, compiled by the cpp backend into the cache directory named on the command line
    assert (cold["graphs"], cold["graph_breaks"], cold["capture_errors"], cold["graphs_run_with_torch"]) \
        == (1, 0, 0, 0)
    assert cold["cache_files_before"] == 0 and cold["cache_files_after"] >= 1
    assert any(name.endswith(".so") for _, _, names in os.walk(tmp_path / "kiln") for name in names)
    warm = run_worker(tmp_path)   # a new process on the filled cache: nothing built
    assert warm["cache_files_after"] == warm["cache_files_before"] == cold["cache_files_after"]
    assert warm["graphs"] == 1 and warm["graphs_run_with_torch"] == 0


def test_worker_unknown_case_fails(tmp_path):
    command = [sys.executable, str(BENCH / "compile_worker.py"), "--case", "no such case", "--compiler",
               "kiln", "--cache", str(tmp_path), "--size", "8"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "unknown case" in done.stderr


def result(compile_s, files=(1, 1), **extra):
    return {"compile_s": compile_s, "import_s": 0.1, "graphs": 1, "cache_files_before": files[0],
            "cache_files_after": files[1], **extra}


def test_summary_takes_the_worst_block_against_the_targets(capsys):
    rows = {"a": {"kiln": (result(1.0), result(0.2)), "inductor": (result(10.0), result(2.0))},
            "b": {"kiln": (result(3.0), result(0.7)), "inductor": (result(12.0), result(2.0))},
            "c": {"kiln": ({"error": "boom"}, {"error": "boom"}),
                  "inductor": (result(5.0), result(1.0))}}
    bench_kernels.summarize_compile_times(rows, "blocks")
    out = capsys.readouterr().out.splitlines()
    assert out == ["# blocks: max kiln cold / inductor cold = 0.250 (b); target <= 0.2: NOT met",
                   "# blocks: max kiln warm (new process) = 0.70 s (b); target <= 0.5 s: NOT met"]


def test_kiln_warnings_flag_fallbacks_and_warm_rebuilds():
    assert bench_kernels.kiln_warnings(result(1.0, graphs_run_with_torch=0), result(0.1)) == []
    notes = bench_kernels.kiln_warnings(result(1.0, graphs_run_with_torch=1), result(0.1, files=(1, 2)))
    assert len(notes) == 2 and "1 graphs run with torch" in notes[0] and "missed its cache" in notes[1]
