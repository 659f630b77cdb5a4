"""Report writing of kiln bench: results.json, results.md, the table and the summary."""
import json
import math

from kiln.bench import report


def _rows():
    base = {"mode": "inference", "batch": 2}
    return [
        dict(base, model="a", compiler="eager", status="pass", time_ms=2.0, speedup=1.0),
        dict(base, model="a", compiler="torch.compile", status="pass", time_ms=1.0, speedup=2.0,
             compile_cold_s=10.0, compile_warm_s=2.0, peak_mem_mb=100.0),
        dict(base, model="b", compiler="eager", status="pass", time_ms=4.0, speedup=1.0),
        dict(base, model="b", compiler="torch.compile", status="pass", time_ms=0.5, speedup=8.0,
             compile_cold_s=20.0, compile_warm_s=4.0),
        dict(base, model="c", compiler="torch.compile", status="fail_accuracy", speedup=100.0,
             accuracy={"passed": False, "reason": "out (3,): RMSE too large"}),
        dict(base, model="a", compiler="kiln", status="unavailable", error="kiln.compile is not built yet"),
        dict(base, model="b", compiler="kiln", status="error", error="ValueError: bad | pipe"),
    ]


def test_summary_geomean_over_passing_models_only():
    summary = report.summarize(_rows())
    tc = summary["torch.compile"]
    assert (tc["ran"], tc["passed"]) == (3, 2)
    assert math.isclose(tc["geomean_speedup"], 4.0)           # sqrt(2 * 8); the failing 100x is left out
    assert math.isclose(tc["pass_rate"], 2 / 3)
    assert (tc["median_compile_cold_s"], tc["median_compile_warm_s"]) == (15.0, 3.0)
    kiln = summary["kiln"]
    assert (kiln["ran"], kiln["passed"], kiln["unavailable"]) == (1, 0, 1)
    assert kiln["geomean_speedup"] is None


def test_write_json_and_markdown(tmp_path):
    run = {"meta": {"suite": "quick", "mode": "inference", "torch": "2.x"}, "rows": _rows()}
    paths = report.write(run, str(tmp_path / "out"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["results.json", "results.md"]
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["rows"] == _rows() and data["meta"]["suite"] == "quick"
    assert math.isclose(data["summary"]["torch.compile"]["geomean_speedup"], 4.0)
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| model | compiler | status |" in md
    assert "| b | torch.compile | pass | - | 0.500 | 8.00x | - | 20.0 | 4.0 |" in md
    assert "torch.compile: pass rate 2/3 (67%), geomean speedup 4.00x" in md
    assert "c / torch.compile: fail_accuracy: out (3,): RMSE too large" in md
    assert "ValueError: bad \\| pipe" not in md and "b / kiln: error: ValueError: bad | pipe" in md
    assert md.count("\n| ") == len(_rows()) + 1


def test_terminal_table_has_a_line_per_row_and_the_summary():
    text = report.table(_rows())
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["model", "compiler", "status"]
    assert sum(1 for line in lines if line.startswith(("a ", "b ", "c "))) == len(_rows())
    assert any(line.startswith("torch.compile: pass rate 2/3") for line in lines)
    assert any("FAIL acc" in line for line in lines)
    assert all(len(line) <= 160 for line in lines)


def test_busy_machine_note():
    assert report.busy_note({"cpus": 2, "load_average": 1.5}) is None     # a run written before the reasons
    note = report.busy_note({"cpus": 2, "load_average_start": 9.0, "load_average": 3.0, "threads": 2})
    assert "BUSY MACHINE (load 9 on 2 CPUs)" in note and "--threads 1" in note
    assert "--threads 1" not in report.busy_note({"cpus": 2, "load_average": 9.0, "threads": 1})
    assert report.busy_note({"cpus": 2, "busy": [], "threads": 1}) is None
