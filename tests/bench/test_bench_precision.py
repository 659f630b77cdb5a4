"""`kiln bench --precision`: eager, torch.compile and kiln under the same autocast region or weights dtype,
judged at the dtype's tolerance, with kiln's fallback count per row; the default bench is unchanged."""
import pytest
import torch

from kiln import cli
from kiln.bench import precision, report, worker
from kiln.testing import tolerance

pytestmark = pytest.mark.usefixtures("kiln_cache")


def test_cli_names_every_precision():
    assert cli.PRECISIONS == tuple(precision.PRECISIONS)
    assert cli.build_parser().parse_args(["bench"]).precision == "fp32"
    assert cli.build_parser().parse_args(["bench", "--precision", "bf16"]).precision == "bf16"


def test_tolerance_is_the_dtypes():
    assert precision.get("fp32").tol == tolerance.MODEL_TOL
    assert precision.get("bf16").tol == precision.get("bf16-weights").tol == 1e-2
    assert precision.get("amp").dtype == torch.float16
    with pytest.raises(ValueError, match="unknown precision 'bf8'"):
        precision.get("bf8")


def test_inference_step_runs_under_autocast():
    module = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        out = worker.Step(module, module, ((x,), {}), "inference", precision=precision.get(name))()
        assert out.dtype == dtype
        with torch.autocast("cpu", dtype=dtype, enabled=name != "fp32"):
            torch.testing.assert_close(out, module(x), rtol=0, atol=0)


def test_weights_precision_converts_model_and_float_inputs():
    module, (args, kwargs) = precision.get("bf16-weights").convert(
        torch.nn.Embedding(5, 4), ((torch.tensor([1, 2]),), {"scale": torch.ones(2)}))
    assert module.weight.dtype == torch.bfloat16
    assert args[0].dtype == torch.int64 and kwargs["scale"].dtype == torch.bfloat16


def test_amp_training_step_scales_unscales_and_skips_as_gradscaler():
    """amp's step: the loss scaled, the gradients unscaled before they are copied, a step with an
    overflowing gradient skipped (weights unchanged) and the scale halved, as torch.amp.GradScaler does."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(32, 8) * 1e3   # with GradScaler's first scale (2**16) the fp16 gradients overflow
    step = worker.Step(module, module, ((x,), {}), "training", precision=precision.get("amp"))
    assert step.scaler is not None and step.scaler.get_scale() == 2.0 ** 16
    before = [p.detach().clone() for p in module.parameters()]
    out = step()
    assert not all(torch.isfinite(g).all() for g in out["grads"])
    assert all(torch.equal(p, b) for p, b in zip(module.parameters(), before))   # skipped
    assert step.scaler.get_scale() == 2.0 ** 15
    small = worker.Step(module, module, ((x * 1e-3,), {}), "training", precision=precision.get("amp"))
    reference = [g for g in torch.autograd.grad(worker.scalar_loss(module(x * 1e-3)), module.parameters())]
    out = small()
    assert small.scaler.get_scale() == 2.0 ** 16   # no overflow: unchanged (grows after 2000 steps)
    for got, fp32 in zip(out["grads"], reference):  # unscaled: fp32 gradients within fp16's rounding
        torch.testing.assert_close(got, fp32, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("name, mode", [("bf16", "inference"),
                                        pytest.param("amp", "training", marks=pytest.mark.slow),
                                        pytest.param("bf16-weights", "inference", marks=pytest.mark.slow)])
def test_measure_kiln_at_a_precision(name, mode):
    """A whole measuring run of kiln on the MLP: accurate at the dtype's tolerance, no fallback."""
    import kiln
    kiln.reset()   # (a bench job runs in a fresh process; here the counters of earlier tests are cleared)
    result = worker.run_job({"phase": "measure", "model": "mlp", "backend": "kiln:cpp", "mode": mode,
                             "precision": name, "budget_s": 0.05, "batch": 4})
    assert result["status"] == "pass", result.get("error") or result["accuracy"]
    assert sum(result["counters"].get("fallback", {}).values()) == 0


def test_report_counts_fallbacks_only_off_fp32():
    row = {"model": "m", "compiler": "kiln", "mode": "inference", "status": "pass", "time_ms": 1.0,
           "eager_ms": 2.0, "speedup": 2.0, "fallbacks": 3}
    assert report.columns([row]) == report.COLUMNS
    assert "fallbacks" not in report.table([row])
    half = dict(row, precision="bf16")
    assert report.columns([half])[-1] == "fallbacks"
    assert report.row_cells(half, True)[-1] == "3"
    assert "fallbacks" in report.table([half]) and "| 3 |" in report.markdown({"rows": [half], "meta": {}})
