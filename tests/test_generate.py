"""generate() through the compiled model: `kiln.compile(model).generate(...)` runs Hugging Face's generate with
the model's forward compiled (prefill and every decode step), the original model stays eager, and decoding
captures a bounded number of times: the prefill, the first decode step, and one recapture that makes the
cache's length dynamic; a decode step of any later length reuses that capture.

The routing itself (kiln.wrapping.ForwardRoute, RoutedMethod) is tested on a small module first."""
from __future__ import annotations

import inspect
import threading

import pytest
import torch

import kiln
from kiln.counters import counters as kiln_counters

pytestmark = pytest.mark.usefixtures("kiln_cache_raising")


class Scaler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return torch.relu(x @ self.weight) + 1

    def twice(self, x):
        """Calls the model twice, as generate does."""
        return self(self.forward(x))

    def replace_forward(self):
        self.forward = lambda x: x


def _captures() -> int:
    return sum(kiln_counters["captures"].values())


def test_methods_of_the_compiled_module_call_the_compiled_forward(counters):
    model = Scaler()
    compiled = kiln.compile(model)
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model.twice(x)
        assert _captures() == 0  # the original's method is eager
        torch.testing.assert_close(compiled.twice(x), expected)
        assert _captures() == 1 and sum(counters["cache_hits"].values()) == 1  # both calls compiled
        assert "forward" not in vars(model)  # the model is unchanged after the call
        model.twice(x)
        model(x)
    assert _captures() == 1 and sum(counters["cache_hits"].values()) == 1


def test_routed_methods_are_introspectable():
    model = Scaler()
    method = kiln.compile(model).twice
    assert method.__name__ == "twice" and method.__doc__ == Scaler.twice.__doc__
    assert method.__self__ is model and method.__func__ is Scaler.twice
    assert list(inspect.signature(method).parameters) == ["x"]
    assert "compiled by kiln" in repr(method)


def test_the_users_own_forward_and_one_the_method_installs_are_kept(counters):
    model = Scaler()
    compiled = kiln.compile(model)
    compiled.replace_forward()  # the method's own assignment survives the call
    assert vars(model)["forward"](5) == 5
    del model.forward

    def own(x):
        return x * 0
    model.forward = own
    compiled.twice(torch.randn(2, 4))
    assert vars(model)["forward"] is own


def test_nested_and_threaded_routed_calls_restore_the_module(counters):
    model = Scaler()
    compiled = kiln.compile(model)
    x = torch.randn(3, 4)
    expected = model.twice(x)
    results, errors = [], []

    def worker():
        try:
            for _ in range(5):
                results.append(compiled.twice(x))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 15
    for result in results:
        torch.testing.assert_close(result, expected)
    assert "forward" not in vars(model)


def test_hooks_around_the_compiled_forward_leave_the_module_unchanged(counters):
    model = Scaler()
    seen = []
    model.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    compiled = kiln.compile(model)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x))
    torch.testing.assert_close(compiled.twice(x), model.twice(x))
    assert len(seen) == 4 and "forward" not in vars(model)  # self(...) runs the hooks, self.forward not


# ---- Hugging Face decoders ------------------------------------------------------------------------------

_SIZES = dict(vocab_size=1000, max_position_embeddings=128, hidden_size=64, intermediate_size=128,
              num_hidden_layers=2)
CONFIGS = {
    "gpt2": dict(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=2),
    "llama": dict(_SIZES, num_attention_heads=4, num_key_value_heads=2),
    "qwen2": dict(_SIZES, num_attention_heads=4, num_key_value_heads=4),
    "gemma": dict(_SIZES, num_attention_heads=2, num_key_value_heads=2, head_dim=32),
}
NEW_TOKENS = 12


def _decoder(kind: str):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(kind, **CONFIGS[kind])
    return transformers.AutoModelForCausalLM.from_config(config).eval()


class CapturesPerStep:
    """A logits processor (called once per forward of generate) recording kiln's capture count."""

    def __init__(self):
        self.counts: list[int] = []

    def __call__(self, input_ids, scores):
        self.counts.append(_captures())
        return scores


def _generate(model, ids, cache: str, record=None):
    from transformers import LogitsProcessorList
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None,
                  return_dict_in_generate=True)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    if record is not None:
        kwargs["logits_processor"] = LogitsProcessorList([record])
    with torch.no_grad():
        return model.generate(ids, **kwargs)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_greedy_tokens_equal_eagers_and_decoding_captures_boundedly(kind, cache, counters):
    model = _decoder(kind)
    ids = torch.randint(1, 1000, (1, 7))
    eager = _generate(model, ids, cache)
    expected = eager.sequences
    assert _captures() == 0
    compiled = kiln.compile(model)
    record = CapturesPerStep()
    result = _generate(compiled, ids, cache, record)
    assert torch.equal(result.sequences, expected), f"{kind}, {cache} cache: kiln's tokens differ from eager's"
    # the cache the compiled steps wrote (a static cache in place, index_copy_ per layer) holds eager's values
    for mine, theirs in zip(result.cache.layers, eager.cache.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-4, atol=1e-4)
    assert len(record.counts) == NEW_TOKENS
    # prefill, first decode step, and (dynamic cache) the recapture making the cache length symbolic
    bound = 3 if cache == "dynamic" else 2
    assert record.counts[-1] <= bound, f"{kind}, {cache} cache: captures per step {record.counts}"
    assert record.counts[2:] == [record.counts[2]] * (NEW_TOKENS - 2), (
        f"{kind}, {cache} cache: a decode step of a new length captured again: captures per step "
        f"{record.counts}, recompiles {dict(counters['recompiles'])}")
    assert sum(counters["graph_breaks"].values()) == 0
    assert "forward" not in vars(model)
    # the original model's generate stays eager
    captures = _captures()
    torch.testing.assert_close(_generate(model, ids, cache).sequences, expected)
    assert _captures() == captures


def test_explain_reports_the_forward_captures_of_generate(counters):
    compiled = kiln.compile(_decoder("llama"))
    ids = torch.randint(1, 1000, (1, 5))
    report = kiln.explain(compiled.generate, ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert report.graph_count == 3 and report.graph_break_count == 0
    assert all(name.endswith("ForCausalLM.forward") for name in report.capture_names)


def test_generate_does_not_torch_compile_over_kiln(monkeypatch, counters):
    """transformers torch.compiles the decode step of a static cache on GPUs (or when compile_config asks for
    every device); through kiln that would trace kiln's own Python, so the wrapper turns it off."""
    from transformers import CompileConfig
    model = _decoder("llama")
    ids = torch.randint(1, 1000, (1, 5))
    compile_everywhere = CompileConfig()
    compile_everywhere._compile_all_devices = True
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, cache_implementation="static",
                  compile_config=compile_everywhere)
    expected = model.generate(ids, **dict(kwargs, disable_compile=True))

    def refuse(*args, **kwargs):
        raise AssertionError("torch.compile called inside kiln.compile(model).generate")
    monkeypatch.setattr(torch, "compile", refuse)
    assert torch.equal(kiln.compile(model).generate(ids, **kwargs), expected)
    assert _captures() == 2
