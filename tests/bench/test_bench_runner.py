"""kiln bench end to end on one tiny model with eager only (a real worker process), and the CLI."""
import json

from kiln import cli
from kiln.bench import runner


def test_runner_one_model_eager(tmp_path):
    options = runner.Options(models=["mlp"], backends=("eager",), batch=2, out=str(tmp_path),
                             budget_s=0.05, threads=1, plots=False, progress=False)
    results = runner.run(options)
    rows = results["rows"]
    assert [(r["model"], r["compiler"]) for r in rows] == [("mlp", "eager")]
    eager = rows[0]
    assert eager["status"] == "pass", eager
    assert eager["speedup"] == 1.0 and eager["time_ms"] > 0 and eager["batch"] == 2
    assert eager["accuracy"]["passed"] and eager["peak_mem_mb"] >= 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["rows"][0]["status"] == "pass" and not data["meta"]["interrupted"]
    assert "| mlp | eager | pass |" in (tmp_path / "results.md").read_text()


def test_unavailable_compilers_are_rows_without_a_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(runner.adapters, "kiln_availability", lambda: "kiln.compile is not built yet")

    def launch(job, timeout_s):
        raise AssertionError(f"no worker should run for {job}")
    options = runner.Options(models=["mlp"], backends=("kiln", "no_such_baseline"), out=str(tmp_path),
                             plots=False, progress=False)
    rows = runner.run(options, launch=launch)["rows"]
    assert [r["status"] for r in rows] == ["unavailable", "unavailable"]
    assert rows[0]["error"] == "kiln.compile is not built yet"


def test_a_failing_row_does_not_stop_the_run(tmp_path):
    def launch(job, timeout_s):
        if job["model"] == "mlp":
            return {"status": "error", "error": "RuntimeError: boom"}
        return {"status": "pass", "compiled_ms": 1.0, "eager_ms": 1.0, "speedup": 1.0, "compile_s": 0.0}
    options = runner.Options(models=["mlp", "nanogpt_tiny"], backends=("eager",), out=str(tmp_path),
                             plots=False, progress=False)
    rows = runner.run(options, launch=launch)["rows"]
    assert [(r["model"], r["status"]) for r in rows] == [("mlp", "error"), ("nanogpt_tiny", "pass")]
    assert "mlp / eager: error: RuntimeError: boom" in (tmp_path / "results.md").read_text()


def test_runner_records_a_timeout_as_a_row(tmp_path):
    options = runner.Options(models=["mlp"], backends=("eager",), batch=2, out=str(tmp_path),
                             timeout_s=0.01, plots=False, progress=False)
    rows = runner.run(options)["rows"]
    assert rows[0]["status"] == "timeout"


def test_cli_list_and_bad_model(capsys):
    assert cli.main(["bench", "--list"]) == 0
    assert "nanogpt" in capsys.readouterr().out
    assert cli.main(["bench", "--models", "no_such_model"]) == 2
    assert "unknown model 'no_such_model'" in capsys.readouterr().err
