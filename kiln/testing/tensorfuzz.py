"""Random small tensor programs, run eagerly and by every backend, compared value by value.

`generate(seed)` builds a deterministic straight-line program `program(a0, a1, ...)` and `inputs(variant)`:
pointwise ops (unary, binary, comparisons, where, clamp, casts), reductions (sum, mean, amax, argmax, var,
... over random dims, keepdim), views (transpose, permute, stepped slices, reshape/view, expand,
unsqueeze/squeeze), broadcasts, indexing (getitem with ints, slices, None, bool masks and index tensors;
index_select, gather) and in-place updates (add_, mul_, copy_, masked_fill_, setitem) of inputs, of
intermediates and of views of intermediates; dtypes float32, float64, float16, bfloat16, int64 and bool;
inputs contiguous, transposed, sliced (with an offset or a step), expanded, some with a zero-size dim.
Each statement is kept only if eager runs it on the inputs (so dtype support is eager's own); about one
program in twenty ends in a statement eager rejects, to compare the exceptions.

Values that compare or round (>, floor, argmax, casts to int) are only drawn on *exact* values — computed
without a rounding step a compiled kernel may legitimately take elsewhere (a reassociated sum, an fma, a
low-precision intermediate kept in float32) — so any difference there is a bug.

`check_seed(seed, backends)` runs the program eagerly and through `kiln.compile(program, backend=B)` for
each backend (two calls: new values, same layouts), and compares outputs and the inputs afterwards: equal
dtypes and shapes; integers and bools equal; floats allclose at torch.testing.assert_close's defaults for
their dtype, or else within the accuracy rule (kiln.testing.tolerance) against the program run in float64;
and exceptions of the same type. It returns one line per difference.

    python -m kiln.testing.tensorfuzz --seeds 0:5000 --backends cpp    # failing seeds and a count
    python -m kiln.testing.tensorfuzz --show 17                        # the source of seed 17
"""
from __future__ import annotations

import argparse
import dataclasses
import linecache
import random
import sys
import warnings
from typing import Any, Callable

import torch

from .. import api, config
from .tolerance import OP_TOL, accuracy_rule

BACKENDS = ("eager", "prims", "cpp")
F16, BF16, F32, F64, I64, B8 = torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64, \
    torch.bool
DTYPE_NAMES = {F16: "F16", BF16: "BF16", F32: "F32", F64: "F64", I64: "I64", B8: "B8"}
_INPUT_DTYPES = [F32] * 7 + [F64] * 2 + [F16] * 3 + [BF16] * 3 + [I64] * 3 + [B8] * 2
_SIZES = [1, 1, 2, 2, 3, 3, 4, 5, 7, 8]
HEADER = ("import torch\n"
          "F16, BF16, F32, F64, I64, B8 = torch.float16, torch.bfloat16, torch.float32, torch.float64, "
          "torch.int64, torch.bool\n")
MAX_ELEMENTS = 1 << 16


