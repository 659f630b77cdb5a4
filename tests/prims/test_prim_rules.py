"""Every prim owns its rules: named parameters, a VJP, and a lowering (or a stated reason it has none).
A new prim without them fails here, not as a silent fallback later."""
import inspect

import pytest
import torch

from kiln import prims
from kiln.graph import Graph, TensorMeta
from kiln.lower.lowering import LOWERINGS
from kiln.lower.target import LIBRARY_PRIMS
from kiln.prims.registry import PRIMS

# prims that run with torch on purpose, and why (the list only shrinks)
NOT_LOWERED = {
    **{name: "a special function with no vectorized kernel of kiln's own yet: it runs with torch"
       for name in ("digamma", "i0", "i0e", "i1", "i1e", "ndtr", "ndtri", "log_ndtr", "erfcx", "zeta",
                    "igamma", "igammac")},
    "empty_strided": "uninitialized memory: the wrapper allocates it, there is nothing to compute",
    **{name: "draws from torch's generator so that results equal eager's draw for draw"
       for name in ("uniform", "normal", "randint", "bernoulli")},
    "var_mean": "a reduction with two outputs (variance and mean), not lowered yet: torch.var_mean runs with "
                "torch (torch.var's prims.var is lowered)",
    **{name: "a store whose index is another tensor's value (several elements may land on one: the order "
       "and the accumulation are eager's) is not in the loop IR; loads through an index are "
       "(lower/indirect.py), and index_put at a static arange (lower/arange_index.py)"
       for name in ("scatter", "scatter_add", "scatter_reduce")},
    **{name: "sorting and selection run with torch's kernels" for name in ("sort", "topk")},
    **{name: "a scan whose combine kiln's scan kernels do not express (value and index, or log-sum-exp)"
       for name in ("cummax", "cummin", "logcumsumexp")},
    "check_values": "a runtime check with a side effect (raises like eager); runs in the wrapper",
}


def test_every_prim_has_a_vjp():
    assert [name for name, p in PRIMS.items() if "vjp" not in p.rules] == []


def test_every_prim_is_lowered_or_says_why_not():
    missing = [name for name, p in PRIMS.items()
               if p not in LOWERINGS and "view" not in p.tags and name not in LIBRARY_PRIMS and name not in NOT_LOWERED]
    assert missing == [], "prims with no lowering and no stated reason"
    stale = [name for name in NOT_LOWERED if PRIMS[name] in LOWERINGS or name in LIBRARY_PRIMS]
    assert stale == [], "lowered now: drop them from NOT_LOWERED"


def test_every_prim_names_its_parameters():
    """Consumers read a prim's arguments by name (Prim.params), so each reference signature names them."""
    for name, p in PRIMS.items():
        kinds = {q.kind for q in p.signature.parameters.values()}
        assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, name


@pytest.mark.parametrize("as_keywords", [False, True])
def test_params_read_by_name_however_the_call_spelled_them(as_keywords):
    """A convolution recorded with keyword arguments reads the same as one recorded positionally (the
    profiler's FLOPs rule once read `args[6]`, and a keyword `transposed` read as False)."""
    g = Graph("g")
    x = g.placeholder("x", TensorMeta.of(torch.empty(1, 2, 5, 5)))
    w = g.placeholder("w", TensorMeta.of(torch.empty(2, 2, 3, 3)))
    values = dict(bias=None, stride=[1, 1], padding=[0, 0], dilation=[1, 1], transposed=True, output_padding=[0, 0],
                  groups=1)
    meta = TensorMeta.of(torch.empty(1, 2, 7, 7))
    if as_keywords:
        node = g.call_prim(prims.convolution, (x, w), values, meta)
    else:
        node = g.call_prim(prims.convolution, (x, w, *values.values()), {}, meta)
    params = prims.convolution.params(node)
    assert params["transposed"] is True and params["groups"] == 1 and params["x"] is x
