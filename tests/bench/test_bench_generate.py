"""kiln bench --generate on tiny decoders: rows per (cache, compiler), tokens equal eager's, kiln's captures
stop after the second prompt length, the floor from the weights' bytes, the table and the JSON, the CLI."""
import json

import pytest
import torch

from kiln import cli
from kiln.bench import generate

pytestmark = pytest.mark.usefixtures("kiln_cache_raising")


def _options(tmp_path, models, **kwargs):
    return generate.Options(models=models, compilers=("eager", "kiln"), new_tokens=5, prompt=4, repeat=2,
                            out=str(tmp_path), **kwargs)


@pytest.mark.parametrize("cache", ["dynamic", pytest.param("static", marks=pytest.mark.slow)])
def test_hf_decoder_rows(tmp_path, counters, cache):
    pytest.importorskip("transformers")
    results = generate.run(_options(tmp_path, ("llama_hf_tiny",), caches=(cache,)))
    rows = results["rows"]
    assert [(r["cache"], r["compiler"]) for r in rows] == [(cache, "eager"), (cache, "kiln")]
    for row in rows:
        assert row["status"] == "pass", row
        assert len(row["decode_ms"]) == 2 and row["decode_median_ms"] > 0 and row["prefill_median_ms"] > 0
        assert row["tokens_per_s"] == pytest.approx(1e3 / row["decode_median_ms"])
        assert row["floor_ratio"] == pytest.approx(row["decode_median_ms"] / row["floor_ms"])
    for row in rows[1::2]:
        assert row["tokens_equal"] is True
        first, second, timed = row["captures"]
        assert 0 < first <= second and timed == second, row["captures"]   # nothing captured after length 2
    assert rows[0]["speedup"] == 1.0
    data = json.loads((tmp_path / "generate.json").read_text())
    assert len(data["rows"]) == 2 and data["meta"]["threads"] == 1
    text = generate.table(rows, results["meta"])
    assert f"llama_hf_tiny  {cache}" in text and "floor" in text and "DIFFER" not in text


def test_zoo_decoder_greedy_loop_without_cache(tmp_path, counters):
    results = generate.run(_options(tmp_path, ("nanogpt",), caches=("dynamic",)))
    rows = results["rows"]
    assert [(r["cache"], r["compiler"]) for r in rows] == [("none", "eager"), ("none", "kiln")]
    assert all(r["status"] == "pass" for r in rows) and rows[1]["tokens_equal"] is True
    assert rows[1]["captures"][2] == rows[1]["captures"][1]


def test_generated_tokens_are_the_greedy_continuation():
    spec = generate.MODELS["nanogpt"]
    model = spec.build()
    ids = torch.randint(1, spec.vocab, (1, 4))
    tokens, prefill, decode = generate.generate(spec, model, ids, 3, "none")
    assert tokens.shape == (1, 7) and torch.equal(tokens[:, :4], ids) and prefill > 0 and decode > 0
    with torch.no_grad():
        for t in range(4, 7):
            assert tokens[0, t] == model(tokens[:, :t])[0, -1].argmax()


def test_weight_bytes_count_tied_weights_once():
    model = generate.MODELS["nanogpt"].build()   # lm_head.weight is wte.weight
    assert model.lm_head.weight is model.wte.weight
    distinct = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    assert generate.weight_bytes(model) == sum(distinct.values()) + buffers


def test_cli_rejects_an_unknown_model(capsys):
    assert cli.main(["bench", "--generate", "--models", "no_such_model", "--out", ""]) == 2
    assert "no_such_model" in capsys.readouterr().err
