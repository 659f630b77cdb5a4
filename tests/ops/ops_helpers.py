"""What the decomposition tests share: trace, decompose, run on the reference interpreter, compare with
eager, and check the op did not fall back for a reason of its own module."""
import torch

import kiln.ops
from kiln import graph as kg
from kiln.counters import counters, reset


def foreign(reason, modules):
    """A fallback caused by an op these decompositions call but do not define (another module's op that is
    not decomposed) is not counted against them."""
    op, _, needs = reason.partition(" (needs ")
    needed = needs.rstrip(")") if needs else op
    if not needed.startswith("torch."):
        return False
    mine = {kg.torch_name(f) for f, fn in kiln.ops.DECOMPOSITIONS.items() if fn.__module__ in modules}
    return needed not in mine


def check_op(fn, *inputs, decomposed=True, modules=()):
    """Trace fn, decompose to prims, run on the reference interpreter; compare with eager."""
    reset()
    g = kiln.ops.trace(fn, *inputs)
    p = kg.to_prims(g)
    kg.verify(p)
    got = kg.run(p, list(inputs))
    expected = fn(*inputs)
    got_leaves, exp_leaves = list(kg.flatten(got)), list(kg.flatten(expected))
    assert len(got_leaves) == len(exp_leaves)
    for a, b in zip(got_leaves, exp_leaves):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        torch.testing.assert_close(a, b, equal_nan=True)
    if decomposed:
        assert not counters["decomposition_error"], dict(counters["decomposition_error"])
        assert not counters["decomposition_mismatch"], dict(counters["decomposition_mismatch"])
        own = [r for r in counters["no_decomposition"] if not foreign(r, modules)]
        assert not own, own
        if not counters["no_decomposition"]:
            assert not p.fallbacks(), [n.target_name() for n in p.fallbacks()]
    return p
