"""The graph-break census (`kiln explain --models ...`, kiln/bench/census.py) and the Hugging Face zoo."""
import json
import time
import warnings

import pytest
import torch
from torch import nn

from kiln import cli
from kiln.bench import census, runner
from kiln.testing import accuracy
from kiln.testing import models as zoo

ROW_FIELDS = {"model", "status", "graphs", "breaks", "native", "resumed_breaks", "capture_s", "eager_s",
              "explain_s", "groups", "capture_errors", "recompile_limit"}
GROUP_FIELDS = {"reason", "count", "native", "hint", "locations", "transformers", "frames", "source"}


def test_census_rows_of_two_small_zoo_models():
    rows = census.run(["mlp", "resnet_tiny"])
    assert [row["model"] for row in rows] == ["mlp", "resnet_tiny"]
    for row in rows:
        assert row["status"] == "ok", row.get("traceback")
        assert ROW_FIELDS <= set(row), set(row) ^ ROW_FIELDS
        assert (row["graphs"], row["breaks"], row["native"], row["groups"]) == (1, 0, 0, []), row
        assert row["capture_s"] >= 0 and row["eager_s"] > 0 and row["explain_s"] >= row["capture_s"]
    text = census.table(rows)
    assert "mlp" in text and "resnet_tiny" in text and "2/2 models ran; 2 captured whole" in text
    json.dumps(rows)   # rows are plain data


class Printing(nn.Module):
    """A break kiln resumes (print) and a frame it runs natively (a break inside a with block)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        print("census test")
        with torch.no_grad():
            print("inside a with block")
            y = y + 1
        return y.relu()


def _inputs(batch, gen):
    return (torch.randn(batch, 4, generator=gen),), {}


def test_breaks_grouped_by_reason_and_errors_are_rows(monkeypatch, capsys):
    def broken():
        raise RuntimeError("cannot build this one")
    monkeypatch.setitem(zoo.ZOO, "census_printing", zoo.ModelSpec("census_printing", Printing, _inputs, batch=2))
    monkeypatch.setitem(zoo.ZOO, "census_broken", zoo.ModelSpec("census_broken", broken, _inputs, batch=2))
    rows = census.run(["census_broken", "census_printing", "mlp"])
    assert [row["status"] for row in rows] == ["error", "ok", "ok"]
    assert "RuntimeError: cannot build this one" in rows[0]["error"]
    row = rows[1]
    assert row["breaks"] >= 1 and row["breaks"] == sum(group["count"] for group in row["groups"])
    assert row["native"] == row["breaks"] - row["resumed_breaks"]
    for group in row["groups"]:
        assert GROUP_FIELDS <= set(group)
        assert group["hint"], group
        assert any("test_census.py" in location for location in group["locations"]), group
    reasons = census.summary_of_reasons(rows)
    assert {r["reason"] for r in reasons} == {g["reason"] for g in row["groups"]}
    text = census.table(rows)
    assert "census_broken: ERROR: RuntimeError: cannot build this one" in text
    assert "hint:" in text


def test_cli_parses_explain():
    args = cli.build_parser().parse_args(["explain", "--models", "mlp,hf_bert", "--json", "out.json"])
    assert (args.command, args.models, args.json, args.isolate) == ("explain", ["mlp", "hf_bert"], "out.json",
                                                                   False)
    args = cli.build_parser().parse_args(["explain", "--models", "all", "--isolate", "--timeout", "30"])
    assert args.models == ["all"] and args.isolate and args.timeout == 30
    assert cli.build_parser().parse_args(["explain"]).suite == "quick"
    assert census.select(["all"]) == zoo.names()
    assert census.select(None, "quick") == zoo.names("quick")
    with pytest.raises(KeyError):
        census.select(["no_such_model"])
    assert cli.main(["explain", "--models", "no_such_model"]) == 2


def test_bench_and_explain_default_to_the_same_suite(capsys):
    """`kiln bench` and `kiln explain` without --suite or --models run the same models: the quick suite,
    and each one's --help says so."""
    parser = cli.build_parser()
    assert parser.parse_args(["bench"]).suite == parser.parse_args(["explain"]).suite == "quick"
    assert census.select(None) == runner.select_models(runner.Options()) == zoo.names("quick")
    for command in ("bench", "explain"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "quick: a few tiny models (minutes)" in text and "(default: quick)" in text, text
        assert "default: hf" not in text


def test_cli_explain_writes_json(tmp_path, capsys):
    path = tmp_path / "census.json"
    assert cli.main(["explain", "--models", "mlp", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["model", "status", "graphs", "breaks", "native", "capture", "s",
                                           "eager", "ms"]  # (eager ms over values in ms, no unit per cell)
    assert not out.splitlines()[2].rstrip().endswith("ms"), out
    data = json.loads(path.read_text())
    assert [row["model"] for row in data["rows"]] == ["mlp"] and data["reasons"] == []


def test_census_in_a_fresh_process():
    rows = census.run(["mlp"], isolate=True, timeout_s=300)
    assert rows[0]["status"] == "ok" and rows[0]["graphs"] == 1, rows


# ---- the Hugging Face zoo --------------------------------------------------------------------------------
HF_21 = ["hf_gpt2", "hf_bert", "hf_roberta", "hf_distilbert", "hf_albert", "hf_electra", "hf_deberta_v2",
         "hf_t5", "hf_bart", "hf_opt", "hf_gpt_neox", "hf_phi", "hf_llama", "hf_mistral", "hf_qwen2",
         "hf_gemma", "hf_vit", "hf_swin", "hf_convnext", "hf_resnet", "hf_mobilenet_v2"]


def test_hf_suite_is_the_21_architectures_outside_quick():
    hf = [name for name, spec in zoo.ZOO.items() if "hf" in spec.suites]
    assert sorted(hf) == sorted(HF_21)
    assert not set(hf) & set(zoo.names("quick", include_unavailable=True))
    assert all(zoo.ZOO[name].requires == ("transformers",) for name in hf)
    assert {"hf_gpt2", "hf_bert", "hf_llama", "hf_t5", "hf_vit"} <= set(zoo.names("full", True))


@pytest.mark.slow
def test_hf_models_build_fast_at_default_settings():
    """Each builds in < 2 s (transformers imported first), attention at transformers' default, KV cache on."""
    pytest.importorskip("transformers")
    import transformers  # noqa: F401
    zoo.build("hf_bert")   # imports transformers' common modules
    for name in HF_21:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            model, (args, kwargs) = zoo.build(name)
            elapsed = time.perf_counter() - start
            assert elapsed < 2.0, (name, elapsed)
            assert not model.training
            with torch.no_grad():
                out = model(*args, **kwargs)
        assert accuracy.flatten(out)   # outputs, KV caches included, are comparable
        config = model.config
        assert config._attn_implementation in ("sdpa", "eager"), (name, config._attn_implementation)
        if config._attn_implementation == "eager":   # only where sdpa is not supported at all
            assert not type(model)._supports_sdpa, name


def test_accuracy_flattens_kv_caches():
    pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, (args, kwargs) = zoo.build("hf_llama")
        with torch.no_grad():
            out = model(*args, **kwargs)
    paths = [path for path, _ in accuracy.flatten(out)]
    assert paths[0] == "out['last_hidden_state']" and "out['cache'].layers[1].values" in paths
    assert accuracy.check(out, out, accuracy.to_fp64(out), tol=1e-3).passed
