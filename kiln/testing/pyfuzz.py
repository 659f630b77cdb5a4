"""Random small Python programs against the capture frontend, checked differentially against plain Python.

`generate(seed)`: a deterministic program `program(x, y, items, table, obj)` with `inputs(v)`, a class and
helpers: tensor arithmetic (exact or tolerance-comparable), ints, branches, loops (range, lists, enumerate,
zip, dicts, generators, while), closures, lambdas, default/star arguments, mutation of lists, dicts,
attributes and class attributes (locals and arguments), lists mutated while iterated, try/except, early
returns, in-place updates of tensors, views and inputs, data-dependent branches and prints (graph breaks).
Kinds, shapes, list lengths and dict keys are tracked, so programs terminate and raise only on purpose.
`check_seed(seed)` runs one by plain Python and by `kiln.compile` (equal arguments twice, then other values
of the same structure, which the guards must catch) and compares results, exceptions, arguments and module
state afterwards, output aliasing and stdout; an internal error kiln swallowed (running eagerly) fails too.

    python -m kiln.testing.pyfuzz --seeds 0:2000        # failing seeds, their descriptions, a count
    python -m kiln.testing.pyfuzz --show 17             # the source of seed 17
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import linecache
import random
import signal
import sys
import threading
import traceback
import warnings
from typing import Any

import torch

INF = 10 ** 6
KEYS = ["k0", "k1", "k2", "k3", "k4"]
EXCS = ["ValueError", "KeyError", "IndexError"]
T34 = ("T", (3, 4))
SHAPES = [(3, 4)] * 6 + [(4,), (3,), (), (3, 3), (4, 3)]
PARTNERS = {(3, 4): [(4,), (), (3, 4)], (4, 3): [(3,), ()], (3, 3): [(3,), ()], (4, 4): [(4,), ()],
            (4,): [()], (3,): [()], (): [()]}
VARIANTS = (0, 0, 1)  # inputs(v) of each call: the second hits the cache, the third must fail a guard


# Kinds of values: ("T", shape) a float tensor, "I" an int, "N" an int or a (3, 4) tensor, "S" a str,
# a _Box (a container, shared by the names that alias it), or "tfn"/"lam"/"gen" (functions of the program).
class _Box:
    """A list (element kind "T", "I" or "N"; lo <= length <= hi), a dict (element kind, keys surely there)
    or obj (has_d: obj.d exists; None: unknown). `pin`: what the innermost loop relies on (a length, keys,
    obj.d); `frozen`: a loop iterates the box."""

    def __init__(self, kind: str, elem: str = "N", lo: int = 0, hi: int | None = None, keys: tuple = ()):
        self.kind, self.elem, self.lo, self.hi, self.keys = kind, elem, lo, lo if hi is None else hi, [*keys]
        self.pin: Any = [] if kind == "dict" else 0
        self.frozen, self.has_d = False, False
        self.c = _Box("list", "I", 2) if kind == "obj" else None

    el = property(lambda self: T34 if self.elem == "T" else self.elem)  # the kind of an element


def _boxes(env: dict) -> list:
    out = [b for v in env.values() for b in ([v, v.c] if isinstance(v, _Box) and v.kind == "obj" else [v])]
    return [b for i, b in enumerate(out) if isinstance(b, _Box) and all(b is not o for o in out[:i])]


class _Gen:
    def __init__(self, seed: int):
        r = self.r = random.Random(seed)
        self.seed, self.lines, self.ind, self.n, self.budget = seed, [], 1, 0, r.randint(8, 28)
        self.loop = self.depth = self.no_shrink = self.in_fn = self.uses_g = 0
        self.counters: list = []  # counters of the enclosing while loops: never assigned in their loop
        self.datadep = r.choice([0, 0, 1, 2])  # data-dependent branches and calls of hbrk (graph breaks)
        self.allow_raise, self.prints = r.random() < 0.2, int(r.random() < 0.25)
        # in-place tensor updates (half the programs: kiln breaks on updates of tensors that have views),
        # and of those, half keep views in variables and update slices in place
        self.inplace = r.random() < 0.5
        self.views = self.inplace and r.random() < 0.5
        self.lit = lambda lo, hi: f"({r.randint(lo, hi)}, {r.randint(lo, hi)})[v]"  # an int per variant
        items = [r.choice(["r()", self.lit(0, 6)]) for _ in range(r.randint(2, 5))]
        keys, self.items_src = KEYS[:r.randint(1, 3)], ", ".join(items)
        self.alias = r.choice(["pass"] * 4 + ["items.append(x)", 'table["k4"] = y', "obj.b = x"])
        self.table_src = ", ".join(f'"{k}": ' + r.choice(["r()", self.lit(1, 5)]) for k in keys)
        self.env: dict = {"x": T34, "y": T34, "obj": _Box("obj"),
                          "items": _Box("list", "N", len(items) + ("items" in self.alias)),
                          "table": _Box("dict", keys=keys + ["k4"] * ("table" in self.alias))}

    def new(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, *lines: str) -> None:
        self.lines += ["    " * self.ind + line for line in lines]

    def names(self, *kinds: Any) -> list:  # kind "T": a tensor of any shape
        return [n for n, k in self.env.items() if any(k == c or c == "T" and type(k) is tuple for c in kinds)]

    def boxes(self, kind: str, mutable=False) -> list:
        out = [(n, k) for n, k in self.env.items() if isinstance(k, _Box) and k.kind == kind]
        out += [("obj.c", self.env["obj"].c)] if kind == "list" and not self.in_fn else []
        return [(n, k) for n, k in out if not (mutable and k.frozen)]

    @staticmethod
    def fork(env: dict) -> tuple:
        return copy.deepcopy(env, memo := {}), memo

    def join(self, pre: dict, branches: list) -> dict:
        """After control flow: pre's boxes narrowed to all branches ((env, memo or None: pre itself))."""
        olds = _boxes(pre)
        news = [[(m.get(id(b), b) if m is not None else b) for b in olds] for e, m in branches]
        for i, b in enumerate(olds):
            bs = [n[i] for n in news]
            b.lo, b.hi = min(x.lo for x in bs), max(x.hi for x in bs)
            b.keys = [k for k in bs[0].keys if all(k in x.keys for x in bs)]
            b.has_d = bs[0].has_d if all(x.has_d == bs[0].has_d for x in bs) else None
        out = {}
        for name in list(pre) + [n for n in branches[0][0] if n not in pre]:
            ks = [e.get(name) for e, m in branches]
            if isinstance(pre.get(name), _Box) or pre.get(name) in ("tfn", "lam", "gen"):
                out[name] = pre[name]
            elif all(isinstance(k, (tuple, str)) for k in ks):
                kind = ks[0] if all(k == ks[0] for k in ks) else \
                    "N" if all(k in ("I", "N", T34) for k in ks) else None
                out.update({name: kind} if kind else {})
        return out

    def block(self, n: int, body=None) -> None:
        """An indented block: `body()` (emits lines), then `n` statements (fewer once the budget is spent)."""
        self.ind, self.depth, start = self.ind + 1, self.depth + 1, len(self.lines)
        if body:
            body()
        for _ in range(n):
            if self.budget <= 0 and len(self.lines) > start:
                break
            self.stmt()
        if len(self.lines) == start:
            self.emit("pass")
        self.ind, self.depth = self.ind - 1, self.depth - 1

    def num(self) -> str:
        """An int or a (3, 4) tensor."""
        if self.in_fn:
            return 'table.get("k3", 1)'
        r, it = self.r, self.env["items"]
        opts = self.names("N") + [f'table["{k}"]' for k in self.env["table"].keys]
        opts += [f"items[{r.randint(0, it.lo - 1)}]", "items[-1]"] if it.lo else []
        return r.choice(opts + ['table.get("k3", 1)'])

    def iexpr(self, d: int = 2) -> str:
        r = self.r
        if d <= 0 or r.random() < 0.4:
            opts = self.names("I") * 3 + [str(r.randint(0, 6)), "obj.a", "len(items)", "x.shape[0]", "STEP",
                                          "len(table)", 'getattr(obj, "d", 2)', "obj.twice", "G", "len(LOG)",
                                          "Obj.count", "type(obj).count", "obj.count"]
            lists = self.boxes("list")
            opts += [f"len({n})" for n, _ in lists] + [f"{n}.dim()" for n in self.names("T")]
            opts += [f"{n}[{r.randint(0, k.lo - 1)}]" for n, k in lists if k.elem == "I" and k.lo]
            opts += [f'{n}["{key}"]' for n, k in self.boxes("dict") if k.elem == "I" for key in k.keys]
            opts += [f"{n}.size({r.randint(0, 1)})" for n in self.names(T34)]
            return f"hacc({self.iexpr(0)})" if not self.in_fn and r.random() < 0.1 else r.choice(opts)
        a, b = self.iexpr(d - 1), self.iexpr(d - 1)
        if r.random() < 0.15:
            return r.choice([f"({a} if {self.cond()} else {b})", "sum(obj.c)", "min(obj.c, default=-1)",
                             "len([e for e in items if isinstance(e, int)])", f"int({a} > {b})",
                             "sum(1 for e in obj.c if e > 2)", 'len(f"{obj.a}-{obj.c}")', "len({**table})"])
        return r.choice([f"({a} + {b})", f"({a} - {b})", f"({a} * {b} % 7)", f"({a} // 2)", f"({a} % 3)",
                         f"min({a}, {b})", f"max({a}, {b})", f"abs({a})"])

    def cond(self) -> str:
        r, a, b = self.r, self.iexpr(1), self.iexpr(1)
        return r.choice([f"{a} > {b}", f"{a} % 2 == 0", f"{a} == {b}", f"{a} <= {b} and {b} < 4",
                         f"0 <= {a} < {b}", f"{a} > 2 or {b} == 1", "any(e > 3 for e in obj.c)", f"{a} != 2",
                         "isinstance(obj, Obj)", f'"{r.choice(KEYS)}" in table', 'hasattr(obj, "d")',
                         f"len(items) > {r.randint(1, 4)}"] + [f'{n} == "k1"' for n in self.names("S")])

    def tatom(self, shape: tuple, d: int) -> tuple:
        """(code, is_view): is_view when the code may be a view of a variable (it shares its memory)."""
        r = self.r
        opts = self.names(("T", shape)) * 2 + ["obj.b"] * (shape == (3, 4))
        if shape == (3, 4) and d > 0 and r.random() < 0.3:  # calls
            fns, e = self.names("tfn", "lam"), self.texpr((3, 4), d - 1)[0]
            if self.datadep and not self.in_fn and r.random() < 0.2:
                self.datadep -= 1
                return r.choice([f"hbrk({e})", f"hbrk({e}, {self.iexpr(0)})"]), 0
            if fns and r.random() < 0.6:
                f = r.choice(fns)
                args = ['', ', 3', ', s=0.5'] if self.env[f] == "lam" else \
                    ['', ', 2', ', m=3', f', 1, {self.iexpr(0)}', ', *obj.c[:2]']
                return f"{f}({e}{r.choice(args)})", 0
            return r.choice([f"h0({e})", f"h0({e}, {r.randint(0, 3)})", f"h0({e}, 2, {self.iexpr(1)}, 1)",
                             f"hkw({e}, scale={r.randint(1, 3)})", f"obj.scaled({e})", f"h0(*[{e}, 2])",
                             f"hkw({e}, extra={self.iexpr(1)})", f'hkw({e}, **{{"scale": 2, "z": 1}})',
                             f"obj.scaled(t={e}, k={self.iexpr(0)})"]), 0
        if opts and (r.random() < 0.5 or d <= 0):
            return r.choice(opts), 1
        s = self.texpr((3, 4), d - 1)[0] if d > 1 and r.random() < 0.3 else r.choice(self.names(T34))
        s2, i, j = r.choice(self.names(T34)), r.randint(0, 2), r.randint(0, 3)
        if d > 0 and shape == (3, 4) and r.random() < 0.3:
            return r.choice([f"({self.texpr((3, 3), d - 1)[0]} @ {s})",
                             f"({s} @ {self.texpr((4, 4), d - 1)[0]})"]), 0
        views = {(4,): [f"{s}[{i}]", f"{s}[{i}, :]"], (3,): [f"{s}[:, {j}]"], (): [f"{s}[{i}, {j}]"],
                 (4, 3): [f"{s}.t()", f"{s}.T", f"{s}.transpose(0, 1)"], (3, 4): [s]}.get(shape, [])
        if views and r.random() < 0.5:
            return r.choice(views), 1
        return r.choice({(4,): [f"{s}.sum(0)", f"{s}.sum(dim=0)", f"{s}.amax(0)", f"{s}.mean(0)"],
                         (3,): [f"{s}.sum(1)", f"{s}.sum(dim=-1)", f"torch.sum({s}, 1)"],
                         (): [f"{s}.sum()", f"{s}.max()"], (4, 3): [f"{s}.t().relu()"],
                         (4, 4): [f"({s}.t() @ {s2})"],
                         (3, 3): [f"({s} @ {s2}.t())", f"torch.mm({s}, {s2}.t())", f"{s}.matmul({s2}.T)"],
                         (3, 4): [f"torch.where({s} > 0, {s}, {s2})", f"torch.cat([{s}[:1], {s2}[1:]])",
                                  f"{s}.clone()", f"torch.stack([{s2}[2], {s}[0], {s}[1]])"]}[shape]), 0

    def texpr(self, shape: tuple, d: int = 2) -> tuple:
        r = self.r
        if d <= 0 or r.random() < 0.3:
            return self.tatom(shape, d)
        if r.random() < 0.05:
            return f"({self.texpr(shape, d - 1)[0]} if {self.cond()} else {self.texpr(shape, d - 1)[0]})", 1
        if r.random() < 0.3:
            e = self.texpr(shape, d - 1)[0]
            return r.choice([f"torch.sin({e})", f"{e}.tanh()", f"torch.relu({e})", f"(-{e})", f"{e}.abs()",
                             f"torch.sigmoid({e})", f"{e}.sin()"]), 0
        a, c = self.texpr(shape, d - 1)[0], r.random()
        if c < 0.3:
            b = r.choice(["2", "0.5", "1.5", "3", "-1.0", "SCALE", self.iexpr(1)])
        else:
            b = self.texpr(r.choice(PARTNERS[shape]), d - 1)[0] if c > 0.45 or shape != (3, 4) else self.num()
        a, b = (b, a) if r.random() < 0.3 else (a, b)
        return f"({a} {r.choice('+-*')} {b})", 0

    def fresh_t(self, shape: tuple) -> str:
        """A tensor of `shape` that shares no memory with anything (the right side of an in-place op)."""
        e, view = self.texpr(shape, 2)
        return e + ".clone()" if view else e

    def value(self, elem: str) -> str:
        elem = self.r.choice("TIN") if elem == "N" else elem
        return self.texpr((3, 4), 1)[0] if elem == "T" else self.iexpr(1) if elem == "I" else self.num()

    def stmt(self) -> None:
        self.budget -= 1
        table = [(self.s_assign_t, 12), (self.s_assign_i, 6), (self.s_assign_n, 3), (self.s_inplace, 6),
                 (self.s_list, 6), (self.s_dict, 4), (self.s_obj, 3), (self.s_terminal, 2), (self.s_new, 3),
                 (self.s_live, 2), (self.s_misc, 4)]
        if self.depth < 3 and self.budget >= 3:
            table += [(self.s_if, 7 + self.datadep), (self.s_for, 5), (self.s_while, 2), (self.s_try, 2)]
        if self.depth == 0:
            table += [(self.s_closure, 2), (self.s_if, 2 * self.datadep)]
        self.r.choices(*zip(*table))[0]()

    def assign(self, name: str, kind: Any, code: str) -> None:
        self.emit(f"{name} = {code}")
        self.env[name] = kind

    def s_assign_t(self) -> None:
        r, olds = self.r, self.names("T")
        if olds and r.random() < 0.5:
            name = r.choice(olds)
            shape = self.env[name][1]
            if r.random() < 0.25 and self.inplace:
                return self.emit(f"{name} {r.choice('+-*')}= {self.fresh_t(r.choice(PARTNERS[shape]))}")
            e, view = self.texpr(shape, r.randint(1, 3))
            if self.loop and not view:  # keep values bounded over iterations
                e = r.choice([f"torch.tanh({e})", f"({name} * 0.5 + torch.sin({e}))"])
        else:
            name, shape = self.new("t"), r.choice(SHAPES)
            e, view = self.texpr(shape, r.randint(1, 3))
        self.assign(name, ("T", shape), e + ".clone()" * (view and not self.views and e not in self.env))

    def s_assign_i(self) -> None:
        r, olds = self.r, [n for n in self.names("I") if n not in self.counters]
        if olds and r.random() < 0.5:
            name, e = r.choice(olds), self.iexpr(2)
            e = f"({e}) % {r.randint(5, 17)}" if self.loop or r.random() < 0.5 else e
            return self.emit(f"{name} {r.choice('+-') if r.random() < 0.3 and not self.loop else ''}= {e}")
        gens = self.names("gen")
        e = self.iexpr(2) if r.random() < 0.8 else f"sum({gens[0]}({r.randint(0, 4)}))" if gens else \
            f"sum(i * {self.iexpr(0)} for i in range({r.randint(0, 4)}))"
        self.assign(self.new("k"), "I", e)

    def s_assign_n(self) -> None:
        r, c, olds = self.r, self.r.random(), self.names("N")
        it, tb = self.env["items"], self.env["table"]
        if olds and c < 0.3:  # on a tensor, `+=` updates what the name holds in place
            n, op, v = r.choice(olds), r.choice('+-*'), r.choice(['1', '2', self.iexpr(0)])
            return self.emit(f"{n} {op}= {v}" if self.inplace else f"{n} = {n} {op} {v}")
        name = self.new("n")
        if c < 0.5 and not tb.frozen:
            key = r.choice(KEYS)
            self.assign(name, "N", f'table.setdefault("{key}", {self.value("N")})')
            tb.keys += [key] * (key not in tb.keys)
        elif c < 0.65 and not it.frozen and not self.no_shrink and it.lo - 1 >= it.pin:
            self.assign(name, "N", r.choice(["items.pop()", "items.pop(0)"]))
            it.lo, it.hi = it.lo - 1, it.hi - 1
        else:
            self.assign(name, "N", self.num())

    def s_inplace(self) -> None:
        r, it = self.r, self.env["items"]
        if not self.inplace:
            return self.s_assign_t()
        if r.random() < 0.1 and it.lo:
            i = r.randint(0, it.lo - 1)
            return self.emit(f"if isinstance(items[{i}], torch.Tensor):",
                             f"    items[{i}].{r.choice(['add_', 'mul_', 'sub_'])}({self.fresh_t((4,))})")
        t = r.choice(self.names("T") + ["obj.b"])
        shape, i, j = self.env[t][1] if t in self.env else (3, 4), r.randint(0, 2), r.randint(0, 3)
        if shape == (3, 4) and self.views and r.random() < 0.5:
            t, shape = r.choice([(f"{t}[{i}]", (4,)), (f"{t}[:, {j}]", (3,)), (f"{t}[1:3]", None),
                                 (f"{t}[:, 1:3]", None), (f"{t}.t()", (4, 3)), (f"{t}[{i}, {j}]", ())])
        rhs = r.choice(["2", "0.5", "-1", self.iexpr(1)])
        if shape is not None and r.random() < 0.7:
            rhs = self.num() if shape == (3, 4) and r.random() < 0.2 else \
                self.fresh_t(r.choice(PARTNERS[shape]))
        ops = [(f"{t}.{r.choice(['add_', 'sub_', 'mul_'])}({rhs})", 8), (f"{t}.fill_(1.5)", 1),
               (f"{t}.{r.choice(['sin_', 'relu_', 'tanh_', 'zero_', 'abs_'])}()", 2),
               (f"{t}.{r.choice(['clamp_(-1.0, 1.0)', 'clamp_(min=0.0)'])}", 1),
               (f"{t}.masked_fill_({t} > 0.5, 0.5)", 1)]
        ops += [(f"{t}.copy_({self.fresh_t(shape)})", 1)] if shape else []
        if not t.endswith(")"):
            ops += [(f"{t} {r.choice('+-*')}= {rhs}", 6), (f"{t}[{t} < 0] = {r.choice(['0.0', '1.0'])}", 1)]
        self.emit(r.choices(*zip(*ops))[0])

    def shrink(self, name: str, lst: _Box, code: str, by: int = 1) -> None:
        if self.no_shrink:
            return
        if lst.lo - by >= lst.pin:
            self.emit(code)
            lst.lo, lst.hi = lst.lo - by, lst.hi - by
        else:  # keep the length the enclosing loop relies on
            self.emit(f"if len({name}) >= {lst.pin + by}:", "    " + code)
            lst.lo = max(lst.pin, lst.lo - by)

    def s_list(self) -> None:
        r, opts = self.r, self.boxes("list", mutable=True)
        if not opts:
            return self.s_assign_t()
        (n, lst), c = r.choice(opts), r.random()
        v, v2 = self.value(lst.elem), self.value(lst.elem)
        if c < 0.5:
            code, k = r.choice([(f"{n}.append({v})", 1), (f"{n}.insert({r.randint(-1, 3)}, {v})", 1),
                                (f"{n}.extend([{v}, {v2}])", 2), (f"{n} += [{v}]", 1),
                                (f"{n}[1:1] = [{v}]", 1),
                                (f"hpush({n}, {v}{r.choice(['', ', 0', ', pos=1'])})", 1)])
            self.emit(code)
            lst.lo, lst.hi = lst.lo + k, min(INF, lst.hi + k)
        elif c < 0.65:
            self.shrink(n, lst, r.choice([f"{n}.pop()", f"{n}.pop(0)", f"del {n}[0]", f"del {n}[-1]"]))
        elif c < 0.7:
            self.shrink(n, lst, f"del {n}[:2]", by=2)
        elif c < 0.8 and lst.lo >= 1:
            self.emit(f"{n}[{r.choice(['0', '-1', str(lst.lo - 1)])}] = {v}")
        elif c < 0.85 and lst.lo >= 2:
            self.emit(f"{n}[0:2] = [{v}, {v2}]")
        else:
            sort = [f"{n}.sort()"] * (lst.elem == "I")
            self.emit(r.choice([f"{n}.reverse()", f"{n}[:] = {n}[::-1]"] + sort))

    def s_dict(self) -> None:
        r, opts = self.r, self.boxes("dict", mutable=True)
        if not opts:
            return self.s_obj()
        (n, d), c = r.choice(opts), r.random()
        key, v = r.choice(KEYS if d.elem == "N" else ["a", "b", "c"]), self.value(d.elem)
        removable = [k for k in d.keys if k not in d.pin]
        if c < 0.65:
            self.emit(r.choice([f'{n}["{key}"] = {v}', f'{n}.update({{"{key}": {v}}})',
                                f'{n}.setdefault("{key}", {v})',
                                f'{n} |= {{"{key}": {v}}}', f"{n}.update({key}={v})"]))
            d.keys += [key] * (key not in d.keys)
        elif removable and c < 0.85 and not self.no_shrink:
            key = r.choice(removable)
            self.emit(r.choice([f'del {n}["{key}"]', f'{n}.pop("{key}")']))
            d.keys.remove(key)
        elif key not in d.pin and key not in d.keys and not self.no_shrink:
            self.emit(f'{n}.pop("{key}", None)')

    def s_obj(self) -> None:
        r, o = self.r, self.env["obj"]
        ops = [(f"obj.a {r.choice('+-')}= {self.iexpr(1)}", None), (f"obj.a = ({self.iexpr(2)}) % 9", None),
               (f"obj.b = {self.texpr((3, 4), 2)[0]}", None), (f"obj.d = {self.iexpr(1)}", True),
               (f"obj.bump({self.iexpr(1)})", None),
               (r.choice([f"Obj.count += {self.iexpr(0)}", "obj.count += 1", "type(obj).count += 1"]), None)]
        ops += [("del obj.d", False)] * (o.has_d is True and not o.pin and not self.no_shrink)
        code, has_d = r.choice(ops)
        self.emit(code)
        o.has_d = o.has_d if has_d is None else has_d

    def s_if(self) -> None:
        """An if on ints (maybe with :=), on isinstance (refining a kind), or on tensor values (a break)."""
        r, cond, refine, ns = self.r, self.cond(), (), self.names("N")
        if self.datadep and r.random() < 0.3:
            self.datadep -= 1
            e = self.texpr((3, 4), 1)[0]
            cond = r.choice([f"float({e}.sum()) > 0", f"{e}.sum().item() > 0.5", f"bool(({e} > 1).any())"])
        elif ns and r.random() < 0.2:
            refine = (r.choice(ns), T34, "I")
            cond = f"isinstance({refine[0]}, torch.Tensor)"
        elif r.random() < 0.1:
            k = self.new("k")
            cond = f"({k} := {self.iexpr(1)}) > {r.randint(0, 3)}"
            self.env[k] = "I"
        pre, outs, has_else = self.env, [], r.random() < 0.5
        for i, line in enumerate([f"if {cond}:", "else:"][:1 + has_else]):
            self.env, memo = self.fork(pre)
            self.env.update({refine[0]: refine[1 + i]} if refine else {})
            self.emit(line)
            self.block(max(1, min(self.budget, self.r.randint(1, 4 - i))))
            outs.append((self.env, memo))
        self.env = self.join(pre, outs + [(pre, None)] * (not has_else))

    def s_live(self) -> None:
        """A list mutated while iterated (bounded by a guard), or after a lazy iterator over it was made."""
        r, opts = self.r, self.boxes("list", mutable=True)
        if not opts:
            return self.s_list()
        (n, lst), e, i, it = r.choice(opts), self.new("e"), self.new("i"), self.new("it")
        v, keep = self.value(lst.elem), max(lst.pin, 1)
        muts = [f"if len({n}) < 6:|{n} += [{v}]", f"if len({n}) < 6:|{n}.insert(0, {v})",
                f"if {n}:|{n}[0] = {v}"]
        mut = r.choice(muts + [f"if len({n}) > {keep}:|{n}.pop()"] * (not self.no_shrink)).split("|")
        mut[1] = "    " + mut[1]
        lst.lo, lst.hi = lst.lo if self.no_shrink else min(lst.lo, keep), INF
        if r.random() < 0.4:
            head, binds = r.choice([(f"for {e} in {n}:", {e: lst.el}),
                                    (f"for {i}, {e} in enumerate({n}):", {i: "I", e: lst.el})])
            return self.loop_body(head, binds, [lst], mut)
        make = r.choice([f"iter({n})", f"(e * 2 for e in {n})", f"map(lambda e: e + 1, {n})",
                         f"enumerate({n})", f"zip({n}, {n}[::-1])"])
        self.emit(f"{it} = {make}")
        if lst.lo >= 1 and make.startswith("iter"):
            self.assign(self.new("n"), lst.el, f"next({it})")
        self.emit(*mut)
        if make.startswith(("enumerate", "zip")):  # tuples: only their count
            self.assign(self.new("k"), "I", f"len(list({it}))")
        else:
            self.assign(self.new("l"), _Box("list", lst.elem), f"list({it})")

    def s_terminal(self) -> None:
        r = self.r
        what = r.choice(["return"] + ["break", "continue"] * bool(self.loop) + ["raise"] * self.allow_raise)
        line = {"return": lambda: f"return {self.ret()}", "raise": lambda: r.choice(
            [f'raise ValueError("bad {self.seed}")', 'raise KeyError("k9")', 'v = table["k9"]',
             "v = items[len(items) + 1]", f"hraise({self.iexpr(1)} + 9)"])}.get(what, lambda: what)()
        self.emit(f"if {self.cond()}:", "    " + line)

    def loop_body(self, head: str, binds: dict, frozen: list = (), first: list = ()) -> None:
        """A loop whose body starts from what holds at every iteration (shrinking is guarded by pins)."""
        pre = self.env
        self.env, memo = self.fork(pre)
        for b in _boxes(self.env):  # the copies are dropped after the join: no need to restore
            b.pin = b.lo if b.kind == "list" else list(b.keys) if b.kind == "dict" else b.has_d is True
            b.hi = b.hi if b.frozen else INF
        for b in frozen:
            memo.get(id(b), b).frozen = True
        self.env.update(binds)
        self.emit(head)
        self.loop += 1
        self.block(max(1, min(self.budget, self.r.randint(1, 5))), lambda: self.emit(*first))
        self.loop -= 1
        self.env = self.join(pre, [(pre, None), (self.env, memo)])
        for b in _boxes(pre):
            b.hi = b.hi if b.frozen else INF

    def s_for(self) -> None:
        r, lists = self.r, self.boxes("list")
        bounded = [(n, k) for n, k in lists if k.hi <= 6 and not k.frozen]
        i, e, g, s = self.new("i"), self.new("e"), self.new("g"), self.new("s")
        (name, k), (n2, k2) = r.choice(lists), r.choice(lists)
        direct = bool(bounded) and r.random() < 0.5
        (name, k), el = r.choice(bounded) if direct else (name, k), k2.el
        d = r.choice([b for n, b in self.boxes("dict") if not b.frozen] or [self.env["table"]])
        dn, tup = [n for n, b in self.env.items() if b is d][0], ", ".join(r.sample(self.names(T34) * 3, 2))
        rng = r.choice([f"range({r.randint(1, 5)})", f"range(1, {r.randint(2, 5)})",
                        f"range({self.iexpr(1)} % 4)", f"range(4, 0, -{r.randint(1, 2)})"])
        gen_i = [f"def {g}(n, step={r.randint(1, 3)}):", "    j = 0", "    while j < n:",
                 f"        yield j * step + {r.choice(self.names('I') + ['1'])}", "        j += 1"]
        gen_n = [f"def {g}(seq):", "    for v in seq:", f"        yield v {r.choice(['* 2', '+ 1'])}"]
        loops = [(25, [], f"for {i} in {rng}:", {i: "I"}, []),
                 (15, [], f"for {e} in {name}:" if direct else f"for {e} in {name}[:{r.randint(1, 4)}]:",
                  {e: k.el}, [k] * direct),
                 (10, [], f"for {i}, {e} in enumerate({name}):" if direct else
                  f"for {i}, {e} in enumerate({name}[:3], {r.randint(0, 2)}):", {i: "I", e: k.el},
                  [k] * direct),
                 (8, [], f"for {i}, {e} in zip({n2}[:4], {name}):", {i: el, e: k.el}, [k]),
                 (5, [], f"for {s}, {e} in {dn}.items():", {s: "S", e: d.elem}, [d]),
                 (5, [], f"for {s} in list({dn}):", {s: "S"}, []),
                 (7, [], f"for {e} in ({tup},):", {e: T34}, []),
                 (10, [], f"for {e} in ({i} {r.choice('*+')} 2 for {i} in {name}[::-1][:3]):", {e: k.el}, []),
                 (7, gen_i, f"for {i} in {g}({r.randint(0, 4)}):", {i: "I"}, []),  # generator functions
                 (8, gen_n, f"for {e} in {g}({name}[:3]):", {e: k.el}, [])]
        _, pre, head, binds, frozen = r.choices(loops, [w for w, *_ in loops])[0]
        self.emit(*pre)
        self.env.update({g: "gen"} if pre is gen_i else {})
        self.loop_body(head, binds, frozen)

    def s_while(self) -> None:
        c, n = self.new("c"), self.r.randint(1, 5)
        self.assign(c, "I", "0")
        self.counters.append(c)
        self.loop_body(f"while {c} < {n}:", {}, first=[f"{c} += 1"])  # first, so `continue` ends too
        self.counters.remove(c)

    def s_try(self) -> None:
        r, pre, exc = self.r, self.env, self.r.choice(EXCS)
        self.emit("try:")
        self.env, m1 = self.fork(pre)
        raiser = {"ValueError": [f'raise ValueError("v{self.n}")', f"hraise({self.iexpr(1)})", 'int("7x")'],
                  "KeyError": ['v = table["k9"]', 'raise KeyError("k8")', '{"a": 1}["b"]'],
                  "IndexError": ["v = items[len(items)]", "[].pop()", "v = obj.c[len(obj.c) + 2]"]}[exc]

        def body() -> None:  # no container shrinks: the handler may start anywhere in it
            for _ in range(r.randint(0, 2)):
                self.stmt()
            self.emit(f"if {self.cond()}:" if r.random() < 0.5 else "if True:", "    " + r.choice(raiser))
            for _ in range(r.randint(0, 1)):
                self.stmt()
        self.no_shrink += 1
        self.block(0, body)
        self.no_shrink -= 1
        body_env = (self.env, m1)
        start = self.join(pre, [(pre, None), body_env])  # what holds wherever the body raised
        if self.allow_raise and r.random() < 0.3:
            caught = r.choice([x for x in EXCS if x != exc])
        else:
            caught = r.choice([exc, f"({exc}, TypeError)", "Exception"] + ["LookupError"] * (exc < "V"))
        s = self.new("s")
        self.emit(f"except {caught} as {s}x:")
        self.env, m2 = self.fork(start)
        self.env[s] = "S"
        self.block(r.randint(0, 2), lambda: self.emit(f"{s} = {r.choice(['type(', 'str('])}{s}x)"))
        self.env = self.join(start, [body_env, (self.env, m2)])
        if r.random() < 0.3:
            self.emit("finally:", "    " + r.choice(["LOG.append(obj.a)", "obj.a += 1", "LOG.append(G)"]))

    def s_new(self) -> None:
        r = self.r
        it, oc, n, keys = self.env["items"], self.env["obj"].c, r.randint(0, 3), ["a", "b"][:r.randint(1, 2)]
        box, code = r.choice([
            (_Box("list", "T", n), "[" + ", ".join(self.texpr((3, 4), 1)[0] for _ in range(n)) + "]"),
            (_Box("list", "T", n), f"[{self.texpr((3, 4), 1)[0]} * j for j in range({n})]"),
            (_Box("list", "I", n), f"[{self.iexpr(0)} * j for j in range({n})]"),
            (_Box("list", "N", it.lo, it.hi), r.choice(["list(items)", "items[:]", "items.copy()"])),
            (_Box("list", "N", n), "[" + ", ".join(self.num() for _ in range(n)) + "]"),
            (_Box("list", "I", oc.lo, oc.hi), r.choice(["sorted(obj.c)", "list(reversed(obj.c))"])),
            (_Box("dict", "I", keys=keys), "{" + ", ".join(f'"{k}": {self.iexpr(1)}' for k in keys) + "}"),
            (_Box("dict", "I", keys=["a", "b", "c"]), f'dict.fromkeys(["a", "b", "c"], {self.iexpr(0)})'),
            (_Box("dict", keys=self.env["table"].keys), r.choice(["dict(table)", "{**table}", "table.copy()",
                                                                 "{k: v for k, v in table.items()}"]))])
        self.assign(self.new(box.kind[0]), box, code)

    def s_misc(self) -> None:
        """A swap, unpacking, a list alias, module state (G, LOG), a print, or a grad-mode `with` block."""
        r, t, c = self.r, self.names(T34), self.r.random()
        (n, lst), a, b = r.choice(self.boxes("list")), r.choice(t), r.choice(t)
        if c < 0.15:
            self.emit(f"{a}, {b} = {b}, {a}")
        elif c < 0.3 and lst.lo >= 2:
            a, b, star = self.new("u"), self.new("l"), r.random() < 0.5
            self.emit(f"{a}, *{b} = {n}" if star else f"{a}, {b} = {n}[0], {n}[1]")
            self.env[a], self.env[b] = lst.el, (_Box("list", lst.elem, lst.lo - 1, lst.hi) if star else
                                                  lst.el)
        elif c < 0.4:
            name, lst = r.choice(self.boxes("list"))
            self.assign(self.new("al"), lst, name)
        elif c < 0.7:
            self.uses_g = self.uses_g or c < 0.55
            self.emit(r.choice([f"G += {self.iexpr(1)}", "G = (G + 1) % 5"]) if c < 0.55 else
                      f"LOG.append({self.iexpr(1)})")
        elif self.prints:
            self.prints -= 1
            self.emit(f'print("p{self.seed}", {self.iexpr(1)}, len(items), {r.choice(t)}.shape)')
        else:
            self.emit(r.choice(["with torch.no_grad():", "with torch.enable_grad():",
                                "with torch.set_grad_enabled(False):"]))
            self.block(max(1, min(self.budget, r.randint(1, 3))))

    def s_closure(self) -> None:
        """A closure over the program's tensors and ints (maybe writing one: nonlocal), or a lambda."""
        r, f, outer = self.r, self.new("f"), self.env
        default = r.choice([str(r.randint(1, 3))] + self.names("I"))  # evaluated once, at the def
        lam, k = r.random() < 0.25, r.choice(self.names("I") or [None])
        self.env, self.in_fn = {n: k for n, k in outer.items() if k in (T34, "I")}, True
        self.env.update({"t" if lam else "v": T34, "s" if lam else "m": "I"})
        if lam:
            self.emit(f"{f} = lambda t, s={default}: {self.texpr((3, 4), 1)[0]} * s + t")
        else:
            self.emit(f"def {f}(v, m={default}, *extra):")
            if k and r.random() < 0.6:
                self.emit(f"    nonlocal {k}", f"    {k} = ({k} + m + len(extra)) % 11")
            e = self.texpr((3, 4), 2)[0]
            self.emit("    " + r.choice([f"return {e} * m + v + sum(extra)", f"return {e} + sum(extra)",
                                         f"return torch.tanh(v - {e}) + sum(extra)"]))
        self.env, self.in_fn = outer, False
        self.env[f] = "lam" if lam else "tfn"

    def ret(self) -> str:
        r = self.r
        out = [r.choice(self.names("T") + self.names("I", "N", "S")) for _ in range(r.randint(1, 4))]
        out += r.sample(["len(items)", "obj.a", "items", "list(table)", "G", 'table.get("k1")', "len(LOG)"],
                        r.randint(0, 2))
        return ", ".join(out) + ("," if len(out) == 1 else "")

    def program(self) -> str:
        r = self.r
        while self.budget > 0:
            self.stmt()
        self.emit(f"return {self.ret()}")
        body = (["    global G"] if self.uses_g else []) + self.lines
        return f'''import torch

G, LOG, SCALE, STEP = 0, [], {r.choice([2, 3, 0.5, -1.5])}, {r.randint(1, 3)}

class Obj:
    count = 0
    twice = property(lambda self: self.a * 2)
    def __init__(self, a, b, c):
        self.a, self.b, self.c = a, b, c
    def scaled(self, t, k=1):
        return t * (self.a + k)
    def bump(self, k):
        self.a = (self.a + k) % 9
        return self.a

def inputs(v=0):
    g = torch.Generator().manual_seed({self.seed} * 10 + v)
    r = lambda: torch.randn(3, 4, generator=g)
    x, y, items, table = r(), r(), [{self.items_src}], {{{self.table_src}}}
    obj = Obj({self.lit(0, 4)}, r(), [{self.lit(0, 5)}, {self.lit(0, 5)}])
    {self.alias}
    return x, y, items, table, obj

def h0(a, b={r.randint(1, 3)}, *rest):
    out = a * b
    for r in rest:
        out = {r.choice(["out + r", "out * r", "out - r"])}
    return {r.choice(["out", "torch.tanh(out)", "out.relu()"])}

def hacc(v, acc=[]):
    acc.append(v)
    return len(acc) % 5

def hkw(t, *, scale=2, **extra):
    return t * scale + len(extra)

def hpush(lst, v, pos=None):
    lst.append(v) if pos is None else lst.insert(pos, v)
    return len(lst)

def hbrk(t, k=1):
    {r.choice(['print("hbrk", k, t.shape)', "s = t.sum().item()", "s = float(t.max())"])}
    return t * k if {r.choice(["float(t.sum()) > 0", "k > 1", "t.sum().item() < 0.5"])} else t - k

def hraise(k, limit={r.randint(2, 5)}):
    if k > limit:
        raise ValueError(f"too big: {{k}}")
    return k + 1

def program(x, y, items, table, obj):
''' + "\n".join(body) + "\n"


