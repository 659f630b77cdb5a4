"""index_select / index_put whose index is an arange the graph computes (kiln/lower/arange_index.py): lowered to
index arithmetic, not run with torch, with eager's values, copies (never aliases) and eager's errors."""
import shutil

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def _fallbacks(counters, op):
    return counters["fallback"][f"prims.{op}"]


ARANGES = {
    "positions": lambda t: torch.arange(t).unsqueeze(0),  # GPT-2's position ids: [1, t]
    "offset": lambda t: torch.arange(3, 3 + t),
    "strided": lambda t: torch.arange(1, 1 + 2 * t, 2),
    "reversed": lambda t: torch.arange(t - 1, -1, -1),
    "int32": lambda t: torch.arange(t, dtype=torch.int32),
    "plus past length": lambda t: (torch.arange(t) + 0).unsqueeze(0),  # Hugging Face GPT-2's cache positions
    "affine": lambda t: 2 * (torch.arange(t) + 1) - 1,
    "minus": lambda t: t + 1 - torch.arange(t),
}


@pytest.mark.parametrize("kind", list(ARANGES))
def test_embedding_of_an_arange_is_lowered(kind, counters):
    make = ARANGES[kind]

    def fn(w, idx):
        pos = make(idx.shape[1])
        return F.embedding(idx, w) + F.embedding(pos, w), w.index_select(1, make(3).reshape(-1)) * 2

    w, idx = torch.randn(20, 8), torch.randint(0, 20, (2, 5))
    c = compiled(fn, w, idx)
    for got, want in zip(c(w, idx), fn(w, idx)):
        assert torch.equal(got, want)
    # the lookup of idx, whose values come at run time, is a load through the index (kiln.lower.indirect)
    assert _fallbacks(counters, "index_select") == 0


def test_select_of_an_arange_is_a_copy_not_an_alias():
    def fn(w):
        rows = w.index_select(0, torch.arange(2))
        rows.add_(1)
        return rows

    w = torch.randn(4, 3)
    before = w.clone()
    got = compiled(fn, w)(w)
    assert torch.equal(got, before[:2] + 1)
    assert torch.equal(w, before)


def test_arange_past_the_dim_raises_as_eager():
    def fn(w):
        return F.embedding(torch.arange(6), w)

    with pytest.raises(IndexError):
        fn(torch.randn(5, 3))
    w = torch.randn(8, 3)
    c = compiled(fn, w)
    assert torch.equal(c(w), fn(w))
    small = torch.randn(5, 3)
    with pytest.raises((IndexError, RuntimeError)):
        kiln.compile(fn)(small)


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("start,length", [(0, 6), (2, 3)])
def test_index_put_at_an_arange(accumulate, start, length, counters):
    def fn(x, v):
        return x.index_put((torch.arange(start, start + length),), v, accumulate=accumulate)

    x, v = torch.randn(6, 4), torch.randn(length, 4)
    c = compiled(fn, x, v)
    assert torch.equal(c(x, v), fn(x, v))
    assert _fallbacks(counters, "index_put") == 0


def test_position_embedding_trains_without_torch_index_ops(counters):
    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(30, 8)
            self.wpe = torch.nn.Embedding(16, 8)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1])
            return torch.tanh(self.wte(idx) + self.wpe(pos))

    model = Embed()
    reference = Embed()
    reference.load_state_dict(model.state_dict())
    idx = torch.randint(0, 30, (2, 10))
    compiled_model = kiln.compile(model)
    compiled_model(idx).pow(2).sum().backward()
    reference(idx).pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert counters["autograd"]["backward graphs compiled"] == 1
    # only the token lookup's gradient (an accumulating index_put) runs with torch
    assert _fallbacks(counters, "index_select") == 0 and _fallbacks(counters, "index_put") == 1, \
        dict(counters["fallback"])
