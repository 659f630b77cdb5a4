"""kiln.autograd.mincut against networkx (torch's own dependency) and against brute force."""
import itertools
import math
import random

import pytest

from kiln.autograd.mincut import FlowGraph, Unbounded

nx = pytest.importorskip("networkx")


def _random_graph(rng: random.Random, n: int, m: int, inf_share: float):
    edges = []
    for _ in range(m):
        u, v = rng.sample(range(n), 2)
        cap = math.inf if rng.random() < inf_share else rng.choice([0.0, 0.5, 1.0, 3.0, 1 / 32 * rng.randint(1, 4096)])
        edges.append((u, v, cap))
    return edges


def _cut_value(edges, side):
    return sum(c for u, v, c in edges if u in side and v not in side)


@pytest.mark.parametrize("seed", range(60))
def test_matches_networkx(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    edges = _random_graph(rng, n, rng.randint(1, 4 * n), inf_share=0.25)
    ours, theirs = FlowGraph(), nx.DiGraph()
    for u, v, c in [(0, 1, 0.0), *edges]:     # (source and sink exist in both)
        ours.add_edge(u, v, c)
        if theirs.has_edge(u, v):          # networkx keeps one edge per pair: merge parallel ones
            theirs[u][v]["capacity"] += c
        else:
            theirs.add_edge(u, v, capacity=c)
    try:
        value, (reach, _) = nx.minimum_cut(theirs, 0, 1)
    except nx.NetworkXUnbounded:
        with pytest.raises(Unbounded):
            ours.min_cut(0, 1)
        return
    flow, side = ours.min_cut(0, 1)
    assert flow == pytest.approx(value, rel=1e-9, abs=1e-9)
    assert _cut_value(edges, side) == pytest.approx(value, rel=1e-9, abs=1e-9)
    assert side == set(reach)              # both: the minimum cut closest to the sink


def test_brute_force_small():
    rng = random.Random(7)
    for _ in range(40):
        n = rng.randint(3, 8)
        edges = _random_graph(rng, n, rng.randint(2, 3 * n), inf_share=0.0)
        g = FlowGraph()
        for u, v, c in [(0, 1, 0.0), *edges]:
            g.add_edge(u, v, c)
        flow, side = g.min_cut(0, 1)
        others = [k for k in range(2, n)]
        best = min(_cut_value(edges, {0, *subset}) for r in range(len(others) + 1)
                   for subset in itertools.combinations(others, r))
        assert flow == pytest.approx(best)
        assert 0 in side and 1 not in side and _cut_value(edges, side) == pytest.approx(best)


def test_long_path_has_no_recursion_limit():
    g = FlowGraph()
    for k in range(5000):
        g.add_edge(k, k + 1, 2.0 if k != 2500 else 1.0)
    flow, side = g.min_cut(0, 5000)
    assert flow == 1.0 and side == set(range(2501))


def test_infinite_path_is_unbounded_and_negative_capacity_refused():
    g = FlowGraph()
    g.add_edge("s", "a", math.inf)
    g.add_edge("a", "t", math.inf)
    with pytest.raises(Unbounded):
        g.min_cut("s", "t")
    with pytest.raises(ValueError, match="capacity"):
        FlowGraph().add_edge("s", "t", -1.0)