def generate(seed: int) -> str:
    """The source of a deterministic random program (with its `inputs(v)`) for `seed`."""
    return _Gen(seed).program()


# ---------------------------------------------------------------------------------------------------------
# The differential check

_KILN_DIR = __file__.rsplit("/testing/", 1)[0]


class _Timeout(BaseException):  # not an Exception: kiln's fallback on internal errors must not catch it
    pass


def load(seed: int, tag: str = "eager") -> dict:
    """Execute the source of `seed` in a fresh namespace (registered with linecache, for tracebacks)."""
    src, filename = generate(seed), f"<pyfuzz {seed} {tag}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), ns := {"__name__": f"pyfuzz_{seed}"})
    return ns


def _run(fn: Any, args: tuple) -> tuple:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            return True, fn(*args), out.getvalue()
        except Exception as e:  # the program's own exception, or kiln's
            return False, e, out.getvalue()


def _diff(a: Any, e: Any, path: str, tol: float) -> str | None:
    """Where `a` differs from `e`: tensors within `tol`, objects by class name and attributes, else `==`."""
    if type(a).__qualname__ != type(e).__qualname__:
        return f"{path}: {type(a).__name__} != eager {type(e).__name__} ({a!r:.40} vs {e!r:.40})"
    if isinstance(e, torch.Tensor):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"{path}: {a.dtype}{list(a.shape)} != eager {e.dtype}{list(e.shape)}"
        worst = (a - e).abs().nan_to_num(float("inf")).max()
        return None if torch.allclose(a, e, tol, tol, equal_nan=True) else f"{path}: differ by {worst:.3g}"
    if hasattr(e, "__dict__") and not callable(e):
        a, e, path = dict(sorted(vars(a).items())), dict(sorted(vars(e).items())), path + " attributes"
    if isinstance(e, (list, tuple, dict)):
        ka, ke = (list(a), list(e)) if isinstance(e, dict) else (len(a), len(e))
        if ka != ke:
            return f"{path}: {ka} != eager {ke} ({a!r:.60} vs {e!r:.60})"
        keys = list(e) if isinstance(e, dict) else range(len(e))
        return next((d for k in keys for d in [_diff(a[k], e[k], f"{path}[{k!r}]", tol)] if d), None)
    return None if a == e else f"{path}: {a!r:.60} != eager {e!r:.60}"


