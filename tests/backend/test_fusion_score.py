"""Fusion by score (kiln.schedule.fusion): candidate pairs from the dependencies, legal when no path between
them runs through a third item, merged by bytes saved; groups immutable with an enum role."""
import dataclasses
import shutil

import pytest
import torch

import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph
from kiln.schedule import FusedGroup, Role

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]


def check(fn, *inputs, kernels):
    graph = kiln.ops.trace(fn, *inputs)
    c = compile_graph(graph, list(inputs))
    for got, want in zip(c(*inputs), fn(*inputs)):
        torch.testing.assert_close(got, want)
    assert c.kernel_count == kernels, "\n".join(item.describe() for item in c.schedule)
    return c


def sibling_reductions_around_matmul(x, w):
    a = x.sum(-1)
    m = x @ w  # independent of both reductions: it no longer closes the kernel
    b = x.amax(-1)
    return a, m, b


def test_sibling_reductions_around_a_matmul_fuse():
    x, w = torch.randn(64, 48), torch.randn(48, 16)
    c = check(sibling_reductions_around_matmul, x, w, kernels=1)
    (kernel,) = c.kernels
    assert [m.role for m in kernel.members] == [Role.REDUCTION, Role.REDUCTION]
    assert len(c.externs) == 1


def test_sibling_layer_norms_around_a_matmul_fuse():
    x, w = torch.randn(32, 64), torch.randn(64, 64)

    def fn(x, w):
        a = torch.nn.functional.layer_norm(x, (64,))
        m = x @ w
        b = torch.softmax(x, -1)
        return a, m, b
    check(fn, x, w, kernels=1)


def test_no_fusion_through_an_extern():
    """relu(x) feeds the matmul, whose product the second kernel reads with relu(x): fusing the two kernels
    would need the matmul both before and after them."""
    x, w = torch.randn(32, 32), torch.randn(32, 32)

    def fn(x, w):
        a = torch.relu(x)
        m = a @ w
        return ((m * a).sum(-1),)
    c = check(fn, x, w, kernels=2)
    kinds = [type(item).__name__ for item in c.schedule]
    assert kinds == ["FusedGroup", "ExternNode", "FusedGroup"], kinds


def test_no_fusion_through_a_kernel_that_cannot_join():
    """A row sum r, a column sum c of x * r, and an epilogue reading both that fits r's kernel: it may not
    join it past c (another iteration space), which needs r first and is needed by the epilogue."""
    x = torch.randn(16, 24)

    def fn(x):
        r = x.sum(-1, keepdim=True)  # (16, 1)
        c = (x * r).sum(0)  # (24,): reads r
        return (x * r + c,)
    c = check(fn, x, kernels=3)
    available = {"x"}
    for item in c.schedule:  # each kernel after what it reads
        written = {m.buffer.name for m in item.members}
        reads = {name for m in item.members for name, _ in m.buffer.reads()}
        assert reads <= available | written, item.describe()
        available |= written


def test_bytes_saved_rank_candidates(monkeypatch):
    """Two reductions of x and, between them, one of y: the pair sharing x fuses first (first-fit in
    source order would have put y's reduction into x's first kernel)."""
    from kiln.graph.pipeline import FUEL
    x, y = torch.randn(64, 128), torch.randn(64, 128)
    decisions = []
    take = FUEL.take

    def record(pass_name, decision):
        if pass_name == "fuse":
            decisions.append(decision() if callable(decision) else decision)
        return take(pass_name, decision)
    monkeypatch.setattr(FUEL, "take", record)

    def fn(x, y):
        a = x.sum(-1)
        b = (y * 2).amax(-1)
        c = x.amax(-1)
        return a, b, c
    c = check(fn, x, y, kernels=1)  # all three fit one loop nest: y's joins afterwards (a launch saved)
    members = c.kernels[0].members
    reads = [{name for name, _ in m.buffer.reads()} for m in members]
    assert reads == [{"x"}, {"x"}, {"y"}], reads  # x's reductions, then y's
    assert decisions[0] == f"fuse {members[1].buffer.name} into kernel0", decisions  # (named by its first node)


