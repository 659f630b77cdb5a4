"""Every kind of guard still recaptures when the fact it states stops holding, with the guards compiled into
one expression whose repeated source reads are shared (kiln.capture.guards.check_expr); and that shared-read
rewrite is checked on its own against the plain `and` of the guards."""
from __future__ import annotations

import copy
import os
import random

import pytest
import torch

import kiln
from kiln.capture.guards import Guard, check_expr
from kiln.testing.models import build

FLAG = "on"
LIMIT = 3
MODES = frozenset({"fast"})


def entries(compiled):
    return getattr(compiled, "_compiled_forward", compiled).cache.entries


def recompiled_because(text):
    return any(text in reason for reason in kiln.counters["recompiles"])


# ---- each guard kind -------------------------------------------------------------------------------------

@pytest.mark.parametrize("change", ["shape", "dtype", "stride", "requires_grad", "device", "type"])
def test_tensor_guard_parts_recapture(change):
    kiln.reset()
    f = kiln.compile(lambda x: x * 2, backend="eager")
    x = torch.randn(4, 6)
    f(x)
    f(x)
    other = {
        "shape": torch.randn(5, 6),
        "dtype": x.double(),
        "stride": torch.randn(6, 4).t(),
        "requires_grad": x.clone().requires_grad_(),
        "device": torch.empty(4, 6, device="meta"),
        "type": torch.nn.Parameter(x.clone(), requires_grad=False),
    }[change]
    out = f(other)
    assert len(entries(f)) == 2
    assert type(out) is type(other * 2) and out.shape == other.shape and out.dtype == other.dtype
    assert out.device == other.device and out.stride() == (other * 2).stride()
    assert out.requires_grad == other.requires_grad
    if other.device.type != "meta":
        torch.testing.assert_close(out, other * 2)
    f(x)  # the first entry still hits
    assert len(entries(f)) == 2


def test_constant_guards_recapture():
    def f(x, n, s, flag, scale):
        y = x * n if flag else x
        return y + scale if s == "add" else y - scale
    kiln.reset()
    cf = kiln.compile(f, backend="eager", dynamic=False)  # (ints stay constants: no automatic dynamic)
    x = torch.randn(3)
    calls = [(2, "add", True, 0.5), (2, "add", True, 0.5), (3, "add", True, 0.5), (3, "sub", True, 0.5),
             (3, "sub", False, 0.5), (3, "sub", False, 1.5), (3, "sub", False, 1)]
    for args in calls:
        torch.testing.assert_close(cf(x, *args), f(x, *args))
    assert len(entries(cf)) == 6  # every change but the repeated first call; 1.5 -> 1 (float -> int) too


def test_none_and_bool_constants_recapture():
    def f(x, bias=None):
        return x if bias is None else x + bias
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x)
    torch.testing.assert_close(cf(x, 2.0), x + 2.0)
    assert len(entries(cf)) == 2


def test_global_identity_guard_recaptures():
    def double(t):
        return t * 2

    def triple(t):
        return t * 3
    g = {"helper": double}
    exec("def f(x):\n    return helper(x) + 1\n", g)
    kiln.reset()
    cf = kiln.compile(g["f"], backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x * 2 + 1)
    g["helper"] = triple
    torch.testing.assert_close(cf(x), x * 3 + 1)
    assert len(entries(cf)) == 2
    assert recompiled_because("helper")


def test_global_constant_and_builtin_shadow_recapture():
    g = {"LIMIT": 3}
    exec("def f(x):\n    return x.clamp(max=LIMIT) + len(x.shape)\n", g)
    kiln.reset()
    cf = kiln.compile(g["f"], backend="eager")
    x = torch.arange(6.0)
    torch.testing.assert_close(cf(x), x.clamp(max=3) + 1)
    g["LIMIT"] = 4
    torch.testing.assert_close(cf(x), x.clamp(max=4) + 1)
    g["len"] = lambda s: 10  # a global now shadows the builtin the capture used
    torch.testing.assert_close(cf(x), x.clamp(max=4) + 10)
    assert len(entries(cf)) == 3
    assert recompiled_because("'len' is not defined")


