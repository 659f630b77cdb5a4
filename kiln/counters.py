"""Process-wide counters: what kiln captured, decomposed, fell back on, and why.

`counters["fallback"]["torch.linalg.svd"]` counts fallback nodes by op (torch ops kiln did not lower);
`counters["custom_op"]` counts torch.library operators outside aten recorded as graph nodes (a library's own
kernels, run as they are by design); `kiln.counters` is this object.
"""
from __future__ import annotations

import collections

counters: collections.defaultdict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def reset() -> None:
    counters.clear()
