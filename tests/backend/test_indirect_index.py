"""Loads through an index tensor (kiln/lower/indirect.py): embedding lookups, index_select, gather and advanced
indexing computed by kiln's kernels, not torch calls, with eager's values, dtypes and strides, and eager's errors
for an index outside its dim (the kernel reports it, the wrapper runs the graph with torch)."""
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

INDEX_OPS = ("index_select", "gather", "index")


def compiled(fn, *inputs):
    return compile_graph(kiln.ops.trace(fn, *inputs), list(inputs))


def _torch_index_calls(counters):
    return {op: counters["fallback"][f"prims.{op}"] for op in INDEX_OPS if counters["fallback"][f"prims.{op}"]}


def _same(got, want, exact=True):
    """Eager's dtype, shape, strides and values: bit-equal, or (a normalization's sums) float-close."""
    got, want = (got,) if isinstance(got, torch.Tensor) else got, (want,) if isinstance(want, torch.Tensor) else want
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.stride() == w.stride(), (g.stride(), w.stride())
        if exact:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w)


def _ids(high, shape, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


PROGRAMS = {
    "embedding": (lambda w, i: F.embedding(i, w) * 2 + 1, lambda: (torch.randn(50, 16), _ids(50, (3, 7)))),
    "embedding int32 ids": (lambda w, i: F.embedding(i, w), lambda: (torch.randn(50, 16), _ids(50, (5,)).int())),
    "embedding then layer_norm": (lambda w, i: F.layer_norm(F.embedding(i, w) + 1, (16,)),
                                  lambda: (torch.randn(40, 16), _ids(40, (2, 9)))),
    "select dim 1": (lambda x, i: x.index_select(1, i) * 2 - 1, lambda: (torch.randn(3, 10, 4), _ids(10, (6,)))),
    "select last dim": (lambda x, i: x.index_select(-1, i), lambda: (torch.randn(3, 4, 10), _ids(10, (12,)))),
    "select of a transpose": (lambda x, i: x.t().index_select(0, i) - 1, lambda: (torch.randn(8, 11), _ids(11, (4,)))),
    "select of a computed value": (lambda x, i: (x * 2 + x.abs()).index_select(0, i),
                                   lambda: (torch.randn(9, 5), _ids(9, (7,)))),
    "select by a 0-d index": (lambda x, i: x.index_select(0, i), lambda: (torch.randn(9, 5), torch.tensor(4))),
    "select with repeats": (lambda x, i: x.index_select(0, i), lambda: (torch.randn(4, 5), torch.tensor([3, 3, 0, 3]))),
    "gather dim 0": (lambda x, i: torch.gather(x, 0, i), lambda: (torch.randn(6, 5), _ids(6, (4, 5)))),
    "gather last dim, smaller index": (lambda x, i: torch.gather(x, 1, i) * x[:2, :3],
                                       lambda: (torch.randn(4, 9), _ids(9, (2, 3)))),
    "take_along_dim of argsort": (lambda x: torch.take_along_dim(x, x.argsort(dim=1), dim=1),
                                  lambda: (torch.randn(4, 7),)),
    "rows": (lambda x, i: x[i] + 1, lambda: (torch.randn(10, 3), _ids(10, (2, 4)))),
    "columns": (lambda x, i: x[:, i], lambda: (torch.randn(3, 10, 2), _ids(10, (5,)))),
    "negative rows": (lambda x, i: x[i - 10], lambda: (torch.randn(10, 3), _ids(10, (6,)))),
    "two adjacent indices":
        (lambda x, i, j: x[:, i, j], lambda: (torch.randn(2, 5, 6, 3), _ids(5, (4,)), _ids(6, (4,), 1))),
    "two separated indices":
        (lambda x, i, j: x[i, :, j], lambda: (torch.randn(5, 2, 6), _ids(5, (3, 2)), _ids(6, (3, 2), 1))),
    "broadcast indices":
        (lambda x, i, j: x[i[:, None], j], lambda: (torch.randn(5, 6), _ids(5, (3,)), _ids(6, (4,), 1))),
    "bfloat16 rows": (lambda w, i: F.embedding(i, w) * 2, lambda: (torch.randn(30, 8).bfloat16(), _ids(30, (2, 5)))),
    "int64 values": (lambda x, i: x[i] * 3, lambda: (torch.arange(20).view(10, 2), _ids(10, (7,)))),
    "padded lookup":
        (lambda w, i: F.pad(F.embedding(i, w), (2, 1, 1, 0)), lambda: (torch.randn(20, 6), _ids(20, (3, 4)))),
}


def test_no_lookup_runs_with_torch(counters):
    for name, (fn, make) in PROGRAMS.items():
        counters.clear()
        compiled(fn, *make())
        assert _torch_index_calls(counters) == {}, name


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_lookups_run_in_kernels_with_eager_values(name):
    fn, make = PROGRAMS[name]
    inputs = make()
    c = compiled(fn, *inputs)
    exact = "layer_norm" not in name
    _same(c(*inputs), fn(*inputs), exact)
    # other index values (the same ones, reversed) at the same shapes: the same kernels, eager's values
    other = tuple(t.flip(-1) if k > 0 and t.dim() and not t.is_floating_point() else t for k, t in enumerate(inputs))
    _same(c(*other), fn(*other), exact)


ERRORS = {
    "embedding past the table":
        (lambda w, i: F.embedding(i, w) + 1, (torch.randn(5, 3), torch.tensor([[1, 5]])), IndexError),
    "index_select below 0":
        (lambda x, i: x.index_select(0, i) * 2, (torch.randn(5, 3), torch.tensor([0, -1])), IndexError),
    "gather past the dim":
        (lambda x, i: torch.gather(x, 1, i), (torch.randn(2, 3), torch.tensor([[0], [3]])), RuntimeError),
    "gather below 0":
        (lambda x, i: torch.gather(x, 1, i) * 2 + 1, (torch.randn(2, 3), torch.tensor([[0], [-1]])), RuntimeError),
    "rows past the dim": (lambda x, i: x[i] + 1, (torch.randn(4, 3), torch.tensor([1, 4])), IndexError),
    # eager checks every index, also where the program reads one element of the result
    "gather read in part":
        (lambda x, i: torch.gather(x, 0, i)[:1] * 2, (torch.randn(5), torch.tensor([1, 9])), RuntimeError),
    "embedding read in part":
        (lambda w, i: F.embedding(i, w)[0] + 1, (torch.randn(5, 3), torch.tensor([2, 5])), IndexError),
    "rows below -size": (lambda x, i: x[i] + 1, (torch.randn(4, 3), torch.tensor([-5, 0])), IndexError),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_an_index_outside_its_dim_raises_eagers_error(name, counters):
    fn, bad, error = ERRORS[name]
    good = tuple(t if k == 0 else t.clamp(0, 1) for k, t in enumerate(bad))
    c = compiled(fn, *good)
    _same(c(*good), fn(*good))
    with pytest.raises(error) as eager:
        fn(*bad)
    with pytest.raises(error) as got:
        c(*bad)
    assert str(got.value) == str(eager.value)
    assert counters["cpp"]["index out of range (eager's error raised)"] == 1
    _same(c(*good), fn(*good))  # the next call runs the kernels again


def test_an_index_error_through_kiln_compile_names_the_users_line():
    def fn(w, i):
        return F.embedding(i, w).relu()

    w = torch.randn(6, 4)
    cf = kiln.compile(fn)
    _same(cf(w, torch.tensor([1, 2])), fn(w, torch.tensor([1, 2])))
    with pytest.raises(IndexError, match="index out of range in self"):
        cf(w, torch.tensor([1, 6]))
    _same(cf(w, torch.tensor([5, 0])), fn(w, torch.tensor([5, 0])))


def test_lookups_compile_once_for_every_length(counters):
    def fn(w, i):
        return F.layer_norm(F.embedding(i, w), (8,)) * 2

    w = torch.randn(30, 8)
    cf = kiln.compile(fn, dynamic=True)
    for n in (3, 5, 9, 2):
        i = _ids(30, (1, n), seed=n)
        torch.testing.assert_close(cf(w, i), fn(w, i), rtol=0, atol=1e-6)
    assert counters["fallback"]["prims.index_select"] == 0
    with pytest.raises(IndexError):
        cf(w, torch.tensor([[0, 30, 1]]))


def test_embedding_trains_with_a_kernel_lookup(counters):
    emb = torch.nn.Embedding(30, 8)
    reference = torch.nn.Embedding(30, 8)
    reference.load_state_dict(emb.state_dict())
    idx = _ids(30, (2, 10))
    kiln.compile(lambda i: torch.tanh(emb(i)).pow(2).sum())(idx).backward()
    torch.tanh(reference(idx)).pow(2).sum().backward()
    torch.testing.assert_close(emb.weight.grad, reference.weight.grad)
    assert counters["fallback"]["prims.index_select"] == 0, dict(counters["fallback"])


@pytest.mark.parametrize("family", ["gpt2", "bert", "t5"])
def test_hugging_face_lookups_run_in_kernels(family, counters):
    """Hugging Face models from small configs (transformers' defaults otherwise): token, position and
    relative-position lookups are kernel loads, outputs as eager's."""
    transformers = pytest.importorskip("transformers")
    configs = {
        "gpt2": lambda: transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000),
        "bert": lambda: transformers.BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                                num_attention_heads=2, vocab_size=1000),
        "t5": lambda: transformers.T5Config(num_layers=2, d_model=64, d_ff=128, num_heads=2, d_kv=32,
                                            vocab_size=1000),
    }
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(configs[family]()).eval()
    ids = _ids(1000, (2, 16))
    kwargs = {"decoder_input_ids": ids} if family == "t5" else {}
    with torch.no_grad():
        got, want = kiln.compile(model)(ids, **kwargs)[0], model(ids, **kwargs)[0]
    torch.testing.assert_close(got, want)
    assert _torch_index_calls(counters) == {}, dict(counters["fallback"])