def test_builtin_replaced_recaptures():
    import builtins
    g = {"__builtins__": dict(vars(builtins))}  # (the frame's own builtins: kiln's are left alone)
    exec("def f(x):\n    return x + len(x.shape)\n", g)
    kiln.reset()
    cf = kiln.compile(g["f"], backend="eager")
    x = torch.zeros(2)
    torch.testing.assert_close(cf(x), x + 1)
    g["__builtins__"]["len"] = lambda s: 10
    torch.testing.assert_close(cf(x), x + 10)
    assert len(entries(cf)) == 2
    assert recompiled_because("builtins.len is")


def test_set_constant_guard_recaptures():
    g = {"MODES": {"fast"}}
    exec("def f(x):\n    return x * 2 if 'fast' in MODES else x\n", g)
    kiln.reset()
    cf = kiln.compile(g["f"], backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x * 2)
    g["MODES"].discard("fast")
    torch.testing.assert_close(cf(x), x)
    assert len(entries(cf)) == 2


class Box:
    def __init__(self, scale):
        self.scale = scale


class OtherBox(Box):
    pass


def test_type_guard_recaptures():
    def f(x, box):
        return x * 2 if type(box) is Box else x * 3
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, Box(1)), x * 2)
    torch.testing.assert_close(cf(x, OtherBox(1)), x * 3)
    assert len(entries(cf)) == 2


def test_object_attribute_and_absence_guards_recapture():
    def f(x, box):
        return x * box.scale + getattr(box, "shift", 0.0)
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    box = Box(2.0)
    torch.testing.assert_close(cf(x, box), x * 2.0)
    torch.testing.assert_close(cf(x, box), x * 2.0)
    box.scale = 4.0
    torch.testing.assert_close(cf(x, box), x * 4.0)
    box.shift = 1.0  # the guard on the attribute's absence fails
    torch.testing.assert_close(cf(x, box), x * 4.0 + 1.0)
    assert len(entries(cf)) == 3


def test_length_and_keys_guards_recapture():
    def f(xs, opts):
        out = sum(xs)
        for k in opts:
            out = out * opts[k]
        return out
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    a = torch.ones(2)
    torch.testing.assert_close(cf((a, a), {"p": 2.0}), a * 4)
    torch.testing.assert_close(cf((a, a, a), {"p": 2.0}), a * 6)  # length
    torch.testing.assert_close(cf((a, a), {"q": 2.0}), a * 4)  # keys
    torch.testing.assert_close(cf((a, a), {"p": 2.0, "q": 3.0}), a * 12)  # keys (and their count)
    assert len(entries(cf)) == 4


def test_input_alias_guard_recaptures():
    def f(a, b):
        return a * b
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(cf(x, x), x * x)
    torch.testing.assert_close(cf(x, y), x * y)  # b is no longer a
    assert len(entries(cf)) == 2


def test_grad_mode_and_default_dtype_guards_recapture():
    kiln.reset()
    f = kiln.compile(lambda x: x + torch.ones(3), backend="eager")
    x = torch.randn(3, dtype=torch.float64)
    assert f(x).dtype == torch.float64
    with torch.no_grad():
        f(x)
    assert len(entries(f)) == 2
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            torch.testing.assert_close(f(x), x + torch.ones(3))
    finally:
        torch.set_default_dtype(old)
    assert len(entries(f)) == 3
    assert recompiled_because("get_default_dtype")


def test_environment_guard_recaptures(monkeypatch):
    def f(x):
        return x * 2 if os.environ.get("KILN_TEST_GUARD_KIND") == "double" else x
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    monkeypatch.setenv("KILN_TEST_GUARD_KIND", "double")
    torch.testing.assert_close(cf(x), x * 2)
    monkeypatch.setenv("KILN_TEST_GUARD_KIND", "single")
    torch.testing.assert_close(cf(x), x)
    assert len(entries(cf)) == 2


def test_symbolic_size_guards_recapture():
    kiln.reset()
    f = kiln.compile(lambda x, n: x.sum(0) * n, backend="eager", dynamic=True)
    for rows in (4, 5, 7):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(f(x, 3), x.sum(0) * 3)
    assert len(entries(f)) == 1
    x = torch.randn(1, 3)  # a symbolic size is guarded >= 2
    torch.testing.assert_close(f(x, 3), x.sum(0) * 3)
    assert len(entries(f)) == 2


# ---- module trees: guards that share their reads -----------------------------------------------------------

