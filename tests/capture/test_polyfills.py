"""torch functions kiln runs as Python stand-ins (kiln/capture/polyfills.py), against eager torch.

associative_scan: transformers' Mamba, Falcon-Mamba and Jamba call it under a compiler (4 graphs and 10
breaks before). In "generic" mode torch applies combine_fn under vmap over the scan dimension; the stand-in
calls it one element at a time, so combine_fns that do not broadcast over a leading dimension (a matrix
product, indexing the element's rows) give eager's result too."""
from __future__ import annotations

import collections

import pytest
import torch
from capture_helpers import check

import kiln
from torch._higher_order_ops.associative_scan import associative_scan

Pair = collections.namedtuple("Pair", "a b")


def ssm_combine(left, right):  # Mamba's
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def scan_ssm(a, b):
    _, states = associative_scan(ssm_combine, (a, b), dim=2, combine_mode="generic")
    return states.sum(-1)


def scan_cumsum_reverse(x):
    return associative_scan(lambda l, r: l + r, x, dim=-1, reverse=True, combine_mode="generic")


def scan_matmul(m):  # the elements are 3x3 matrices: a product, not a broadcast
    return associative_scan(lambda l, r: l @ r, m, dim=0, combine_mode="generic")


def scan_element_rows(x):  # indexes the element's own rows (vmap hides the scan dim): a sum and a max
    return associative_scan(lambda l, r: torch.stack([l[0] + r[0], torch.maximum(l[1], r[1])]), x, dim=1,
                            combine_mode="generic")


def scan_dict_and_namedtuple(x, y):
    out = associative_scan(lambda l, r: {"s": l["s"] + r["s"], "m": torch.maximum(l["m"], r["m"])},
                           {"s": x, "m": y}, dim=0, combine_mode="generic")
    pair = associative_scan(lambda l, r: Pair(l.a * r.a, l.b + r.b), Pair(x, y), dim=1, combine_mode="generic")
    return out["s"] - out["m"], pair.a + pair.b


def scan_length_one(x):
    return associative_scan(lambda l, r: l * r, x, dim=1, combine_mode="generic")


A = torch.rand(2, 4, 9, 3)
B = torch.randn(2, 4, 9, 3)
X = torch.randn(3, 6)
M = torch.randn(5, 3, 3) * 0.5


@pytest.mark.parametrize("fn,args", [
    (scan_ssm, (A, B)), (scan_cumsum_reverse, (X,)), (scan_matmul, (M,)),
    (scan_element_rows, (torch.randn(2, 5, 4),)), (scan_dict_and_namedtuple, (X, X.flip(0))),
    (scan_length_one, (torch.randn(3, 1, 2),)),
], ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("backend", ["eager", "cpp"])
def test_associative_scan_equals_eager_in_one_graph(fn, args, backend):
    check(fn, *args, graphs=1, breaks=0, backend=backend)


@pytest.mark.parametrize("call", [
    lambda x: associative_scan(lambda l, r: l + r, x, dim=0),                      # pointwise needs CUDA
    lambda x: associative_scan(lambda l, r: l + r, x, dim=0, combine_mode="fast"),
    lambda x: associative_scan(lambda l, r: l + r, x, dim=0.5, combine_mode="generic"),
    lambda x: associative_scan(lambda l, r: l + r, x, dim=0, reverse=1, combine_mode="generic"),
    lambda x: associative_scan(lambda l, r: l + r, (), dim=0, combine_mode="generic"),
    lambda x: associative_scan(lambda l, r: l + r, x[:0], dim=0, combine_mode="generic"),
    lambda x: associative_scan(lambda l, r: l + r, x, dim=5, combine_mode="generic"),
    lambda x: associative_scan(3, x, dim=0, combine_mode="generic"),
])
def test_associative_scan_raises_as_eager(call):
    with pytest.raises(Exception) as expected:
        call(X)
    kiln.reset()
    with pytest.raises(type(expected.value)) as got:
        kiln.compile(call, backend="eager")(X)
    assert str(got.value) == str(expected.value)


def test_mamba_scan_in_one_graph():
    """transformers' Mamba at defaults (small sizes): one graph, no break, eager's result."""
    transformers = pytest.importorskip("transformers")
    import warnings
    from kiln.testing.accuracy import check as accuracy
    config = transformers.AutoConfig.for_model("mamba", vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                                state_size=8)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    ids = torch.randint(3, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(input_ids=ids).last_hidden_state
        expected64 = model.double()(input_ids=ids).last_hidden_state
        model.float()
        kiln.reset()
        report = kiln.explain(model, input_ids=ids)
        kiln.reset()
        got = kiln.compile(model)(input_ids=ids).last_hidden_state
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.breaks
    verdict = accuracy(got, expected, expected64)
    assert verdict.passed, verdict.reason
