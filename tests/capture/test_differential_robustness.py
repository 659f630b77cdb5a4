"""Differential programs from issue 38's robustness items: objects used as conditions (Python's truth rule:
__bool__, then __len__, else True; a module used as a condition aborted capture), kiln's own decompositions
raising inside compiled code (torch.div on numbers, torch.as_tensor of 0-d tensors, requires_grad_ on a
traced tensor), and parameter-free modules created inside compiled code."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from capture_helpers import all_entries
from diff_helpers import params, run_program

import kiln

X = torch.randn(3, 4)


# ---- truth of objects: a module as a condition (`if self.layer_norm:`), user classes' __bool__/__len__
class WithNorm(torch.nn.Module):
    def __init__(self, norm: bool):
        super().__init__()
        self.norm = torch.nn.LayerNorm(4) if norm else None
        self.layers = torch.nn.ModuleList([torch.nn.Identity()] if norm else [])

    def forward(self, x):
        if self.norm:
            x = self.norm(x)
        if not self.layers:
            x = x * 2
        return x + 1


class Falsy:
    def __bool__(self):
        return False


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


class BadBool:
    def __bool__(self):
        return 1


class NoBool:
    __bool__ = None


def s_module_condition(x):
    return WithNorm(True).forward(x), WithNorm(False).forward(x)


def s_object_truth(x, falsy, empty, full):
    y = x if falsy else x * 2
    y = y + 1 if empty else y - 1
    y = y * 3 if full else y
    return y, not falsy, bool(full), (empty or 5), (full and 7)


def s_plain_object_is_true(x):
    return x + 1 if object() else x - 1


def s_bool_returning_int_raises(x):
    return x + 1 if BadBool() else x


def s_bool_none_raises(x):
    return x + 1 if NoBool() else x


# ---- torch.div and friends of Python numbers (eager returns a 0-d tensor), as_tensor of traced tensors
def s_div_numbers(x, n):
    return (x * torch.div(n, 2, rounding_mode="trunc"), torch.div(-7, 2, rounding_mode="trunc"),
            torch.div(-7, 2, rounding_mode="floor"), torch.div(7, 2),
            torch.div(7.5, 2, rounding_mode="floor"), torch.true_divide(7, 2), torch.floor_divide(-7, 2),
            torch.divide(True, True))


def s_arithmetic_numbers(x):
    return (torch.add(1, 2), torch.add(1.5, 2, alpha=3), torch.sub(3, 1), torch.mul(True, 2),
            torch.mul(1j, 2), torch.multiply(2, 3), x + torch.add(x.shape[0], 1))


def s_div_numbers_by_zero(x):
    return x + torch.div(7, 0, rounding_mode="trunc")


def s_rsub_numbers_raises(x):
    return x + torch.rsub(1, 2)


def s_as_tensor_of_tensors(x):
    s = x.sum()
    same = torch.as_tensor(x)
    return (torch.as_tensor(s) + 1, same is x, torch.as_tensor(x, dtype=torch.float64),
            torch.as_tensor([x[0, 0], x[1, 1]]), torch.as_tensor([[s], [s * 2]], dtype=torch.float64),
            torch.tensor([x[0, 1], s]))


def s_as_tensor_mixed_falls_back(x):
    return torch.as_tensor([x[0, 0].int(), x[1, 1]]), torch.as_tensor([x[0, 0], 1.5]), torch.tensor(x[0])


# ---- modules created inside compiled code: parameter-free ones from constants are made and traced
ACTIVATIONS = {"silu": torch.nn.SiLU, "gelu": (torch.nn.GELU, {"approximate": "tanh"})}


def make_activation(name):  # transformers' ClassInstantier: ACT2FN[name] makes a new module on every read
    cls, kwargs = ACTIVATIONS[name] if isinstance(ACTIVATIONS[name], tuple) else (ACTIVATIONS[name], {})
    return cls(**kwargs)


def s_parameter_free_modules(x):
    y = torch.nn.Softmax(dim=-1)(x)
    y = torch.nn.ConstantPad1d((1, 2), 0.5)(y)
    y = torch.nn.MaxPool1d(kernel_size=2, stride=2)(y.unsqueeze(0)).squeeze(0)
    return make_activation("silu")(y) + make_activation("gelu")(y), torch.nn.Dropout(0.0)(y)


def s_module_made_in_loop_and_try(x):
    for _ in range(2):
        try:
            x = torch.nn.SiLU()(x) + 1
        except RuntimeError:
            x = x - 1
    return x


def s_module_with_parameters_breaks(x):
    return torch.nn.Linear(4, 3)(x).shape, x + 1


class OwnInit(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def s_module_with_user_init_breaks(x):
    return OwnInit(3)(x) + 1


def s_module_made_here_returned(x):
    act = torch.nn.ReLU()
    return act(x), act


def s_module_from_tensor_argument_breaks(x):
    return torch.nn.Softmax(dim=int(x.shape[0]) - 4)(x)


TABLE = [
    (s_parameter_free_modules, (X,), {"graphs": 1}), (s_module_made_in_loop_and_try, (X,), {"graphs": 1}),
    (s_module_with_parameters_breaks, (X,)), (s_module_with_user_init_breaks, (X,)),
    (s_module_made_here_returned, (X,)), (s_module_from_tensor_argument_breaks, (X,)),
    (s_div_numbers, (X, 5), {"graphs": 1}), (s_arithmetic_numbers, (X,), {"graphs": 1}),
    (s_div_numbers_by_zero, (X,)), (s_rsub_numbers_raises, (X,)),
    (s_as_tensor_of_tensors, (X,), {"graphs": 1}), (s_as_tensor_mixed_falls_back, (X,)),
    (s_module_condition, (X,)), (s_object_truth, (X, Falsy(), Sized(0), Sized(2))),
    (s_plain_object_is_true, (X,)), (s_bool_returning_int_raises, (X,)), (s_bool_none_raises, (X,)),
]

KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_robustness(fn, args, options):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*internal error.*")
        run_program(fn, args, **options)


def test_module_condition_is_one_graph(counters):
    """A module used as a condition is true (it has no __len__): the forward is one graph, no error."""
    kiln.reset()
    model = WithNorm(True).eval()
    compiled = kiln.compile(model, backend="eager")
    torch.testing.assert_close(compiled(X), model(X))
    graphs = [e for e in all_entries(compiled._compiled_forward) if e.graph is not None and e.ops]
    assert len(graphs) == 1 and not counters["graph_breaks"], dict(counters["graph_breaks"])
    assert not counters["capture_errors"], dict(counters["capture_errors"])


class Planted:
    """A value whose truth the test makes kiln's interpreter fail on (a planted internal error)."""


