"""Bad input through kiln raises what eager raises: the same exception type, a message naming the op and
the shapes. Each case runs eagerly, through `kiln.ops.symbolic_call` (tensor metadata only) and through
`kiln.ops.trace` (example tensors as graph inputs).
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

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
    x, index = T(2, 3), torch.tensor([[0, 7]])
    expected = _eager_error(torch.gather, (x, 1, index), {})
    with pytest.raises(Exception) as info:
        kiln.ops.trace(lambda x, i: torch.gather(x, 1, i), x, index)
    _check(info.value, expected, torch.gather, (x, 1, index), {}, "trace")


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
