"""`kiln explain --models hf-all`: every transformers model type built from a small config (kiln/testing/hf_all.py)
and judged (kiln/bench/hf_census.py). The fast tests build and judge a few types; the whole census is slow."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kiln.bench import census, hf_census  # noqa: E402
from kiln.testing import hf_all  # noqa: E402


def test_small_config_lowers_only_sizes_and_keeps_defaults():
    default = transformers.AutoConfig.for_model("mixtral")
    small = hf_all.config_for("mixtral")
    assert (small.hidden_size, small.num_hidden_layers, small.num_local_experts, small.vocab_size) == (64, 2, 4, 1000)
    # everything that is not a size keeps transformers' default
    for key in ("hidden_act", "rms_norm_eps", "num_experts_per_tok", "use_cache", "tie_word_embeddings"):
        assert getattr(small, key) == getattr(default, key), key
    # token ids stay inside the smaller vocabulary; sub-configs are lowered too
    assert all(t is None or t < 1000 for t in (small.bos_token_id, small.eos_token_id, small.pad_token_id))
    clip = hf_all.config_for("clip")
    assert clip.text_config.hidden_size == 64 and clip.vision_config.num_hidden_layers == 2


def test_inputs_follow_the_models_signature():
    model, (args, kwargs) = hf_all.build("whisper")   # an encoder-decoder on spectrogram features
    assert args == () and sorted(kwargs) == ["decoder_input_ids", "input_features"]
    model, (args, kwargs) = hf_all.build("clip")      # text and images together
    assert sorted(kwargs) == ["input_ids", "pixel_values"]
    assert not model.training and model.kiln_shrink == "small"


def test_a_type_that_cannot_be_built_is_a_row_with_its_reason():
    with pytest.raises(hf_all.Unbuildable, match="no AutoModel class"):
        hf_all.build("align_text_model")    # a sub-config: covered by its parent type
    row = census.census_one("hf:align_text_model")
    assert row["status"] == "unbuildable" and "no AutoModel class" in row["error"]
    assert hf_census.unbuildable_kind(row["error"]) == "sub-configs or head-only types"


def test_census_row_judges_kiln_against_eager_and_counts_dynamo(capsys):
    row = census.census_one("hf:gpt2")
    assert row["status"] == "ok", row.get("error")
    assert (row["graphs"], row["breaks"], row["native"]) == (1, 0, 0)
    assert row["verdict"] == "correct" and row["reference"] == "fp64" and row["compile_s"] > 0
    assert row["dynamo"] == {"graphs": 1, "breaks": 0}
    text = census.table([row])
    assert "verdicts: 1 correct, 0 wrong, 0 crash" in text and "TorchDynamo 1 of 1" in text


def test_a_wrong_result_is_reported_as_wrong(monkeypatch):
    """The verdict is real: a compiled call returning something else is 'wrong' with the rule's reason."""
    import kiln
    real = kiln.compile

    def off_by_a_bit(model, **options):
        compiled = real(model, **options)
        return lambda *a, **k: compiled(*a, **k) + 1e-2
    monkeypatch.setitem(vars(kiln), "compile", off_by_a_bit)  # (see conftest's _lazy_attributes_left_lazy)
    bert, (args, kwargs) = hf_all.build("bert")

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, **kw):
            return self.bert(**kw).last_hidden_state
    out = hf_census.judge(Hidden(), args, kwargs)
    assert out["verdict"] == "wrong", out


def test_select_hf_all_and_unknown_types():
    names = census.select(["hf-all"])
    assert len(names) > 300 and "hf:mixtral" in names and all(n.startswith("hf:") for n in names)
    with pytest.raises(KeyError, match="unknown transformers model type"):
        census.select(["hf:not_a_type"])


@pytest.mark.slow
def test_whole_census_has_no_wrong_result_and_no_crash(tmp_path):
    """Every buildable type (hours on 2 cores): never a wrong result, never a kiln crash."""
    rows = census.run(census.select(["hf-all"]), isolate=True, timeout_s=600.0)
    census.write_json(rows, str(tmp_path / "census.json"))
    bad = [(r["model"], r.get("wrong") or r.get("error")) for r in rows if r.get("verdict") in ("wrong", "crash")]
    assert not bad, json.dumps(bad, indent=1)