@dataclasses.dataclass
class Value:
    """A tensor the program has bound to `name`; `exact`: computed without a rounding kiln may move."""
    name: str
    tensor: torch.Tensor
    exact: bool

    @property
    def is_float(self) -> bool:
        return self.tensor.dtype.is_floating_point


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Generator:
    """Builds one program, statement by statement, running each on the inputs of variant 0."""

    def __init__(self, seed: int, steps: int | None = None):
        self.seed = seed
        self.r = random.Random(seed)
        self.env: dict[str, Any] = {"torch": torch, **{n: d for d, n in DTYPE_NAMES.items()}}
        self.input_lines: list[str] = []
        self.body: list[str] = []
        self.values: list[Value] = []
        self.params: list[str] = []
        self.bad_tail = self.r.random() < 0.05
        self.ends_in_error = False  # the last statement is one eager rejects (bad_tail drew one)
        self._make_inputs()
        self._make_body(steps if steps is not None else self.r.randint(3, 10))

    # ---- inputs
    def _shape(self, like: tuple | None) -> tuple:
        r = self.r
        if like is not None and r.random() < 0.7:  # broadcastable to the first input: drop or 1 some dims
            shape = list(like[r.randint(0, len(like)):]) if r.random() < 0.4 else list(like)
            return tuple(1 if r.random() < 0.3 else s for s in shape)
        shape = tuple(r.choice(_SIZES) for _ in range(r.choice([0, 1, 1, 2, 2, 2, 3, 3, 4])))
        if shape and r.random() < 0.06:
            d = r.randrange(len(shape))
            shape = shape[:d] + (0,) + shape[d + 1:]
        if shape and r.random() < 0.05:
            shape = shape[:-1] + (r.choice([17, 33, 64]),)
        return shape

    def _input_lines(self, name: str, shape: tuple, dtype: torch.dtype) -> list[str]:
        r = self.r
        n = len(shape)
        base, suffix = list(shape), ""
        layout = r.random()
        if n >= 2 and layout < 0.2:  # transposed
            base = list(reversed(shape))
            suffix = f".permute({', '.join(str(i) for i in reversed(range(n)))})"
        elif n and layout < 0.32:  # a slice: storage offset
            d = r.randrange(n)
            base[d] += 2
            suffix = "[" + ", ".join(":" if i != d else "2:" for i in range(d + 1)) + "]"
        elif n and layout < 0.42:  # every other element
            d = r.randrange(n)
            base[d] = 2 * shape[d]
            suffix = "[" + ", ".join(":" if i != d else "::2" for i in range(d + 1)) + "]"
        elif n and layout < 0.48 and any(s > 1 for s in shape):  # expanded from a size-1 dim (stride 0)
            d = r.choice([i for i, s in enumerate(shape) if s > 1])
            base[d] = 1
            suffix = f".expand({tuple(shape)})"
        size = tuple(base)
        if dtype.is_floating_point:
            make = f"torch.randn({size}, generator=g)"
            if r.random() < 0.15:
                make += ".mul(2).round()"  # ties for max/argmax/sort, small exact integers
            make += f".to({DTYPE_NAMES[dtype]})"
        elif dtype == B8:
            make = f"(torch.randn({size}, generator=g) > 0)"
        else:
            make = f"torch.randint(-5, 6, {size}, generator=g, dtype=I64)"
        lines = [f"{name} = {make}"]
        if dtype.is_floating_point and r.random() < 0.08:
            special = r.choice(["float('nan')", "float('inf')", "-float('inf')"])
            lines.append(f"{name}[torch.rand({size}, generator=g) < 0.2] = {special}")
        if suffix:
            lines.append(f"{name} = {name}{suffix}")
        return lines

    def _make_inputs(self) -> None:
        self.input_lines.append(f"g = torch.Generator().manual_seed({self.seed} * 1000 + variant)")
        self.env["variant"] = 0
        exec(self.input_lines[0], self.env)
        first = None
        for i in range(self.r.choice([1, 2, 2, 3])):
            name = f"a{i}"
            shape = self._shape(first)
            first = shape if first is None else first
            for line in self._input_lines(name, shape, self.r.choice(_INPUT_DTYPES)):
                self.input_lines.append(line)
                exec(line, self.env)
            self.params.append(name)
            self.values.append(Value(name, self.env[name], True))

    # ---- candidates
    def _pick(self, pred: Callable[[Value], bool] = lambda v: True) -> Value | None:
        found = [v for v in self.values if pred(v)]
        return self.r.choice(found) if found else None

    def _dim(self, t: torch.Tensor) -> int:
        return self.r.randrange(-t.ndim, t.ndim) if t.ndim else 0

    def _partner(self, v: Value) -> Value | None:
        def fits(u: Value) -> bool:
            try:
                torch.broadcast_shapes(u.tensor.shape, v.tensor.shape)
                return u is not v
            except RuntimeError:
                return False
        return self._pick(fits)

    def _index_literal(self, size: int, count: int) -> str:
        if size == 0:
            return "torch.tensor([], dtype=I64)"
        return f"torch.tensor({[self.r.randrange(-size, size) for _ in range(count)]})"

    def _subscript(self, t: torch.Tensor) -> str | None:
        """A basic index: ints, slices (with steps), None and an Ellipsis over t's dims."""
        r = self.r
        parts: list[str] = []
        dim = 0
        while dim < t.ndim and (not parts or r.random() < 0.6):
            size = t.shape[dim]
            kind = r.random()
            if kind < 0.15:
                parts.append("None")
                continue
            if kind < 0.4 and size > 0:
                parts.append(str(r.randrange(-size, size)))
            elif kind < 0.5:
                parts.append(":")
            else:
                start = r.choice(["", str(r.randint(0, max(size - 1, 0))), "-1"])
                stop = r.choice(["", "", str(r.randint(0, size))])
                step = r.choice(["", "", ":2", ":3"])
                parts.append(f"{start}:{stop}{step}")
            dim += 1
        if dim < t.ndim and r.random() < 0.3:
            parts.append("...")
            if r.random() < 0.5:
                parts.append("None")
        return ", ".join(parts) if parts else None

    def _view(self, v: Value) -> str:
        """An expression that is a view of v's tensor."""
        r, t, x = self.r, v.tensor, v.name
        n = t.ndim
        options = [f"{x}.unsqueeze({r.randint(-n - 1, n)})", f"{x}.reshape(-1)", f"{x}.view(-1)"]
        if n:
            sub = self._subscript(t)
            if sub is not None:
                options += [f"{x}[{sub}]"] * 3
            options += [f"{x}.squeeze()", f"{x}.squeeze({self._dim(t)})",
                        f"{x}.narrow({self._dim(t)}, 0, 1)" if min(t.shape) > 0 else f"{x}.flatten()"]
        if n >= 2:
            a, b = r.sample(range(n), 2)
            perm = list(range(n))
            r.shuffle(perm)
            options += [f"{x}.transpose({a}, {b})", f"{x}.permute({', '.join(map(str, perm))})", f"{x}.mT",
                        f"{x}.reshape({t.shape[0]}, -1)", f"{x}.view({t.shape[0]}, -1)", f"{x}.flatten(1)",
                        f"{x}.diagonal()"]
        if n and t.shape[-1] % 2 == 0 and t.shape[-1]:
            options.append(f"{x}.unflatten(-1, (2, {t.shape[-1] // 2}))")
        if any(s == 1 for s in t.shape):
            shape = tuple(r.choice([2, 3]) if s == 1 else s for s in t.shape)
            options.append(f"{x}.expand({shape})")
        options.append(f"{x}.expand({r.choice([2, 3])}, *{x}.shape)")
        return r.choice(options)

    def _value_candidates(self, v: Value) -> list[tuple[str, bool]]:
        """(expression, exact) pairs around value v."""
        r, t, x, ex = self.r, v.tensor, v.name, v.exact
        n, fl = t.ndim, v.is_float
        out: list[tuple[str, bool]] = []
        # pointwise, unary
        if t.dtype == B8:
            out += [(f"~{x}", ex), (f"{x}.logical_not()", ex), (f"{x}.to(I64) * 3", ex)]
        else:
            out += [(f"-{x}", ex), (f"{x}.abs()", ex), (f"{x}.clamp(-2, 3)", ex), (f"torch.relu({x})", ex),
                    (f"{x}.clamp(min=0)", ex)]
            if ex:
                out.append((f"torch.sign({x})", True))
        if fl:
            for op in r.sample(["torch.exp({}.clamp(-8, 8))", "torch.tanh({})", "torch.sigmoid({})",
                                "torch.sin({})", "torch.log({}.abs() + 0.5)", "torch.sqrt({}.abs())",
                                "torch.rsqrt({}.abs() + 0.5)", "torch.erf({})", "1 / ({}.abs() + 1)"], 3):
                out.append((op.format(x), False))
            out += [(f"{x} * 0.75", False), (f"{x} + 0.25", False), (f"{x} / 3", False),
                    (f"{x} * {x}", False),
                    (f"torch.nan_to_num({x}, nan=0.5, posinf=2.0, neginf=-2.0)", ex)]
            if ex:
                out += [(f"{x}.floor()", True), (f"{x}.round()", True), (f"{x}.trunc()", True),
                        (f"{x}.ceil()", True), (f"({x} > 0.5)", True), (f"({x} <= 0)", True),
                        (f"{x}.isnan()", True), (f"torch.where({x} > 0, {x}, -1.5)", True),
                        (f"torch.nan_to_num({x}).clamp(-100, 100).to(I64)", True)]
        elif t.dtype == I64:
            out += [(f"{x} * 3 + 1", True), (f"{x} // 3", True), (f"{x} % 4", True), (f"{x} > 0", True),
                    (f"{x} == 2", True), (f"torch.where({x} > 0, {x}, -{x})", True)]
        # casts (an inexact float only to floats: a cast to int or bool rounds, or compares with 0)
        names = [DTYPE_NAMES[d] for d in DTYPE_NAMES if ex or not fl or d.is_floating_point]
        for name in r.sample(names, 2):
            out.append((f"{x}.to({name})", ex))
        # binary, with a partner that broadcasts
        w = self._partner(v)
        if w is not None:
            y, both = w.name, ex and w.exact
            ints = both and not (fl or w.is_float)
            out += [(f"{x} + {y}", ints), (f"{x} - {y}", ints), (f"{x} * {y}", ints),
                    (f"torch.maximum({x}, {y})", both),
                    (f"torch.minimum({x}, {y})", both), (f"{x} / ({y}.abs() + 1)", False)]
            if both:
                out += [(f"({x} > {y})", True), (f"({x} == {y})", True), (f"({x} != {y})", True),
                        (f"torch.where({x} >= {y}, {x}, {y})", True), (f"{x}.clamp(min={y})", True)]
            if w.tensor.dtype == B8 and w.exact:
                out.append((f"torch.where({y}, {x}, 0)", ex))
                out.append((f"torch.where({y}, {x}, {x}.flip(0))" if n else f"torch.where({y}, {x}, 1)", ex))
        out.append((f"{x} + torch.tensor(1.5)", ex and not fl))
        out.append((f"{x} * torch.tensor(2)", ex and not fl))
        # reductions
        if n:
            d, kd = self._dim(t), r.choice([False, True])
            d2 = self._dim(t)
            exact_sum = ex and not fl
            out += [(f"{x}.sum({d}, keepdim={kd})", exact_sum), (f"{x}.sum()", exact_sum),
                    (f"{x}.sum(({d}, {d2}))", exact_sum), (f"{x}.mean({d}, keepdim={kd})", False),
                    (f"{x}.amax({d}, keepdim={kd})", ex), (f"{x}.amin({d})", ex), (f"{x}.amax()", ex),
                    (f"{x}.max({d})[0]", ex), (f"{x}.var({d}, keepdim={kd})", False),
                    (f"{x}.var({d}, correction=0)", False), (f"{x}.std()", False),
                    (f"{x}.any({d})", ex), (f"{x}.all()", ex), (f"{x}.sum({d}, dtype=F64)", exact_sum)]
            if fl or t.shape[d] <= 6:  # (an integer product of a long dim overflows)
                out.append((f"{x}.prod({d})", exact_sum))
            if ex:
                out += [(f"{x}.argmax({d}, keepdim={kd})", True), (f"{x}.argmin()", True),
                        (f"{x}.max({d}).indices", True), (f"{x}.argmax()", True)]
        # views and copies of views
        view = self._view(v)
        out += [(view, ex)] * 3 + [(f"{view}.contiguous()", ex), (f"({view}) * 2", ex and not fl)]
        # indexing
        if n and t.shape[0] > 0:
            d = self._dim(t)
            size = t.shape[d]
            if size:
                out += [(f"{x}[{self._index_literal(t.shape[0], r.choice([1, 2, 4]))}]", ex),
                        (f"{x}.index_select({d}, {self._index_literal(size, r.choice([1, 3]))}.abs())", ex),
                        (f"{x}[..., {self._index_literal(t.shape[-1], 2)}]", ex)]
                shape = [s if i != d % n else r.randint(1, 3) for i, s in enumerate(t.shape)]
                count = 1
                for s in shape:
                    count *= s
                if count <= 64:
                    idx = [r.randrange(size) for _ in range(count)]
                    out.append((f"{x}.gather({d}, torch.tensor({idx}).reshape({tuple(shape)}))", ex))
            if n >= 2 and t.shape[1] > 0:
                rows, cols = self._index_literal(t.shape[0], 2), self._index_literal(t.shape[1], 2)
                out.append((f"{x}[{rows}, {cols}]", ex))
            if ex and t.dtype != B8:
                out.append((f"{x}[{x} > 0]", True))
            m = self._pick(lambda u: u.tensor.dtype == B8 and u.exact and u.tensor.shape == t.shape)
            if m is not None:
                out.append((f"{x}[{m.name}]", ex))
        return out

    def _update_candidates(self, v: Value) -> list[tuple[str, bool]]:
        """(statement, exact) in-place updates of v or of a view of it."""
        r, t = self.r, v.tensor
        target = v.name if r.random() < 0.6 else self._view(v)
        ex = v.exact
        out = [(f"{target}.add_(1)", ex and not v.is_float), (f"{target}.mul_(2)", ex),
               (f"{target}.zero_()", True), (f"{target}.fill_(3)", True)]
        w = self._partner(v)
        if w is not None:
            out += [(f"{target}.add_({w.name})", ex and w.exact and not (v.is_float or w.is_float)),
                    (f"{target}.copy_({w.name})", w.exact), (f"{target}.mul_({w.name})", False)]
        m = self._pick(lambda u: u.tensor.dtype == B8 and u.exact)
        if m is not None:
            out.append((f"{target}.masked_fill_({m.name}, -1)", ex))
        if ex and t.dtype != B8:
            out.append((f"{target}.masked_fill_({target} > 0, 0.5)", True))
        if t.ndim:
            sub = self._subscript(t)
            if sub is not None:
                out.append((f"{v.name}[{sub}] = 7", ex))
                if w is not None:
                    out.append((f"{v.name}[{sub}] = {w.name}.sum()", ex and w.exact and not w.is_float))
        return out

    # ---- the body
    def _try(self, statement: str) -> BaseException | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                exec(statement, self.env)
            except Exception as e:
                return e
        return None

    def _make_body(self, steps: int) -> None:
        made = tries = 0
        while made < steps and tries < 30 * steps:
            tries += 1
            v = self.r.choice(self.values)
            update = self.r.random() < 0.25
            cands = self._update_candidates(v) if update else self._value_candidates(v)
            text, exact = self.r.choice(cands)
            saved = {u.name: u.tensor.clone() for u in self.values}
            name = f"v{len(self.values)}"
            statement = text if update else f"{name} = {text}"
            error = self._try(statement)
            if error is not None:
                self._restore(saved)
                if self.bad_tail and made >= 2 and isinstance(error, (RuntimeError, IndexError, TypeError)):
                    self.body.append(statement)  # eager raises here: so must kiln
                    self.ends_in_error = True
                    return
                continue
            if update:
                self._after_update(v, exact)
                self.body.append(statement)
            else:
                value = self.env[name]
                if not isinstance(value, torch.Tensor) or value.numel() > MAX_ELEMENTS:
                    continue
                self.body.append(statement)
                self.values.append(Value(name, value, exact))
            made += 1
        self.bad_tail = False

    def _after_update(self, v: Value, exact: bool) -> None:
        """An update reaches every value sharing v's memory; an inexact one makes them all inexact."""
        if exact:
            return
        ptr = _storage(v.tensor)
        for u in self.values:
            if _storage(u.tensor) == ptr and u.tensor.dtype.is_floating_point:
                u.exact = False

    def _restore(self, saved: dict) -> None:
        for u in self.values:
            try:
                u.tensor.copy_(saved[u.name])
            except RuntimeError:  # an expanded tensor: the failed update could not have written it either
                pass

    def outputs(self) -> list[str]:
        computed = [v.name for v in self.values if v.name not in self.params]
        if not computed:
            return self.params[:1]
        picks = {computed[-1]}
        for _ in range(self.r.randint(0, 2)):
            picks.add(self.r.choice(computed + self.params))
        return sorted(picks, key=lambda s: (s[0], int(s[1:])))

    def source(self) -> str:
        lines = [HEADER, "", "def inputs(variant=0):"] + [f"    {line}" for line in self.input_lines]
        lines += [f"    return [{', '.join(self.params)}]", "", "", f"def program({', '.join(self.params)}):"]
        lines += [f"    {line}" for line in self.body]
        lines.append(f"    return {', '.join(self.outputs())},")
        return "\n".join(lines) + "\n"


