"""Bad input through kiln raises what eager raises: the same exception type, a message naming the op and
the shapes. Each op case runs eagerly, through `kiln.ops.symbolic_call` (tensor metadata only) and through
`kiln.ops.trace` (example tensors as graph inputs); each compiled case (COMPILED_CASES, below) runs a
function by plain Python and by `kiln.compile(fn, backend=B)` for every backend, good inputs, then bad ones,
then good ones again.
"""
from __future__ import annotations

import shutil
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.backends
import kiln.ops
from kiln.graph import TensorMeta

f32, i64, b8 = torch.float32, torch.int64, torch.bool


def T(*shape, dtype=f32):
    return torch.randn(*shape).to(dtype)


# (id, op, args, kwargs): eager raises on each of them, whatever the values (shape, dim and dtype errors).
CASES = [
    ("add-broadcast", torch.add, (T(2, 3), T(4, 5)), {}),
    ("mul-broadcast", torch.mul, (T(2, 3, 4), T(3, 3, 4)), {}),
    ("mm-shapes", torch.mm, (T(2, 3), T(4, 5)), {}),
    ("matmul-shapes", torch.matmul, (T(2, 3), T(4, 5)), {}),
    ("bmm-rank", torch.bmm, (T(2, 3), T(2, 3, 4)), {}),
    ("addmm-shapes", torch.addmm, (T(2, 4), T(2, 3), T(4, 4)), {}),
    ("linear-shapes", F.linear, (T(2, 3), T(4, 5)), {}),
    ("cat-sizes", torch.cat, ([T(2, 3), T(2, 4)],), {"dim": 0}),
    ("stack-sizes", torch.stack, ([T(2, 3), T(3, 2)],), {}),
    ("sum-dim", torch.sum, (T(2, 3),), {"dim": 5}),
    ("softmax-dim", torch.softmax, (T(2, 3), 4), {}),
    ("max-dim", torch.max, (T(2, 3), 4), {}),
    ("transpose-dim", torch.transpose, (T(2, 3), 0, 3), {}),
    ("squeeze-dim", torch.squeeze, (T(2, 3), 5), {}),
    ("unsqueeze-dim", torch.unsqueeze, (T(2, 3), 5), {}),
    ("split-dim", torch.split, (T(2, 3), 1, 3), {}),
    ("flatten-dims", torch.flatten, (T(2, 3), 1, 0), {}),
    ("view-numel", torch.Tensor.view, (T(2, 3), 7), {}),
    ("reshape-numel", torch.reshape, (T(2, 3), (7,)), {}),
    ("expand-size", torch.Tensor.expand, (T(2, 3), 5, 3), {}),
    ("permute-duplicate", torch.permute, (T(2, 3), (0, 0)), {}),
    ("narrow-length", torch.narrow, (T(2, 3), 0, 1, 5), {}),
    ("bitwise-float", torch.bitwise_and, (T(2, 3), T(2, 3)), {}),
    ("sub-bool", torch.sub, (T(2, 3, dtype=b8), T(2, 3, dtype=b8)), {}),
    ("where-condition-dtype", torch.where, (T(2, 3), T(2, 3), T(2, 3)), {}),
    ("mean-int", torch.mean, (T(2, 3, dtype=i64),), {}),
    ("gather-rank", torch.gather, (T(2, 3), 0, torch.zeros(2, 3, 4, dtype=i64)), {}),
    ("index_select-index-dtype", torch.index_select, (T(2, 3), 0, T(2)), {}),
    ("embedding-index-dtype", F.embedding, (T(2, 3), T(4, 5)), {}),
    ("conv2d-channels", F.conv2d, (T(1, 3, 5, 5), T(4, 2, 3, 3)), {}),
    ("layer_norm-shape", F.layer_norm, (T(2, 3), (4,)), {}),
    ("cross_entropy-batch", F.cross_entropy, (T(2, 3), torch.zeros(3, dtype=i64)), {}),
]


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _replace(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) in (list, tuple):
        return type(value)(_replace(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _replace(v, fn) for k, v in value.items()}
    return value


def _eager_error(op, args, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            op(*args, **kwargs)
        except Exception as e:
            return e
    raise AssertionError(f"eager accepts {op} on these arguments; the case is wrong")


def _trace_call(op, args, kwargs):
    """Trace op on the arguments, every tensor a graph input (Tensor methods are called as methods)."""
    structure = (args, kwargs)

    def fn(*tensors):
        it = iter(tensors)
        a, k = _replace(structure, lambda _: next(it))
        if type(op).__name__ == "method_descriptor":
            return getattr(a[0], op.__name__)(*a[1:], **k)
        return op(*a, **k)
    return kiln.ops.trace(fn, *_tensors(structure))


def _shape_texts(args, kwargs):
    return [f"[{', '.join(str(s) for s in t.shape)}]" for t in _tensors((args, kwargs))]


def _check(error, expected, op, args, kwargs, how):
    assert type(error) is type(expected), (f"{how}: kiln raised {type(error).__name__}({error}), "
                                           f"eager raises {type(expected).__name__}({expected})")
    message = str(error)
    assert op.__name__ in message, f"{how}: the message does not name {op.__name__}: {message}"
    for shape in _shape_texts(args, kwargs):
        assert shape in message, f"{how}: the message does not name the shape {shape}: {message}"


@pytest.mark.parametrize("op, args, kwargs", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_symbolic_call_raises_eagers_error(op, args, kwargs):
    expected = _eager_error(op, args, kwargs)
    metas = _replace((args, kwargs), TensorMeta.of)
    with pytest.raises(Exception) as info:
        kiln.ops.symbolic_call(op, *metas[0], **metas[1])
    _check(info.value, expected, op, args, kwargs, "symbolic_call")


@pytest.mark.parametrize("op, args, kwargs", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_trace_raises_eagers_error(op, args, kwargs):
    expected = _eager_error(op, args, kwargs)
    with pytest.raises(Exception) as info:
        _trace_call(op, args, kwargs)
    _check(info.value, expected, op, args, kwargs, "trace")


def test_value_dependent_errors_come_from_the_examples():
    """Under check_metas the trace runs gather on its examples and raises eager's error."""
    x, index = T(2, 3), torch.tensor([[0, 7]])
    expected = _eager_error(torch.gather, (x, 1, index), {})
    with kiln.config.patch(check_metas=True), pytest.raises(Exception) as info:
        kiln.ops.trace(lambda x, i: torch.gather(x, 1, i), x, index)
    _check(info.value, expected, torch.gather, (x, 1, index), {}, "trace")


@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_value_dependent_errors_of_a_compiled_call_are_eagers(backend):
    """Capture records gather without looking at the index values; the compiled graph's run raises, and the
    call runs again natively: the error is eager's own."""
    x, index = T(2, 3), torch.tensor([[0, 7]])
    expected = _eager_error(torch.gather, (x, 1, index), {})
    kiln.reset()
    with pytest.raises(type(expected)) as info:
        kiln.compile(lambda x, i: torch.gather(x, 1, i) * 2, backend=backend)(x, index)
    assert str(expected) in str(info.value)


@pytest.mark.parametrize("op, args, kwargs", [
    pytest.param(torch.add, (T(2, 3), "a"), {}, id="add-str"),
    pytest.param(torch.exp, (T(2, 3), 1), {}, id="exp-extra-argument"),
    pytest.param(torch.sum, (T(2, 3),), {"dim": "a"}, id="sum-str-dim"),
    pytest.param(torch.reshape, (T(2, 3), "a"), {}, id="reshape-str-shape"),
])
def test_wrong_argument_types_raise_type_errors(op, args, kwargs):
    # torch's argument parser may reject these before kiln sees the call: only the type and op name count.
    expected = _eager_error(op, args, kwargs)
    for how in ("symbolic_call", "trace"):
        with pytest.raises(Exception) as info:
            if how == "trace":
                _trace_call(op, args, kwargs)
            else:
                kiln.ops.symbolic_call(op, *_replace(args, TensorMeta.of), **kwargs)
        assert type(info.value) is type(expected), (how, info.value, expected)
        assert op.__name__ in str(info.value), (how, str(info.value))


# ---------------------------------------------------------------------------------------------------------
# Compiled functions on bad input: a differential table. Each case is a function, a factory of good inputs
# and a factory of bad inputs (wrong shapes, dtypes, devices — meta tensors stand in for another device —,
# non-tensors, out-of-range indices, in-place and out= targets eager refuses). The function runs by plain
# Python and by kiln.compile(fn, backend=B) on equal inputs: first the good inputs (kiln compiles), then the
# bad ones — kiln must raise eager's exception type, with eager's message or one naming the shapes, from
# the user's line, and leave the inputs and the RNG as eager leaves them (or, where eager accepts the
# input, return eager's result) — then the good inputs again, which must still give eager's result.

BACKENDS = ["eager", "prims", "cpp"]
R = torch.randn


def M(*shape):
    return torch.empty(*shape, device="meta")


def _add(a, b):
    return a + b


def _mul(a, b):
    return a * b


def _matmul(a, b):
    return a @ b


def _linear(x, w, b):
    return F.linear(x, w, b).relu()


def _cat(a, b):
    return torch.cat([a, b * 2], 1)


def _sum1(x):
    return (x * 2).sum(1)


def _transpose(x):
    return x.transpose(0, 1) + 1


def _view(x):
    return x.view(-1) * 2


def _reshape(x):
    return x.reshape(6, 2) - 1


def _softmax(x):
    return x.softmax(-1)


def _where(c, a, b):
    return torch.where(c, a, b) * 2


def _sub(a, b):
    return a - b


def _embedding(w, i):
    return F.embedding(i, w) * 2


def _index_select(x, i):
    return (x * 2).index_select(0, i)


def _getitem_tensor(x, i):
    return (x + 1)[i]


def _getitem_int(x):
    return x[2] * 2


def _gather(x, i):
    return x.gather(1, i) + 1


def _setitem(x, i):
    x[i] = 1.0
    return x * 2


def _index_put(x, i, v):
    x.index_put_((i,), v)
    return x + 1


def _update_then_index(x, i):
    x.add_(1)
    return x[i] * 2


def _rand_then_index(x, i):
    return (x + torch.rand(x.shape))[i]


def _mask(x, m):
    return x[m] * 2


def _out(a, b, c):
    torch.add(a, b, out=c)
    return c * 2


def _add_(a, b):
    a.add_(b)
    return a * 2


def _mul_(a, b):
    return a.mul_(b).sum()


def _copy_(a, b):
    a.copy_(b)
    return a + 1


def _masked_fill_(a, m):
    a.masked_fill_(m, 0.5)
    return a - 1


def _fill_row(a):
    a[1, :2].fill_(3)
    return a + 0


def _zero_view(a):
    a[:].zero_()
    return a + 1


def _relu_(a):
    return torch.relu_(a) * 2


def _clamp(a, low):
    return a.clamp(min=low) + 1


T34 = lambda: (R(3, 4),)  # noqa: E731

# (id, function, good inputs, bad inputs): factories, so each run gets fresh tensors of equal values
COMPILED_CASES = [
    # shapes and dtypes: a guard fails, kiln captures again, a meta rule raises
    ("add-broadcast", _add, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), R(4, 5))),
    ("mul-rank", _mul, lambda: (R(2, 3), R(3)), lambda: (R(2, 3, 4), R(3, 3, 4))),
    ("matmul-shapes", _matmul, lambda: (R(2, 3), R(3, 4)), lambda: (R(2, 3), R(4, 4))),
    ("matmul-dtypes", _matmul, lambda: (R(2, 3), R(3, 4)), lambda: (R(2, 3), R(3, 4).double())),
    ("matmul-int", _matmul, lambda: (R(2, 3), R(3, 4)), lambda: (R(2, 3), torch.ones(3, 4, dtype=i64))),
    ("linear-bias", _linear, lambda: (R(2, 3), R(4, 3), R(4)), lambda: (R(2, 3), R(4, 3), R(5))),
    ("cat-sizes", _cat, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), R(3, 3))),
    ("sum-dim", _sum1, T34, lambda: (R(3),)),
    ("transpose-dim", _transpose, T34, lambda: (R(3),)),
    ("view-strides", _view, T34, lambda: (R(4, 3).t(),)),
    ("reshape-numel", _reshape, T34, lambda: (R(4, 4),)),
    ("softmax-int", _softmax, T34, lambda: (torch.ones(3, 4, dtype=i64),)),
    ("where-condition", _where, lambda: (R(3) > 0, R(3), R(3)), lambda: (R(3), R(3), R(3))),
    ("sub-bool", _sub, lambda: (R(3), R(3)), lambda: (R(3) > 0, R(3) > 0)),
    ("embedding-dtype", _embedding, lambda: (R(5, 3), torch.tensor([0, 4])), lambda: (R(5, 3), R(2))),
    ("getitem-int", _getitem_int, T34, lambda: (R(2, 4),)),
    ("mask-shape", _mask, lambda: (R(3, 4), R(3, 4) > 0), lambda: (R(3, 4), R(2, 4) > 0)),
    # the guards hold, and the output's shape depends on the values: kiln must not keep the first call's
    ("mask-count", _mask, lambda: (R(3, 4), R(3, 4) > 0), lambda: (R(3, 4), R(3, 4) > 1.0)),
    # values: the guards hold, the compiled graph raises when it runs
    ("index_select-range", _index_select, lambda: (R(4, 3), torch.tensor([0, 3])),
     lambda: (R(4, 3), torch.tensor([0, 4]))),
    ("index_select-negative", _index_select, lambda: (R(4, 3), torch.tensor([0, 3])),
     lambda: (R(4, 3), torch.tensor([0, -1]))),
    ("getitem-tensor-range", _getitem_tensor, lambda: (R(4, 3), torch.tensor([1, 3])),
     lambda: (R(4, 3), torch.tensor([1, 4]))),
    ("getitem-tensor-negative", _getitem_tensor, lambda: (R(4, 3), torch.tensor([1, -4])),
     lambda: (R(4, 3), torch.tensor([1, -5]))),
    ("gather-range", _gather, lambda: (R(4, 3), torch.zeros(4, 2, dtype=i64)),
     lambda: (R(4, 3), torch.full((4, 2), 3))),
    ("embedding-range", _embedding, lambda: (R(5, 3), torch.tensor([0, 4])),
     lambda: (R(5, 3), torch.tensor([0, 5]))),
    ("setitem-range", _setitem, lambda: (R(4, 3), torch.tensor([0, 3])),
     lambda: (R(4, 3), torch.tensor([7]))),
    ("index_put-range", _index_put, lambda: (R(4, 3), torch.tensor([0, 3]), R(3)),
     lambda: (R(4, 3), torch.tensor([0, 9]), R(3))),
    # eager has updated x when the index fails: so must kiln (its graphs write inputs back at their end)
    ("update-then-index", _update_then_index, lambda: (R(4), torch.tensor([0, 3])),
     lambda: (R(4), torch.tensor([0, 9]))),
    ("rand-then-index", _rand_then_index, lambda: (R(4), torch.tensor([0, 3])),
     lambda: (R(4), torch.tensor([0, 9]))),
    # devices
    ("add-meta", _add, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), M(2, 3))),
    ("cat-meta", _cat, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), M(2, 3))),
    ("copy_-from-meta", _copy_, lambda: (R(2, 3), R(3)), lambda: (R(2, 3), M(3))),
    ("out-meta", _out, lambda: (R(2, 3), R(2, 3), torch.zeros(2, 3)), lambda: (R(2, 3), R(2, 3), M(2, 3))),
    # non-tensors
    ("none-operand", _mul, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), None)),
    ("str-operand", _mul, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), "ab")),
    ("list-operand", _mul, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), [1.0, 2.0, 3.0])),
    ("list-for-tensor", _softmax, T34, lambda: ([1.0, 2.0],)),
    ("str-bound", _clamp, lambda: (R(2, 3), 0.0), lambda: (R(2, 3), "a")),
    ("missing-argument", _add, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3),)),
    # in-place and out=
    ("out-dtype", _out, lambda: (R(2, 3), R(2, 3), torch.zeros(2, 3)),
     lambda: (R(2, 3), R(2, 3), torch.zeros(2, 3, dtype=i64))),
    ("add_-broadcast", _add_, lambda: (R(2, 3), R(3)), lambda: (R(2, 3), R(4, 3))),
    ("add_-self-smaller", _add_, lambda: (R(2, 3), R(3)), lambda: (R(3), R(2, 3))),
    ("add_-dtype", _add_, lambda: (R(2, 3), R(3)), lambda: (torch.ones(2, 3, dtype=i64), R(3))),
    ("mul_-shape", _mul_, lambda: (R(2, 3), R(3)), lambda: (R(2, 3), R(4))),
    ("copy_-shape", _copy_, lambda: (R(2, 3), R(3)), lambda: (R(2, 3), R(2, 4))),
    ("masked_fill_-mask-dtype", _masked_fill_, lambda: (R(2, 3), R(2, 3) > 0), lambda: (R(2, 3), R(2, 3))),
    ("masked_fill_-broadcast", _masked_fill_, lambda: (R(2, 3), R(2, 3) > 0), lambda: (R(3), R(2, 3) > 0)),
    ("add_-expanded", _add_, lambda: (R(2, 3), R(3)), lambda: (R(1, 3).expand(2, 3), R(3))),
    ("copy_-expanded", _copy_, lambda: (R(2, 3), R(3)), lambda: (R(1, 3).expand(2, 3), R(3))),
    ("relu_-expanded", _relu_, lambda: (R(2, 3),), lambda: (R(3, 1).expand(3, 4),)),
    ("relu_-leaf-requiring-grad", _relu_, lambda: (R(2, 3),), lambda: (R(2, 3).requires_grad_(),)),
    # unusual inputs eager accepts: kiln captures again and gives eager's result
    ("number-for-tensor", _mul, lambda: (R(2, 3), R(2, 3)), lambda: (R(2, 3), 2.5)),
    ("int-for-float", _mul, lambda: (R(2, 3), R(2, 3)),
     lambda: (torch.ones(2, 3, dtype=i64), torch.ones(3, dtype=i64))),
    ("float64-for-float32", _linear, lambda: (R(2, 3), R(4, 3), R(4)),
     lambda: (R(2, 3).double(), R(4, 3).double(), R(4).double())),
    ("all-meta", _add, lambda: (R(2, 3), R(2, 3)), lambda: (M(2, 3), M(2, 3))),
    ("all-meta-matmul", _matmul, lambda: (R(2, 3), R(3, 4)), lambda: (M(2, 3), M(3, 4))),
    ("out-resized", _out, lambda: (R(2, 3), R(2, 3), torch.zeros(2, 3)),
     lambda: (R(2, 3), R(2, 3), torch.zeros(5))),
    ("out-strided", _out, lambda: (R(2, 3), R(2, 3), torch.zeros(2, 3)),
     lambda: (R(2, 3), R(2, 3), torch.zeros(3, 2).t())),
    ("masked_fill_-expanded", _masked_fill_, lambda: (R(2, 3), R(2, 3) > 0),
     lambda: (torch.zeros(1, 3).expand(2, 3), torch.tensor([[True, False, False], [False, False, True]]))),
    # a write through a view of an expanded tensor shows in every row sharing the memory
    ("fill_-view-of-expanded", _fill_row, lambda: (R(3, 4),), lambda: (R(1, 4).expand(3, 4),)),
    ("zero_-view-of-expanded", _zero_view, lambda: (R(5),), lambda: (R(1).expand(5),)),
]