def _aliases(result: Any, args: tuple) -> list:
    """Which outputs are arguments (or their items, attributes, values), or views of argument tensors."""
    x, y, items, table, obj = args
    named = [("x", x), ("y", y), ("items", items), ("table", table), ("obj", obj)]
    named += [(f"obj.{k}", v) for k, v in vars(obj).items()]
    named += [(f"items[{i}]", v) for i, v in enumerate(items)]
    named += [(f"table[{k!r}]", v) for k, v in table.items()]
    ids = {id(v): p for p, v in reversed(named) if not isinstance(v, (int, str))}
    ids.update({v.untyped_storage().data_ptr(): p for p, v in reversed(named) if isinstance(v, torch.Tensor)})
    flat = [(f"result[{i}]", v) for i, v in enumerate(result)] if isinstance(result, tuple) else []
    flat += [(f"{p}[{j}]", w) for p, v in flat if isinstance(v, list) for j, w in enumerate(v)]
    keys = [(p, v.untyped_storage().data_ptr() if isinstance(v, torch.Tensor) and id(v) not in ids else id(v))
            for p, v in flat]
    return [f"{p} is/views {ids[k]}" for p, k in keys if k in ids]


def _compare(eager: tuple, got: tuple, eager_args: tuple, kiln_args: tuple, tol: float) -> str | None:
    (e_ok, e_val, e_out), (k_ok, k_val, k_out) = eager, got
    if not k_ok and (e_ok or type(k_val) is not type(e_val)):
        frames = [f for f in traceback.extract_tb(k_val.__traceback__) if f.filename.startswith(_KILN_DIR)]
        where = f" at {frames[-1].filename[len(_KILN_DIR) - 4:]}:{frames[-1].lineno}" if frames else ""
        return (f"kiln {'crashed' if frames else 'raised'}: {type(k_val).__name__}: "
                f"{(str(k_val).splitlines() or [''])[0]}{where}" +
                ("" if e_ok else f" (eager raised {type(e_val).__name__})"))
    if k_ok != e_ok or not k_ok and str(k_val) != str(e_val):
        return f"kiln returned, eager raised {type(e_val).__name__}: {e_val}" if k_ok else \
            f"exception message {str(k_val)!r:.80} != eager {str(e_val)!r:.80}"
    d = _diff(k_val, e_val, "result", tol) if e_ok else None
    for name, a, e in zip(("x", "y", "items", "table", "obj"), kiln_args, eager_args):
        d = d or _diff(a, e, f"argument {name}", tol)
    if not d and e_ok and _aliases(k_val, kiln_args) != _aliases(e_val, eager_args):
        d = f"output aliasing {_aliases(k_val, kiln_args)} != eager {_aliases(e_val, eager_args)}"
    return d or (f"stdout {k_out!r:.60} != eager {e_out!r:.60}" if k_out != e_out else None)