def generate(seed: int) -> str:
    """The source of random program `seed` (it defines `inputs(variant=0)` and `program(...)`)."""
    return Generator(seed).source()


def load(source: str, seed: int, float_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Execute a program's source; with `float_dtype`, every floating dtype name means that dtype (the
    float64 reference of the accuracy rule)."""
    filename = f"<kiln tensorfuzz {seed}{'' if float_dtype is None else ' reference'}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    env: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), env)
    if float_dtype is not None:
        env.update(F16=float_dtype, BF16=float_dtype, F32=float_dtype, F64=float_dtype)
    return env


# ---- running and comparing

def clone_inputs(values: list) -> list:
    """Copies keeping each tensor's strides and offset, and tensors that shared a storage sharing one."""
    storages: dict[int, Any] = {}

    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        key = _storage(t)
        if key not in storages:
            storages[key] = t.untyped_storage().clone()
        return torch.empty(0, dtype=t.dtype).set_(storages[key], t.storage_offset(), t.shape, t.stride())
    return [copy(v) for v in values]


def _run(fn: Callable[..., Any], args: list) -> tuple[Any, BaseException | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn(*args), None
        except Exception as e:
            return None, e


def _upcast(values: list, dtype: torch.dtype) -> list:
    """Copies (never the tensors themselves: the reference run updates its inputs), floats in `dtype`."""
    return [v.to(dtype, copy=True) if isinstance(v, torch.Tensor) and v.dtype.is_floating_point else
            (v.clone() if isinstance(v, torch.Tensor) else v) for v in values]


def compare(actual: Any, expected: Any, reference: Any, what: str) -> list[str]:
    """Differences between kiln's `actual` and eager's `expected` (`reference`: the float64 run)."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return [f"{what}: {type(actual).__name__} of {len(actual) if hasattr(actual, '__len__') else '?'}"
                    f" items, eager {len(expected)}"]
        refs = reference if isinstance(reference, (tuple, list)) and len(reference) == len(expected) \
            else [None] * len(expected)
        return [d for i, (a, e, r) in enumerate(zip(actual, expected, refs))
                for d in compare(a, e, r, f"{what}[{i}]")]
    if not isinstance(expected, torch.Tensor):
        return [] if actual == expected else [f"{what}: {actual!r}, eager {expected!r}"]
    if not isinstance(actual, torch.Tensor):
        return [f"{what}: a {type(actual).__name__}, eager a tensor"]
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return [f"{what}: {actual.dtype}{list(actual.shape)}, eager {expected.dtype}{list(expected.shape)}"]
    if not expected.dtype.is_floating_point:
        if torch.equal(actual, expected):
            return []
        bad = (actual != expected).nonzero()[:3].tolist()
        return [f"{what}: {expected.dtype} values differ at {bad}"]
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
        return []
    except AssertionError as e:
        first = str(e).strip().splitlines()
    if not isinstance(reference, torch.Tensor) or reference.shape != expected.shape:
        return [f"{what}: {' '.join(first[:3])} (no float64 reference)"]
    verdict = accuracy_rule(actual, expected, reference, tol=OP_TOL, allclose_to="fp64")
    if verdict.passed:
        return []
    return [f"{what}: {verdict.reason}; {' '.join(first[:3])}"]


def _error_text(error: BaseException | None) -> str:
    """The exception's type and first line, and a compiler's first `error:` line (a BuildError)."""
    if error is None:
        return "nothing"
    lines = str(error).splitlines() or [""]
    text = f"{type(error).__name__}: {lines[0][:200]}"
    detail = next((line.strip() for line in lines[1:] if "error:" in line), None)
    return text + (f" ... {detail[:200]}" if detail else "")


def check_seed(seed: int, backends: tuple[str, ...] = BACKENDS, calls: int = 2,
               dynamic: bool | None = None) -> list[str]:
    """Differences between eager and each backend on program `seed`, one line each (empty: it agrees).
    Internal errors raise (raise_on_error), so none hides behind an eager fallback. `dynamic=True`
    captures every input dim as a symbolic size (and compiles each size on its first call)."""
    source = generate(seed)
    env = load(source, seed)
    ref_env = load(source, seed, torch.float64)
    problems: list[str] = []
    compiled = {b: api.compile(env["program"], backend=b, dynamic=dynamic) for b in backends}
    for variant in range(calls):
        inputs = env["inputs"](variant)
        eager_args = clone_inputs(inputs)
        expected, eager_error = _run(env["program"], eager_args)
        ref_args = _upcast(inputs, torch.float64)
        reference, _ = _run(ref_env["program"], ref_args)
        for backend in backends:
            args = clone_inputs(inputs)
            with config.patch(raise_on_error=True, dynamic_compile_after=1):  # no error hides behind eager
                actual, error = _run(compiled[backend], args)
            tag = f"{backend} call {variant}"
            if eager_error is not None or error is not None:
                if type(error) is not type(eager_error):
                    problems.append(f"{tag}: raises {_error_text(error)}; eager {_error_text(eager_error)}")
                    continue
            else:
                problems += compare(actual, expected, reference, f"{tag}: output")
            problems += compare(args, eager_args, ref_args, f"{tag}: input after the call")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.tensorfuzz",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0:100", help="START:STOP")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--show", type=int, help="print the program of one seed")
    parser.add_argument("--dynamic", action="store_true", help="compile with dynamic=True (symbolic sizes)")
    args = parser.parse_args(argv)
    if args.show is not None:
        print(generate(args.show))
        return 0
    start, stop = (int(p) for p in args.seeds.split(":"))
    backends = tuple(b for b in args.backends.split(",") if b)
    failing = 0
    for seed in range(start, stop):
        try:
            problems = check_seed(seed, backends, dynamic=True if args.dynamic else None)
        except Exception as e:  # the harness itself: report it as the seed's failure
            problems = [f"harness: {type(e).__name__}: {e}"]
        if problems:
            failing += 1
            print(f"seed {seed}: " + "\n    ".join(problems[:6]), flush=True)
    print(f"{failing} of {stop - start} seeds differ from eager ({', '.join(backends)})")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
