"""`kiln bench --mode training`: per model, the step time against eager and torch.compile, peak RSS, the bytes
autograd saves for the backward (measured with its saved-tensor hook, the same way for every compiler) and
kiln's partitioner plan, compile time cold and warm."""
import math
import shutil

import pytest
import torch

from kiln import config
from kiln.bench import report, runner, worker
from kiln.testing import models as zoo


def test_saved_activations_counts_what_eager_autograd_keeps():
    # y = x @ w1 (saves x: an input, left out), h = relu(y) (saves h), z = h @ w2 (saves h again), sum
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 64, bias=False), torch.nn.ReLU(),
                                 torch.nn.Linear(64, 4, bias=False))
    x = torch.randn(16, 8)
    step = worker.Step(module, module, ((x,), {}), "training")
    saved = worker.saved_activations(step)
    # relu's output, saved by relu and by the second mm (one storage): 16 x 64 floats
    assert saved["saved_storages"] == 1 and saved["saved_tensors"] >= 3
    assert math.isclose(saved["saved_mb"], 16 * 64 * 4 / 2**20)
    assert all(p.grad is not None for p in module.parameters())   # it ran a whole step


def test_timed_training_steps_copy_no_gradients():
    """The accuracy calls get copies of the gradients taken before the SGD step; a timed step (checking
    off) copies nothing, like a training loop, and still updates the parameters."""
    torch.manual_seed(0)
    module = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    checked = worker.Step(module, module, ((x,), {}), "training")
    before = module.weight.detach().clone()
    out = checked()
    grad_w, _ = out["grads"]
    assert grad_w is not module.weight.grad and torch.equal(grad_w, module.weight.grad)
    torch.testing.assert_close(module.weight.detach(), before - worker.SGD_LR * grad_w)
    timed = worker.Step(module, module, ((x,), {}), "training", checking=False)
    before = module.weight.detach().clone()
    assert timed()["grads"] is None
    assert not torch.equal(module.weight.detach(), before)


def test_training_table_sets_each_compiler_against_eager_and_torch_compile():
    base = {"mode": "training", "batch": 2, "status": "pass"}
    rows = [dict(base, model="a", compiler="eager", time_ms=4.0, speedup=1.0, rss_peak_mb=200.0, saved_mb=2.0),
            dict(base, model="a", compiler="torch.compile", time_ms=2.0, speedup=2.0, rss_peak_mb=300.0,
                 saved_mb=1.0, compile_cold_s=40.0, compile_warm_s=10.0),
            dict(base, model="a", compiler="kiln", time_ms=1.0, speedup=4.0, rss_peak_mb=190.0, saved_mb=0.5,
                 compile_cold_s=4.0, compile_warm_s=0.5),
            dict(base, model="b", compiler="kiln", status="error", error="boom")]
    cells = {(line[0], line[1]): dict(zip(report.TRAINING_COLUMNS, line)) for line in report.training_cells(rows)}
    assert set(cells) == {("a", "eager"), ("a", "torch.compile"), ("a", "kiln")}
    kiln = cells[("a", "kiln")]
    assert (kiln["vs eager"], kiln["vs torch.compile"], kiln["RSS/eager"], kiln["saved/eager"]) == \
        ("4.00x", "2.00x", "0.95x", "0.25x")
    assert cells[("a", "eager")]["cold s"] == "-" and cells[("a", "torch.compile")]["vs torch.compile"] == "1.00x"
    summary = report.training_summary(rows)
    assert summary[1] == ("kiln training: geomean 4.00x vs eager over 1 models, 2.00x vs torch.compile over 1; "
                          "cold compile 0.10 of torch.compile's (median); peak RSS <= eager for 1/1; "
                          "saved bytes <= eager for 1/1")
    assert "saved/eager" in report.table(rows) and "## Training" in report.markdown({"meta": {}, "rows": rows})
    assert report.training_table([dict(r, mode="inference") for r in rows]) == ""


@pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")
def test_training_run_measures_every_column(tmp_path):
    options = runner.Options(models=["mlp"], backends=("eager", "kiln"), mode="training", batch=4,
                             out=str(tmp_path), budget_s=0.1, threads=1, plots=False, progress=False)
    rows = {row["compiler"]: row for row in runner.run(options)["rows"]}
    eager, kiln = rows["eager"], rows["kiln"]
    assert eager["status"] == kiln["status"] == "pass", (eager, kiln)
    for row in (eager, kiln):
        assert row["time_ms"] > 0 and row["speedup"] > 0
        assert row["rss_peak_mb"] >= row["rss_base_mb"] > 0   # the memory run comes with training mode
        assert row["saved_mb"] > 0 and row["saved_storages"] <= row["saved_tensors"]
    # eager saves at least one (batch, hidden) activation per Linear+GELU+LayerNorm layer
    model, _ = zoo.build("mlp", batch=4)
    hidden = [m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert eager["saved_mb"] * 2**20 >= 4 * 4 * sum(hidden[:-1])
    # kiln's measured bytes are its partitioner's plan: one graph, what its forward returns for the backward
    assert kiln["planned_saved_mb"] > 0
    assert math.isclose(kiln["saved_mb"], kiln["planned_saved_mb"], rel_tol=0.05), kiln
    assert kiln["compile_cold_s"] > 0 and 0 <= kiln["compile_warm_s"] < kiln["compile_cold_s"]
    training = report.training_table(list(rows.values()))
    assert training in report.table(list(rows.values()))
    header, _, *lines = training.splitlines()
    assert header.split("  ")[0] == "model" and all(column in header for column in report.TRAINING_COLUMNS)
    line = next(line.split() for line in lines if line.startswith("mlp") and " kiln " in line)
    assert line[2] == f"{kiln['time_ms']:.2f}" and line[7] == f"{kiln['saved_mb']:.2f}"
    assert line[4] == "-"   # no torch.compile row in this run