def test_groups_are_immutable_and_roles_are_an_enum():
    x, w = torch.randn(64, 48), torch.randn(48, 16)
    graph = kiln.ops.trace(sibling_reductions_around_matmul, x, w)
    c = compile_graph(graph, [x, w])
    kernel = c.kernels[0]
    assert isinstance(kernel, FusedGroup)
    with pytest.raises(dataclasses.FrozenInstanceError):
        kernel.members = ()
    with pytest.raises(TypeError):
        kernel.local["buf0"] = "scalar"
    with pytest.raises(TypeError, match="Role.REDUCTION"):
        _ = kernel.members[0].role == "reduction"  # a stale string comparison is loud, never just False
    assert str(Role.INNER) == "inner" and f"{Role.SCAN}" == "scan"
    # the plan's kernels carry the buffers kept inside them; the plan made copies
    planned = [g for step in c.plan.steps for g in getattr(step.node, "groups", [])]
    assert [g.name for g in planned] == [g.name for g in c.kernels]


def test_without_fuel_every_node_is_its_own_kernel(monkeypatch):
    from kiln.graph.pipeline import FUEL
    x, w = torch.randn(64, 48), torch.randn(48, 16)
    monkeypatch.setattr(FUEL, "take", lambda pass_name, decision: pass_name != "fuse")
    check(sibling_reductions_around_matmul, x, w, kernels=2)


def _block(x, w1, w2):
    for _ in range(2):
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],))
        a = torch.softmax(h @ w1, -1)
        x = x + torch.relu(a @ w2) * h.sum(-1, keepdim=True)
    return x, x.amax(0)


def _siblings(x, w1, w2):
    p = torch.relu(x @ w1) * 3      # producers of only one of the siblings below each
    r = torch.sigmoid(w2 @ w2) * 2
    a = (x * 2 + r).sum(-1, keepdim=True)
    b = (x + p).amax(-1, keepdim=True)
    q = torch.tanh(w2 @ w1) + 1     # a producer of only the consumer below
    return (a.exp() * x) @ q, (b.exp() * x) @ w1, (p + 1) @ w2


def _assert_closures_exact(f) -> None:
    """Legality and order read from the kept closures equal a search of the merged items' dependency
    graph."""
    items = list(f.alive)
    after = {r: set() for r in items}
    for i, deps in enumerate(f.before):
        for j in deps:
            if f.rep[j] != f.rep[i]:
                after[f.rep[j]].add(f.rep[i])
    reach = {}
    for r in items:   # everything after r (depth-first)
        seen, stack = set(), list(after[r])
        while stack:
            s = stack.pop()
            if s not in seen:
                seen.add(s)
                stack.extend(after[s])
        reach[r] = seen
    before = {r: {s for s in items if r in reach[s]} for r in items}
    for a in items:
        assert a not in reach[a], "a cycle among merged items"
        for b in items:
            if a < b:
                exact = not (reach[a] & before[b]) and not (reach[b] & before[a])
                assert f.legal(a, b) == exact, (a, b)
                assert bool(f.ancestors[b] >> a & 1) == (b in reach[a]), (a, b)
                assert bool(f.descendants[a] >> b & 1) == (b in reach[a]), (a, b)
                assert bool(f.descendants[b] >> a & 1) == (a in reach[b]), (a, b)


def test_merges_keep_the_closures_exact():
    """A merge updates only the items before or after one of the two merged and not the other (it once
    rewrote every item's sets at every merge: 118 s of fusion for a 12k-node model); after each merge the
    legality it reads equals a search of the merged graph."""
    from kiln.schedule import fusion
    x, w1, w2 = torch.randn(32, 32), torch.randn(32, 32), torch.randn(32, 32)
    for fn in (_block, _siblings):
        c = compile_graph(kiln.ops.trace(fn, x, w1, w2), [x, w1, w2])
        f = fusion._Fusion(c.loop)
        join, merges = f.join, []

        def checked_join(first, second, group, f=f, join=join, merges=merges):
            join(first, second, group)
            merges.append((first, second))
            _assert_closures_exact(f)
        f.join = checked_join
        _assert_closures_exact(f)
        f.by_score()
        f.first_fit()
        assert len(merges) >= 3
        assert len(f.schedule()) == c.kernel_count + len(c.externs)