def _nanogpt():
    torch.manual_seed(0)
    model, (args, kwargs) = build("nanogpt_tiny")
    return model, args, kwargs


def _check(cm, model, args, kwargs, n_entries):
    with torch.no_grad():
        torch.testing.assert_close(cm(*args, **kwargs), model(*args, **kwargs))
    assert len(entries(cm)) == n_entries


MUTATIONS = {
    # what changes, deep in the module tree, read through locals shared with other guards
    "submodule replaced": lambda m: setattr(m.blocks[0].mlp, "2", torch.nn.Linear(128, 32)),
    "block replaced": lambda m: m.blocks.__setitem__(0, copy.deepcopy(m.blocks[0])),
    "parameter replaced": lambda m: setattr(m.blocks[0].attn.qkv, "weight",
                                            torch.nn.Parameter(torch.randn(96, 32))),
    "tied weight untied": lambda m: setattr(m.lm_head, "weight", torch.nn.Parameter(m.wte.weight.clone())),
    "buffer replaced": lambda m: m.blocks[0].attn.register_buffer(
        "causal", torch.ones_like(m.blocks[0].attn.causal)),
    "constant attribute": lambda m: setattr(m.ln_f, "eps", 0.5),
    "nested constant": lambda m: setattr(m.blocks[0].mlp[1], "approximate", "none"),
    "requires_grad": lambda m: m.blocks[0].ln2.bias.requires_grad_(False),
    "forward hook": lambda m: m.blocks[0].attn.proj.register_forward_hook(lambda mod, i, o: o * 0.5),
    "forward pre-hook": lambda m: m.blocks[0].ln1.register_forward_pre_hook(lambda mod, i: (i[0] * 2,)),
    "module list grows": lambda m: m.blocks.append(copy.deepcopy(m.blocks[0])),
}


@pytest.mark.parametrize("what", list(MUTATIONS))
def test_module_tree_change_recaptures(what):
    kiln.reset()
    model, args, kwargs = _nanogpt()
    cm = kiln.compile(model, backend="eager")
    _check(cm, model, args, kwargs, 1)
    _check(cm, model, args, kwargs, 1)
    MUTATIONS[what](model)
    _check(cm, model, args, kwargs, 2)
    _check(cm, model, args, kwargs, 2)


def test_module_tree_in_place_value_change_keeps_entry():
    kiln.reset()
    model, args, kwargs = _nanogpt()
    cm = kiln.compile(model, backend="eager")
    _check(cm, model, args, kwargs, 1)
    with torch.no_grad():
        model.blocks[0].mlp[0].weight.mul_(2)  # same parameter object: its new values are used
    _check(cm, model, args, kwargs, 1)


def test_entry_parameters_named_like_guard_locals():
    """The guards' locals never take a name the entry function uses (here: the user's parameters)."""
    g = {}
    # (plain dicts: a module's facts are guarded in bulk, with no shared reads; a dict's are read by chains)
    exec("def f(__kg0, __kg1, __kg2):\n"
         "    return __kg0.lin(__kg1) * __kg0.scale + __kg2['lin'].bias.sum() * __kg2['cfg']['scale'] * "
         "__kg2['cfg']['shift']\n", g)
    kiln.reset()
    a = torch.nn.Module()
    a.lin = torch.nn.Linear(3, 3)
    a.scale = 2.0
    b = {"lin": torch.nn.Linear(3, 3), "cfg": {"scale": 3.0, "shift": 1.0}}
    cf = kiln.compile(g["f"], backend="eager")
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(cf(a, x, b), g["f"](a, x, b))
        torch.testing.assert_close(cf(a, x, b), g["f"](a, x, b))
        assert len(entries(cf)) == 1
        b["cfg"]["scale"] = 4.0
        torch.testing.assert_close(cf(a, x, b), g["f"](a, x, b))
        assert len(entries(cf)) == 2
    entry_source = entries(cf)[0].source.split("__checks")[0]
    assert "__kg3 :=" in entry_source and not any(f"__kg{i} :=" in entry_source for i in range(3))


# ---- the shared-read rewrite on its own ------------------------------------------------------------------

def _guards(*exprs):
    return [Guard(e, e, "test") for e in exprs]


