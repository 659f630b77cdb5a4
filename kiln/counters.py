"""Process-wide counters: what kiln captured, decomposed, fell back on, and why.

`counters["fallback"]["torch.linalg.svd"]` counts fallback nodes by op; `kiln.counters` is this object.
"""
from __future__ import annotations

import collections

counters: collections.defaultdict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def reset() -> None:
    counters.clear()