def f_planted_error(x):
    y = x + 1
    if Planted():
        y = y * 2
    return y


def test_explain_reports_capture_errors(monkeypatch):
    """An internal error that stops a capture is in kiln.explain's report (the frame, the exception, the
    user's line), not a silent "0 graph breaks"."""
    from kiln.capture.interpreter import Interpreter
    truth = Interpreter.truth

    def failing_truth(self, value):
        if isinstance(value, Planted):
            raise RuntimeError("planted failure")
        return truth(self, value)

    monkeypatch.setattr(Interpreter, "truth", failing_truth)
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = kiln.explain(f_planted_error, X)
    text = str(report)
    assert report.graph_count == 0 and len(report.capture_errors) == 1, text
    error = report.capture_errors[0]
    assert error.frame == "f_planted_error" and error.error == "RuntimeError: planted failure", error
    assert error.lineno == f_planted_error.__code__.co_firstlineno + 2, error
    assert "1 capture error(s)" in text and "if Planted():" in text and "planted failure" in text, text
    assert "1 capture error(s)" in repr(report), repr(report)


@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_numbers_and_as_tensor_in_one_graph(backend, counters):
    """torch.div of Python ints (Longformer: `torch.div(n, w, rounding_mode="trunc")`) and as_tensor of
    traced 0-d tensors (TAPAS) are graph nodes: one graph, no break, no capture error, values as eager's."""
    def f(x, n):
        chunks = torch.div(n, 2, rounding_mode="trunc")
        scale = torch.as_tensor(x.amax()) + torch.as_tensor([x[0, 0], x[2, 3]]).sum()
        return x * chunks + scale + torch.div(x.shape[1], 3, rounding_mode="floor")

    kiln.reset()
    compiled = kiln.compile(f, backend=backend)
    for n in (5, 5):
        torch.testing.assert_close(compiled(X, n), f(X, n))
    graphs = [e for e in all_entries(compiled) if e.graph is not None and e.ops]
    assert len(graphs) == 1 and not counters["graph_breaks"], dict(counters["graph_breaks"])
    assert not counters["capture_errors"] and not counters["decomposition_error"], dict(counters)


@pytest.mark.parametrize("fn,reason", [
    (s_module_with_parameters_breaks, "creating module Linear with parameters or buffers"),
    (s_module_with_user_init_breaks, "creating module OwnInit inside compiled code (its __init__"),
    (s_module_made_here_returned, "a module ReLU made inside compiled code outlives the call"),
])
def test_module_construction_breaks_with_reason(fn, reason, capsys):
    kiln.reset()
    report = kiln.explain(fn, X)
    capsys.readouterr()
    reasons = [b.reason for b in report.breaks]
    assert any(reason in r for r in reasons), reasons
    assert not report.capture_errors, report.capture_errors


def test_parameter_free_modules_cpp(counters):
    """Modules made inside forward compile with the cpp backend in one graph, equal to eager."""
    kiln.reset()
    compiled = kiln.compile(s_parameter_free_modules, backend="cpp")
    for _ in range(2):
        torch.testing.assert_close(compiled(X), s_parameter_free_modules(X))
    graphs = [e for e in all_entries(compiled) if e.graph is not None and e.ops]
    assert len(graphs) == 1 and not counters["graph_breaks"], dict(counters["graph_breaks"])


