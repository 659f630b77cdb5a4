"""kiln bench end to end on one tiny model with eager only (a real worker process), and the CLI."""
import ast
import json
import pathlib

from kiln import cli
from kiln.bench import runner

KILN = pathlib.Path(__file__).resolve().parents[2] / "kiln"


def test_runner_one_model_eager(tmp_path):
    options = runner.Options(models=["mlp"], backends=("eager", "kiln"), batch=2, out=str(tmp_path),
                             budget_s=0.05, plots=False, progress=False)
    results = runner.run(options)
    rows = results["rows"]
    assert [(r["model"], r["compiler"]) for r in rows] == [("mlp", "eager"), ("mlp", "kiln")]
    eager = rows[0]
    assert eager["status"] == "pass", eager
    assert eager["speedup"] == 1.0 and eager["time_ms"] > 0 and eager["batch"] == 2
    assert rows[1]["status"] in ("unavailable", "pass", "fail_accuracy", "error")
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["rows"][0]["status"] == "pass" and not data["meta"]["interrupted"]
    assert "| mlp | eager | pass |" in (tmp_path / "results.md").read_text()


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


def test_bench_code_never_uses_torch_compiler_stack():
    # torch.compile is only the baseline, called from bench/baselines.py outside kiln/
    banned = ("torch.compile", "torch._dynamo", "torch._inductor", "torch.fx", "torch.export", "torch.jit")
    for path in [*(KILN / "bench").glob("*.py"), KILN / "cli.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                dotted = ast.unparse(node)
                assert not dotted.startswith(banned), f"{path.name}: {dotted}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.startswith(banned) for n in names), f"{path.name}: imports {names}"