def test_shared_reads_are_named_once():
    expr = check_expr(_guards("a.b.c is X", "a.b.d == 1", "a.b.c.e is None"))
    assert expr == "((__kg1 := (__kg0 := a.b).c) is X) and (__kg0.d == 1) and (__kg1.e is None)"


@pytest.mark.parametrize("exprs, expected", [
    # the second operand of `or` may not run: not named there
    (("x.p or y.q", "x.p is A", "y.q is B"),
     "((__kg0 := x.p) or y.q) and (__kg0 is A) and ((__kg1 := y.q) is B)"),
    # a chained comparison's later operands may not run
    (("a < b.c < d.e", "d.e == 1", "b.c == 2"),
     "(a < (__kg0 := b.c) < d.e) and ((__kg1 := d.e) == 1) and (__kg0 == 2)"),
    # a conditional expression's branches may not run
    (("(a.b if c.d else e.f) == 1", "a.b == 2", "c.d == 3"),
     "((a.b if (__kg0 := c.d) else e.f) == 1) and ((__kg1 := a.b) == 2) and (__kg0 == 3)"),
    # a comprehension's names are its own: nothing inside it is named or replaced
    (("all(v.w for v in s.t)", "v.w is 1", "s.t is T"),
     "(all(v.w for v in s.t)) and (v.w is 1) and (s.t is T)"),
    # text inside a string is not a read
    (("'a.b' == s", "a.b is 1", "a.b is 2"), "('a.b' == s) and ((__kg0 := a.b) is 1) and (__kg0 is 2)"),
    # items by value and type: d[1] and d[True] are not assumed one read
    (("d[1].x is 1", "d[True].x is 2", "d[1].x is 3"),
     "((__kg1 := (__kg0 := d[1]).x) is 1) and (d[True].x is 2) and (__kg1 is 3)"),
    # keyword arguments are not taken to run (conservative), but may use names bound before
    (("a.b == 2", "f(k=a.b) == 1"), "((__kg0 := a.b) == 2) and (f(k=__kg0) == 1)"),
    # a read used twice in one guard only: not named (the order inside one guard is not relied on)
    (("a.b is a.b",), "(a.b is a.b)"),
    # non-ASCII text keeps its positions
    (("x['é'].y is 1", "x['é'].y.z is 2"), "((__kg1 := (__kg0 := x['é']).y) is 1) and (__kg1.z is 2)"),
])
def test_shared_reads_only_where_they_run(exprs, expected):
    assert check_expr(_guards(*exprs)) == expected


def test_shared_reads_avoid_reserved_names():
    assert check_expr(_guards("a.b is 1", "a.b is 2"), {"__kg0"}) == "((__kg1 := a.b) is 1) and (__kg1 is 2)"


class Node:
    """An object whose attribute reads are counted, and whose attributes may raise."""

    reads = 0

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def __getattribute__(self, name):
        if not name.startswith("__"):
            Node.reads += 1
        value = object.__getattribute__(self, name)
        if isinstance(value, Exception):
            raise value
        return value


def _evaluate(expr, env):
    try:
        return bool(eval(expr, dict(env)))
    except Exception:
        return False  # (the entry function's `except Exception: return __MISS`)


# guards that mostly hold in the worlds below (so that long lists of them are evaluated to their end), with
# the same reads in places that always run and in places that may not
GUARD_POOL = [
    "type(r.a) is Node", "r.a.b == 1", "r.a.c is K", "r.a.c.d == 'x'", "not r.a.e", "r.f == 0 or r.a.b == 1",
    "r.f == 0 or r.a.g == 1", "r.a.c.d if r.f else r.a.b", "r.a.b if r.f else r.a.c.d", "0 < r.a.b < r.a.n",
    "r.a.n > 0 > r.a.b", "not (r.a.b > 1 > r.a.n)", "r.a.n == 5", "r.k['x'] is K", "r.k['x'].d == 'x'",
    "'x' in r.k", "len(r.a.items) == 2",
    "r.a.items[1].d == 'x'", "r.a.items[1.0] is not None", "all(v.d == 'x' for v in r.a.items[1:])",
    "v.d == 'z'", "hasattr(r.a, 'g') or r.f == 0", "f(key=r.a.b) == 1", "r.a.c.d == r.k['x'].d",
]