def _make(factory):
    torch.manual_seed(1234)
    return factory()


def _run(fn, args):
    """(result, exception, RNG state afterwards), warnings silenced (eager's own deprecation warnings)."""
    torch.manual_seed(4321)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn(*args), None, torch.get_rng_state()
        except Exception as e:
            return None, e, torch.get_rng_state()


def _same_values(actual, expected, what):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: {type(actual).__name__}, eager gives a tensor"
        layout = (actual.shape, actual.dtype, actual.device)
        assert layout == (expected.shape, expected.dtype, expected.device), \
            f"{what}: {actual.dtype}{list(actual.shape)} on {actual.device}, eager " \
            f"{expected.dtype}{list(expected.shape)} on {expected.device}"
        if expected.device.type != "meta":
            torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{what}: {m}")
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), what
        for i, (a, e) in enumerate(zip(actual, expected)):
            _same_values(a, e, f"{what}[{i}]")
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def _user_lines(error, fn):
    """The lines of `fn`'s source among the frames of the error's traceback (and in its notes)."""
    code = fn.__code__
    lines = {line for _, _, line in code.co_lines() if line is not None}
    found = {f.lineno for f in traceback.extract_tb(error.__traceback__)
             if f.filename == code.co_filename and f.lineno in lines}
    notes = " ".join(getattr(error, "__notes__", []))
    found |= {line for line in lines if f"{code.co_filename}:{line}" in notes + str(error)}
    return found


