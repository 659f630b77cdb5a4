"""Dynamic shapes in capture: symbolic sizes, their guards, automatic dynamic, and results equal to eager at
every size (differential: each program runs by plain Python and by kiln over a sequence of shapes)."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.counters import counters
from kiln.graph.symbolic import ShapeEnv, SymInt, python_expr


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert type(a) is type(b) and a == b, (a, b)


def run_sizes(fn, make_args, sizes, backend="eager", **compile_kw):
    """fn at each size, plain and compiled; returns the compiled function's capture count."""
    compiled = kiln.compile(fn, backend=backend, **compile_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recompile-limit warning, no internal error
        for size in sizes:
            torch.manual_seed(size if isinstance(size, int) else sum(size))
            args = make_args(size)
            _same(fn(*args), compiled(*args))
    return sum(counters["captures"].values())


# ---- programs ------------------------------------------------------------------------------------------

def p_norm_view(x, w):
    b, s, h = x.shape
    y = F.layer_norm(x, (h,)) @ w
    return y.softmax(-1).view(b * s, -1).sum(0), s * 2


def p_slices(x):
    s = x.shape[1]
    half = s // 2
    return x[:, :half] * 2 + x[:, s - half:], x[:, -1], x.narrow(1, 1, s - 1).mean()


def p_factories(x):
    s = x.size(0)
    mask = torch.ones(s, s).tril()
    pos = torch.arange(s, dtype=torch.float32)
    return (x @ x.t()) * mask + pos, torch.zeros(2, s).sum()


def p_flatten_cat(x, y):
    z = torch.cat([x, y], dim=0)
    return z.flatten(), z.reshape(-1, 2).shape[0], z.numel()


def p_branch(x):
    if x.shape[0] > 10:
        return x.sum(0)
    return x.mean(0)


def p_causal_attention(x, wq, wk, wv):
    b, s, d = x.shape
    q, k, v = (x @ w for w in (wq, wk, wv))
    q = q.view(b, s, 2, d // 2).transpose(1, 2)
    k = k.view(b, s, 2, d // 2).transpose(1, 2)
    v = v.view(b, s, 2, d // 2).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, s, d)


def p_unbind_split(x):
    a, b = x.chunk(2, dim=-1)
    parts = x.split(1, dim=0)
    return a * b, len(parts), sum(p.sum() for p in parts)


def p_transposed_input(x):
    return (x * 2).sum(-1), x.stride()


def p_python_loop(x):
    total = x.new_zeros(())
    for i in range(x.shape[0]):
        total = total + x[i].sum()
    return total


def p_expand_broadcast(x, y):
    return x.unsqueeze(1).expand(-1, y.shape[0], -1) + y, x.new_full((x.shape[0],), 3.0)


CASES = [
    ("norm_view", p_norm_view, lambda s: (torch.randn(2, s, 16), torch.randn(16, 16)), [8, 12, 20, 33, 5]),
    ("slices", p_slices, lambda s: (torch.randn(3, s),), [6, 9, 14, 21]),
    ("factories", p_factories, lambda s: (torch.randn(s, 4),), [5, 7, 12, 30]),
    ("flatten_cat", p_flatten_cat, lambda s: (torch.randn(s, 4), torch.randn(s, 4)), [3, 6, 11, 17]),
    ("causal_attention", p_causal_attention,
     lambda s: (torch.randn(2, s, 8), torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)), [4, 7, 16, 31]),
    ("unbind_split", p_unbind_split, lambda s: (torch.randn(s, 6),), [3, 5, 9]),
    ("python_loop", p_python_loop, lambda s: (torch.randn(s, 3),), [2, 4, 6]),
    ("expand_broadcast", p_expand_broadcast, lambda s: (torch.randn(s, 4), torch.randn(s + 1, 4)), [3, 5, 8]),
]


@pytest.mark.parametrize("name,fn,make,sizes", CASES, ids=[c[0] for c in CASES])
def test_programs_equal_eager_at_every_size(name, fn, make, sizes):
    captures = run_sizes(fn, make, sizes)
    if name not in ("python_loop", "unbind_split"):  # (a Python loop or list over a size unrolls)
        assert captures <= 2, dict(counters["captures"])


@pytest.mark.parametrize("name,fn,make,sizes", CASES[:5], ids=[c[0] for c in CASES[:5]])
def test_programs_through_cpp(name, fn, make, sizes):
    captures = run_sizes(fn, make, sizes[:3], backend="cpp")
    assert captures <= 2


def test_automatic_dynamic_names_the_dim_and_sizes():
    run_sizes(p_norm_view, lambda s: (torch.randn(2, s, 16), torch.randn(16, 16)), [8, 12, 20])
    reasons = list(counters["recompiles"])
    assert len(reasons) == 1 and "x.size(1) 8 -> 12: now dynamic" in reasons[0], reasons
    assert counters["automatic_dynamic"]["p_norm_view"] == 1
    assert counters["dynamic_graphs"]


def test_branch_on_a_size_is_guarded():
    # sizes on both sides of the branch: the guard `x.size(0) > 10` sends 12 to a new capture
    run_sizes(p_branch, lambda s: (torch.randn(s, 3),), [4, 6, 8, 12, 14, 5])
    assert sum(counters["captures"].values()) == 3


def test_dynamic_true_captures_once_and_false_every_size():
    make = lambda s: (torch.randn(s, 4),)  # noqa: E731
    assert run_sizes(p_factories, make, [5, 7, 12], dynamic=True) == 1
    kiln.reset()
    assert run_sizes(p_factories, make, [5, 7, 12], dynamic=False) == 3


def test_mark_dynamic_and_mark_static():
    f = kiln.compile(p_slices, backend="eager")
    for s in (6, 9, 14):
        x = torch.randn(3, s)
        kiln.mark_dynamic(x, 1)
        _same(p_slices(x), f(x))
    assert sum(counters["captures"].values()) == 1
    kiln.reset()
    f = kiln.compile(p_slices, backend="eager")
    for s in (6, 9, 14):
        x = torch.randn(3, s)
        kiln.mark_static(x, 1)
        _same(p_slices(x), f(x))
    assert sum(counters["captures"].values()) == 3  # never dynamic
    with pytest.raises(IndexError):
        kiln.mark_dynamic(torch.randn(2), 3)


def test_sizes_zero_and_one_are_specialized():
    f = kiln.compile(p_slices, backend="eager", dynamic=True)
    for s in (1, 4, 1, 6):
        x = torch.randn(3, s)
        _same(p_slices(x), f(x))
    assert sum(counters["captures"].values()) == 2  # size 1 has its own graph


def test_equal_sizes_share_a_symbol_and_are_guarded_equal():
    def f(x, y):
        return x + y  # broadcasting needs x.size(0) == y.size(0) (or one of them 1)
    g = kiln.compile(f, backend="eager", dynamic=True)
    for n in (5, 7):
        x, y = torch.randn(n, 2), torch.randn(n, 2)
        _same(f(x, y), g(x, y))
    assert sum(counters["captures"].values()) == 1
    with pytest.raises(RuntimeError, match="must match"):
        g(torch.randn(7, 2), torch.randn(6, 2))  # eager's error, from a new capture that fails like eager


def test_transposed_input_keeps_symbolic_strides():
    f = kiln.compile(p_transposed_input, backend="eager", dynamic=True)
    for s in (4, 6, 9):
        x = torch.randn(3, s).t()
        _same(p_transposed_input(x), f(x))
    assert sum(counters["captures"].values()) == 1


def test_size_survives_a_graph_break():
    def f(x):
        s = x.shape[0]
        y = x * 2
        print("", end="")  # a graph break: s is on the frame's locals when the resume function starts
        return y.reshape(s, -1).sum(-1) + s, s
    g = kiln.compile(f, backend="eager", dynamic=True)
    for s in (3, 5, 8):
        x = torch.randn(s, 2, 2)
        _same(f(x), g(x))


def test_attribute_written_with_a_size_is_the_call_s_size():
    class Box:
        pass
    box = Box()

    def f(x):
        box.n = x.shape[0] * 3
        return x + 1
    g = kiln.compile(f, backend="eager", dynamic=True)
    for s in (3, 5, 8):
        g(torch.randn(s))
        assert box.n == s * 3


def test_text_made_from_a_size_specializes():
    def f(x):
        return x * 2, f"n={x.shape[0]}"
    g = kiln.compile(f, backend="eager", dynamic=True)
    for s in (3, 5, 3):
        x = torch.randn(s)
        _same(f(x), g(x))
    assert sum(counters["captures"].values()) == 2  # the string's value is guarded


def test_module_with_dynamic_sequence():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    compiled = kiln.compile(layer, backend="eager")
    with torch.no_grad():
        for s in (5, 8, 13, 21):
            x = torch.randn(2, s, 16)
            _same(layer(x), compiled(x))
    assert sum(counters["captures"].values()) <= 2


def test_explain_lists_symbols_and_their_guards():
    f = kiln.compile(p_branch, backend="eager", dynamic=True)
    f(torch.randn(6, 3))
    report = kiln.explain(kiln.compile(p_branch, dynamic=True), torch.randn(6, 3))
    text = report.format(guards=True)  # (str counts the guards: the fact `x.size(0) <= 10` is one)
    assert "s0 = x.size(0)" in text and "(x.size(0) <= 10)" in text, text
    assert "dynamic_torch_calls" in text  # the per-size torch runs below capture are named


# ---- the symbolic values themselves --------------------------------------------------------------------

def test_symint_arithmetic_and_facts():
    env = ShapeEnv()
    a = env.size(16, "x.size(0)")
    b = env.size(16, "y.size(1)")
    c = env.size(7, "z.size(0)")
    assert isinstance(a, SymInt) and a.expr is b.expr  # duck sizing
    assert env.size(1, "w.size(0)") == 1  # 1 and 0 stay ints
    assert str((a * 4 + c).expr) == "4*s0 + s1" and str(((a * 4) // 2).expr) == "2*s0"
    assert (a == 1) is False and not env.facts  # decided by s0 >= 2, no guard
    assert a > 10 and c < 8
    assert [python_expr(f, {s: str(s) for s in env.symbols}) for f in env.facts] == ["(s0 > 10)", "(s1 < 8)"]
    assert list(range(c)) == list(range(7))  # specializes
    assert "(s1 == 7)" in env.describe()
    # Python's % and //, exact (sympy's Mod simplifies Mod(3*Mod(3*s, 7), 7) to 3*Mod(3*s, 7): pyfuzz 822)
    n = env.size(4, "n.size(0)")
    for e, want in (((n * 3 % 7) * 3 % 7, 1), ((n + 2) // 3, 2), ((n * 8) % 4, 0), (-n // 3, -2), (-n % 3, 2)):
        assert env.hint(e.expr) == want if isinstance(e, SymInt) else e == want
    env.freeze()
    with pytest.raises(Exception, match="after the capture's guards"):
        bool(a > 12)


@pytest.fixture
def per_size():
    """dynamic_symbolic off: graphs with symbolic sizes compile per size (the tiering below)."""
    from kiln import config
    old = config.get("dynamic_symbolic")
    config.set("dynamic_symbolic", False)
    yield
    config.set("dynamic_symbolic", old)


def test_sizes_are_tiered_torch_first_then_compiled_and_limited(per_size):
    from kiln import config

    def f(x):
        return torch.nn.functional.gelu(x * 2 + 1).sum(-1)
    g = kiln.compile(f, backend="cpp", dynamic=True)
    x5, x7 = torch.randn(3, 5), torch.randn(3, 7)
    for x in (x5, x5, x5, x7):
        _same(f(x), g(x))
    # size 5: the first call ran with torch, the second compiled, the third reused; size 7: torch
    assert sum(counters["dynamic_backend_compiles"].values()) == 1
    assert sum(counters["dynamic_torch_calls"].values()) == 2
    old = config.get("dynamic_size_limit")
    config.set("dynamic_size_limit", 1)
    try:
        with pytest.warns(RuntimeWarning, match="dynamic_size_limit=1"):
            for x in (x7, x7, x7):
                _same(f(x), g(x))  # a second size beyond the limit: torch, every time
    finally:
        config.set("dynamic_size_limit", old)
    assert sum(counters["dynamic_backend_compiles"].values()) == 1
    assert counters["dynamic_torch_calls"][[k for k in counters["dynamic_torch_calls"] if "limit" in k][0]] == 3


def test_symbolic_int_is_an_int_to_the_program():
    # regressions (pyfuzz 144, 463, 52): an int argument made symbolic after it changed
    def f(x, items):
        ints = [e for e in items if isinstance(e, int) and type(e) is int]
        return x + len(ints), repr(items[1:]), items[1].bit_length(), items[1].__class__.__name__
    g = kiln.compile(f, backend="eager")
    for n in (2, 5, 9, 5):
        items = [torch.ones(1), n, 3]
        assert f(torch.ones(2), list(items))[1:] == g(torch.ones(2), list(items))[1:]
        _same(f(torch.ones(2), list(items))[0], g(torch.ones(2), list(items))[0])


@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama"])
def test_hf_decoders_at_eight_lengths(name):
    """transformers' defaults from configs: correct at every length, no capture after the second length."""
    pytest.importorskip("transformers")
    from kiln.testing import models as zoo
    torch.manual_seed(0)
    model = zoo.get(name).factory().eval()
    compiled = kiln.compile(model, backend="eager")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for i, length in enumerate((8, 12, 16, 20, 24, 28, 32, 40)):
            ids = torch.randint(0, 1000, (2, length))
            _same(model(input_ids=ids).last_hidden_state, compiled(input_ids=ids).last_hidden_state)
            if i == 1:
                after_second = sum(counters["captures"].values())
    assert sum(counters["captures"].values()) == after_second <= 2