def _usual(rng, value, *others):
    return value if rng.random() < 0.85 or not others else rng.choice(others)


def _world(rng):
    k = Node(d="x")
    leaf = Node(d=_usual(rng, "x", "y", AttributeError("no d")))
    a = Node(b=_usual(rng, 1, 2, ValueError("boom")), c=_usual(rng, k, leaf), e=_usual(rng, 0, 1),
             n=_usual(rng, 5, 1, -1), items=_usual(rng, [1, leaf], [2], [1, Node(d="y")]))
    if rng.random() < 0.5:
        a.g = _usual(rng, 1, 2)
    r = Node(a=_usual(rng, a, 5), f=rng.choice([0, 2.0]), k=_usual(rng, {"x": k}, {"x": leaf}, {}))
    return {"r": r, "K": k, "Node": Node, "v": Node(d="z"), "f": lambda key: key}


@pytest.mark.parametrize("seed", range(200))
def test_shared_reads_agree_with_the_plain_guards(seed):
    """Random guard lists over random object graphs (attributes missing, raising, aliased): the rewritten
    expression holds exactly when the plain `and` of the guards holds, and reads no more attributes."""
    rng = random.Random(seed)
    exprs = [rng.choice(GUARD_POOL) for _ in range(rng.randint(2, 8))]
    exprs = list(dict.fromkeys(exprs))  # (a guard set holds each guard once)
    plain = " and ".join(f"({e})" for e in exprs)
    shared = check_expr(_guards(*exprs))
    for _ in range(40):
        env = _world(rng)
        Node.reads = 0
        want = _evaluate(plain, env)
        plain_reads = Node.reads
        Node.reads = 0
        assert _evaluate(shared, env) == want, (shared, plain)
        assert Node.reads <= plain_reads


def test_dunder_reads_are_shared_and_keyword_attributes_still_guard():
    """A guard on an item of `cfg.__dict__` spells the read `cfg.__dict__`, so the shared-read rewrite reads
    it once per call (spelled `getattr(cfg, '__dict__')` it was read again by every such guard: 64 times a
    call of an HF model, each through transformers' Python `__getattribute__`). An attribute named by a
    keyword (`class`) is still spelled with getattr, and both still recapture when their value changes."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig()
    setattr(cfg, "class", 5.0)

    def f(x, cfg):
        return x * cfg.hidden_size + cfg.layer_norm_eps - cfg.num_attention_heads * getattr(cfg, "class")
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, cfg), f(x, cfg))
    source = entries(cf)[0].source
    check = source[source.index("if not"):source.index("\n", source.index("if not"))]
    assert "getattr(cfg, '__dict__')" not in check
    assert check.count("cfg.__dict__") == 1, check
    cfg.hidden_size = 64
    torch.testing.assert_close(cf(x, cfg), f(x, cfg))
    setattr(cfg, "class", 7.0)
    torch.testing.assert_close(cf(x, cfg), f(x, cfg))
    assert len(entries(cf)) == 3
    assert sum(kiln.counters["recompiles"].values()) == 2


def test_inputs_updated_in_place_are_guarded_apart_by_one_check():
    """A graph writing k of its n inputs in place relies on none of them sharing memory with another input:
    one guard reads each input's storage once (it was k x n pairwise checks a call: ~1400 for a small ResNet
    training its BatchNorms, 0.6 ms of every call). Sharing memory still misses and recaptures, and every
    result equals eager's."""
    def f(a, b, c, d):
        a.add_(1)
        b.mul_(2)
        c.sub_(d)
        return a + b + c + d
    kiln.reset()
    cf = kiln.compile(f, backend="eager")
    make = lambda: [torch.arange(6.0) + i for i in range(4)]  # noqa: E731
    got, want = make(), make()
    torch.testing.assert_close(cf(*got), f(*want))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    (entry,) = entries(cf)
    alias = [text for text in entry.guards if "share memory" in text]
    assert alias == ["a, b, c (updated in place) share memory with no other input"], entry.guards
    for share in ([0, 1], [2, 3], [3, 0]):  # an updated input shares memory with another
        got, want = make(), make()
        for tensors in (got, want):
            tensors[share[1]] = tensors[share[0]][:]  # a view: the same storage
        torch.testing.assert_close(cf(*got), f(*want))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    got, want = make(), make()
    torch.testing.assert_close(cf(*got), f(*want))  # apart again: the first entry still serves
    hits = len(entries(cf))
    cf(*make())
    assert len(entries(cf)) == hits