def _compiled(fn, backend):
    if backend == "cpp" and shutil.which(kiln.config.get("cxx")) is None:
        pytest.skip("no C++ compiler")
    kiln.reset()
    return kiln.compile(fn, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, good, bad", [pytest.param(*c[1:], id=c[0]) for c in COMPILED_CASES])
def test_compiled_bad_input_behaves_as_eager(fn, good, bad, backend, counters):
    compiled = _compiled(fn, backend)
    expected, _, _ = _run(fn, _make(good))
    actual, error, _ = _run(compiled, _make(good))
    assert error is None, f"the good call raises {type(error).__name__}: {error}"
    _same_values(actual, expected, "good call")

    eager_args, kiln_args = _make(bad), _make(bad)
    expected, eager_error, eager_rng = _run(fn, eager_args)
    actual, error, rng = _run(compiled, kiln_args)
    if eager_error is None:
        assert error is None, f"eager accepts the input, kiln raises {type(error).__name__}: {error}"
        _same_values(actual, expected, "unusual call")
    else:
        assert type(error) is type(eager_error), \
            f"kiln raises {type(error).__name__}({error}), eager {type(eager_error).__name__}({eager_error})"
        message = str(error)
        shapes = [f"[{', '.join(map(str, t.shape))}]" for t in _tensors(kiln_args)]
        assert message == str(eager_error) or all(s in message for s in shapes), \
            f"the message is neither eager's ({eager_error}) nor names the shapes {shapes}: {message}"
        assert _user_lines(error, fn) >= _user_lines(eager_error, fn), \
            f"the error does not point at the user's line {sorted(_user_lines(eager_error, fn))}"
    _same_values(kiln_args, eager_args, "inputs after the call")
    assert torch.equal(rng, eager_rng), "the call left the RNG elsewhere than eager does"
    assert not counters["capture_errors"] and not counters["graph_errors"], \
        (dict(counters["capture_errors"]), dict(counters["graph_errors"]))

    expected, _, _ = _run(fn, _make(good))
    actual, error, _ = _run(compiled, _make(good))
    assert error is None, f"the good call after the bad one raises {type(error).__name__}: {error}"
    _same_values(actual, expected, "good call after the bad one")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_past_the_recompile_limit(backend, counters):
    compiled = _compiled(_add, backend)
    with kiln.config.patch(recompile_limit=3), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(compiled(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
        for n in range(3, 9):  # each shape a new capture, then the limit: eagerly
            with pytest.raises(RuntimeError, match=f"must match the size of tensor b \\({n}\\)"):
                compiled(torch.ones(2), torch.ones(n))
        assert counters["recompile_limit"]
        assert torch.equal(compiled(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
        assert torch.equal(compiled(torch.ones(3), torch.ones(3)), torch.full((3,), 2.0))


def _raising(graph):
    def call(*inputs):
        raise RuntimeError("a planted backend failure")
    return call


def test_a_graph_failing_where_eager_does_not_runs_eagerly_once_warned(counters, monkeypatch):
    monkeypatch.setattr(kiln.backends, "torch_callable", _raising)  # a bug planted in the eager backend
    fn = kiln.compile(_update_then_index, backend="eager")
    x = torch.zeros(4)
    with pytest.warns(RuntimeWarning, match="raised RuntimeError: a planted backend failure, where eager"):
        out = fn(x, torch.tensor([1, 2]))
    assert torch.equal(out, torch.full((2,), 2.0)) and torch.equal(x, torch.ones(4))
    assert counters["graph_errors"]
    strict = kiln.compile(_update_then_index, backend="eager", options={"raise_on_error": True})
    with pytest.raises(RuntimeError, match="a planted backend failure"):
        strict(torch.zeros(4), torch.tensor([1, 2]))


def test_a_users_backend_raising_is_the_users_error():
    def backend(graph, example_inputs):
        return _raising(graph)
    fn = kiln.compile(_update_then_index, backend=backend)
    with pytest.raises(RuntimeError, match="a planted backend failure") as info:
        fn(torch.zeros(4), torch.tensor([1, 2]))
    note = " ".join(info.value.__notes__)
    assert "compiled graph of _update_then_index" in note and f"{__file__}:" in note, note