def test_higher_order_op_breaks_with_reason(capsys):
    """A torch higher-order op kiln has no stand-in for (scan; associative_scan has one, see
    tests/capture/test_polyfills.py) is a break naming it, not an error from running it on kiln's proxies;
    the result is eager's."""
    scan = pytest.importorskip("torch._higher_order_ops.scan").scan

    def f(x):
        return scan(lambda c, v: (c + v, c * 2), x[0] * 0, x * 2)[1] + 1

    kiln.reset()
    report = kiln.explain(f, X)
    capsys.readouterr()
    assert [b.reason for b in report.breaks][:1] == [
        "call to torch._higher_order_ops.scan.scan, a torch higher-order op kiln does not trace"], report.breaks
    torch.testing.assert_close(kiln.compile(f, backend="eager")(X), f(X))


# ---- the transformers model types these fixes were for (small configs at transformers' defaults)
_TEXT = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=128, max_position_embeddings=128)
MODEL_TYPES = {   # type: (config sizes, image side or None for input_ids (2, 32))
    "esm": (dict(_TEXT, pad_token_id=1), None),
    "prophetnet": (dict(vocab_size=1000, hidden_size=64, encoder_ffn_dim=128, decoder_ffn_dim=128,
                        num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=2,
                        num_decoder_attention_heads=2, max_position_embeddings=128), None),
    "mobilevit": (dict(image_size=64, hidden_sizes=[32, 48, 64],
                       neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 80]), 64),
    "mobilevitv2": (dict(image_size=64, width_multiplier=0.5), 64),
    "cvt": (dict(embed_dim=[16, 32, 64], num_heads=[1, 2, 2], depth=[1, 2, 3]), 64),
    "tapas": (_TEXT, None),
    "mamba2": (dict(vocab_size=1000, hidden_size=64, state_size=8, num_hidden_layers=2, num_heads=8,
                    head_dim=16, n_groups=1), None),
    "lilt": (dict(_TEXT, hidden_size=96, channel_shrink_ratio=4), None),
    "canine": (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                    downsampling_rate=4, max_position_embeddings=256), None),
    # mixture-of-experts and state-space types (0 graphs, or 4 graphs / 10 breaks, before this wave)
    **{moe: (dict(_TEXT, num_key_value_heads=2), None) for moe in (
        "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "granitemoe", "deepseek_v3", "falcon_h1")},
    "deepseek_v2": (dict(_TEXT, num_key_value_heads=2, num_experts_per_tok=2, n_routed_experts=4,
                         qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=16,
                         moe_intermediate_size=32, head_dim=16), None),
    "jamba": (dict(_TEXT, num_key_value_heads=2, attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1,
                   expert_layer_period=2), None),
    "bamba": (dict(_TEXT, num_key_value_heads=2, attn_layer_indices=[1]), None),
    "recurrent_gemma": (dict(_TEXT, num_key_value_heads=2, num_hidden_layers=3), None),
    "mamba": (dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, state_size=8), None),
    "falcon_mamba": (dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, state_size=8), None),
}
FAST_TYPES = ("mixtral", "recurrent_gemma")  # run on every CI run; the rest under -m slow


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=() if t in FAST_TYPES else pytest.mark.slow)
                                        for t in sorted(MODEL_TYPES)])
def test_transformers_model_in_one_graph(model_type, capsys):
    """Each was 0 graphs (a capture error or a break in a try) or many breaks on main before these fixes;
    now one graph, no break, no capture error, and the compiled result passes the accuracy rule."""
    transformers = pytest.importorskip("transformers")
    from kiln.testing.accuracy import check
    sizes, image = MODEL_TYPES[model_type]
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(model_type, **sizes)).eval()
    g = torch.Generator().manual_seed(0)
    if image:
        kwargs = {"pixel_values": torch.randn(2, 3, image, image, generator=g)}
    else:
        kwargs = {"input_ids": torch.randint(3, 1000, (2, 32), generator=g)}
        if model_type == "prophetnet":
            kwargs["decoder_input_ids"] = torch.randint(3, 1000, (2, 16), generator=g)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(**kwargs)
        reference = model
        if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
            # (torch's grouped_mm has no float64 kernel: the fp64 reference runs the experts one by one)
            reference = transformers.AutoModel.from_config(copy.deepcopy(model.config), experts_implementation="eager")
            reference.load_state_dict(model.state_dict())
            reference.eval()
        expected64 = reference.double()(**{k: v.double() if v.is_floating_point() else v
                                           for k, v in kwargs.items()})
        model.float()
        kiln.reset()
        report = kiln.explain(model, **kwargs)
        kiln.reset()
        verdict = check(kiln.compile(model, backend="eager")(**kwargs), expected, expected64)
    capsys.readouterr()
    assert (report.graph_count, report.graph_break_count, report.capture_errors) == (1, 0, []), \
        (report.breaks, report.capture_errors)
    assert verdict.passed, verdict.reason