# ---- the facts of many modules, guarded in bulk (kiln.capture.guards: quiet_module, module_tensor,
# module_constant) ------------------------------------------------------------------------------------------

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))))


def _net():
    torch.manual_seed(0)
    return _Net().eval()


def _changes():
    """(what, change(model)) pairs: each makes the captured graph wrong unless the guards catch it."""
    def new_weight(m):
        m.conv.weight = torch.nn.Parameter(torch.randn_like(m.conv.weight))

    def new_buffer(m):
        m.bn.running_mean = torch.randn(4)

    def hook(m):
        m.bn.register_forward_hook(lambda mod, args, out: out * 3)

    def pre_hook(m):
        m.head[1].register_forward_pre_hook(lambda mod, args: (args[0] + 1,))

    def own_forward(m):
        m.head[1].forward = lambda x: x.sum(-1, keepdim=True).expand(-1, 5)

    def stride(m):
        m.conv.stride = (2, 2)
        m.head[1] = torch.nn.Linear(4 * 3 * 3, 5)

    def eps(m):
        m.bn.eps = 0.5

    def train(m):
        m.bn.train()

    def requires_grad(m):
        m.head[1].bias.requires_grad_(False)

    return [("a new parameter", new_weight), ("a new buffer", new_buffer), ("a forward hook", hook),
            ("a forward pre-hook", pre_hook), ("an instance forward", own_forward), ("a changed stride", stride),
            ("a changed eps", eps), ("training mode", train), ("requires_grad", requires_grad)]


@pytest.mark.parametrize("change", _changes(), ids=[c[0] for c in _changes()])
def test_bulk_module_guards_catch_each_change(change):
    """A compiled model's parameters, buffers, plain attributes, hooks and forward are guarded in bulk:
    each change after the capture gives eager's result (a recapture, or the module run natively)."""
    _, apply = change
    kiln.reset()
    model = _net()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
        assert len(entries(compiled)) == 1
        apply(model)
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
    assert len(entries(compiled)) >= 2 or kiln.counters["graph_breaks"]


def test_bulk_module_guards_name_the_fact_that_changed_and_list_every_fact():
    kiln.reset()
    model = _net()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        compiled(x)
        model.bn.eps = 0.25
        torch.testing.assert_close(compiled(x), model(x))
    # (a small model's facts are guards of their own, a large one's bulk: either names the attribute)
    assert recompiled_because("['bn'].eps"), dict(kiln.counters["recompiles"])
    listed = kiln.explain(_net(), x).guards[0]
    for fact in ("['conv'].stride == (1, 1)", "['bn'].eps == 1e-05", "has no hooks",
                 "['weight'].requires_grad is True"):
        assert any(fact in line for line in listed), (fact, listed)


def test_bulk_module_guards_are_few_checks():
    """A deep model's module facts are a few checks, not one per fact (DenseNet: 2692 guards, 0.6 ms a
    call, before); a bulk check stands for BULK_MIN facts or more."""
    kiln.reset()
    model = torch.nn.Sequential(*[m for _ in range(40) for m in (torch.nn.Linear(8, 8), torch.nn.ReLU())]).eval()
    compiled = kiln.compile(model, backend="eager")
    with torch.no_grad():
        compiled(torch.randn(2, 8))
    entry = entries(compiled)[0]
    facts = sum(len(g.items()) if hasattr(g, "items") else 1 for g in entry.guards)
    # (what is left one per module: its identity in the module tree)
    assert 3 * len(entry.checks) < facts, (len(entry.checks), facts)


def test_bulk_module_guard_misses_name_the_fact():
    """Over BULK_MIN facts a miss still names the module and the fact that changed."""
    kiln.reset()
    model = torch.nn.Sequential(*[torch.nn.LayerNorm(8) for _ in range(40)]).eval()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 8)
    with torch.no_grad():
        compiled(x)
        model[7].eps = 0.5
        torch.testing.assert_close(compiled(x), model(x))
    assert recompiled_because("attributes read are unchanged (self._modules['7'].eps changed)"), \
        dict(kiln.counters["recompiles"])
