"""Which items of a schedule must run before which: one rule, asked by fusion and by the kernel order.

Read-after-write, and two constraints for fallbacks: fallbacks keep their relative order (random ops draw
from torch's generator in program order; others may have side effects), and an item reading a buffer a
fallback may touch stays on its side of that fallback (an in-place torch op run as a fallback writes its
argument, and a fallback's result may be a view of its argument, so the fallback's arguments and results
count as one buffer).
"""
from __future__ import annotations


def dependencies(writes: list[list[str]], reads: list[list[str]], fallback: list[bool]) -> list[set[int]]:
    """For each item (by index, in program order), the items that must run before it. `reads` name every
    buffer an item waits for (a concatenation computed in place: each of its parts)."""
    n = len(writes)
    producer = {name: i for i, ws in enumerate(writes) for name in ws}
    before: list[set[int]] = [set() for _ in range(n)]
    for i, names in enumerate(reads):
        for name in names:
            j = producer.get(name)
            if j is not None and j != i:
                before[i].add(j)
    alias: dict[str, str] = {}

    def root(name: str) -> str:
        while alias.get(name, name) != name:
            alias[name] = alias.get(alias[name], alias[name])  # path halving
            name = alias[name]
        return name
    fallbacks = [i for i in range(n) if fallback[i]]
    for i in fallbacks:
        names = reads[i] + writes[i]
        for name in names[1:]:
            a, b = root(names[0]), root(name)
            if a != b:
                alias[b] = a
    touched = {root(name) for i in fallbacks for name in reads[i] + writes[i]}
    last_fallback: dict[str, int] = {}  # alias class -> the latest fallback touching it
    readers_since: dict[str, list[int]] = {}  # alias class -> its readers since that fallback
    for previous, i in zip(fallbacks, fallbacks[1:]):
        before[i].add(previous)
    for i in range(n):
        classes = {root(name) for name in reads[i]} & touched
        for c in classes:
            if c in last_fallback:
                before[i].add(last_fallback[c])
        if fallback[i]:
            for c in classes | {root(name) for name in writes[i]}:
                before[i].update(readers_since.pop(c, ()))
                last_fallback[c] = i
        else:
            for c in classes:
                readers_since.setdefault(c, []).append(i)
    for i in range(n):
        before[i].discard(i)
    return before