def check_seed(seed: int, backend: str = "eager", timeout: float = 60.0) -> str | None:
    """Run the program of `seed` by plain Python and by kiln (a call per VARIANTS entry, on fresh arguments):
    None when they agree, else a line describing the first difference, kiln's crash or swallowed error."""
    import kiln
    from kiln.counters import counters
    tol, errors = 1e-5 if backend == "eager" else 1e-4, dict(counters["capture_errors"])
    alarm = timeout and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if alarm:  # a kiln bug could loop forever
        old = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Timeout()))
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eager_ns, kiln_ns = load(seed, "eager"), load(seed, "kiln")
            kiln.reset()
            compiled = kiln.compile(kiln_ns["program"], backend=backend)
            for call, variant in enumerate(VARIANTS):
                eager_args, kiln_args = eager_ns["inputs"](variant), kiln_ns["inputs"](variant)
                eager = _run(eager_ns["program"], eager_args)
                d = _compare(eager, _run(compiled, kiln_args), eager_args, kiln_args, tol)
                d = d or _diff(*[(ns["G"], ns["LOG"], ns["Obj"].count, ns["hacc"].__defaults__[0])
                                 for ns in (kiln_ns, eager_ns)], "state (G, LOG, Obj.count, hacc)", tol)
                new = [k for k, n in counters["capture_errors"].items() if n > errors.get(k, 0)]
                d = d or (f"internal error (ran eagerly): {new[0]}" if new else None)
                if d:
                    return f"call {call}: {d}".replace("\n", " ")[:400]
    except _Timeout:
        return f"timed out after {timeout:.0f} s"
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return None


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln.testing.pyfuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0:200", help="START:STOP (a range) or N (one seed)")
    p.add_argument("--backend", default="eager")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per seed")
    p.add_argument("--show", type=int, help="print the source of this seed and exit")
    ns = p.parse_args(argv)
    if ns.show is not None:
        return print(generate(ns.show), end="") or 0
    start, _, stop = ns.seeds.partition(":")
    seeds = range(int(start), int(stop) if stop else int(start) + 1)
    fails = [print(f"seed {s}: {d}", flush=True) or s for s in seeds
             if (d := check_seed(s, ns.backend, ns.timeout))]
    print(f"{len(fails)} of {len(seeds)} seeds fail (backend={ns.backend})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
