"""Backends as data: a compile context, optimization fuel, and one runner for a declared list of passes.

A backend is `fn(graph, example_inputs, context)`. The `CompileContext` carries what the user asked for
(`kiln.compile(mode=, dynamic=, fullgraph=, options=)`): a backend reads its options there, never from
globals; an option it leaves unset falls back to the process-wide flag of the same name (`config`).

A pipeline is a list of `Pass`es run by `run_pipeline` on one `CompileState` (the artifacts so far: the
graph, the prim graph, the loop IR, the schedule, the plan, the source...). The runner times every pass
(`KILN_LOGS=passes`), runs the pass's verifier after it when `KILN_VERIFY=1` (a failure names the pass),
and, with a debug dir, keeps the IR each pass produced, printed by the pass's printer and headed by the
pass's name and time. Every optimizing decision (a fusion, a rewrite, an in-place write) spends one unit of
`FUEL`; with `KILN_FUEL=n` decision n+1 and later are refused, so a wrong result can be bisected to the
first decision that changes it, which the `+passes` log names.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import time
import warnings
from typing import Any, Callable, Sequence

from .. import config

log = config.channel("passes")

# reduce-overhead: the cpp backend's runs (kiln.codegen.cpp_native: one C++ entry per run of kernels and
# float32 products, intermediates in a kept arena) are its CPU form, always on; no CUDA graphs elsewhere
MODES = {None: "supported", "default": "supported", "reduce-overhead": "cpp",
         "max-autotune": "triton", "max-autotune-no-cudagraphs": "triton"}
_WARNED: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


@dataclasses.dataclass
class CompileContext:
    """What one `kiln.compile` asked for; handed to the backend with each graph."""

    raise_on_error: bool = False
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # per-compile values of config flags

    @classmethod
    def from_compile(cls, *, mode: str | None = None, dynamic: bool | None = None, fullgraph: bool = False,
                     options: dict | None = None, backend: Any = None) -> "CompileContext":
        """Check kiln.compile's arguments: unknown values raise, known but unsupported ones warn once."""
        options = dict(options or {})
        raise_on_error = bool(options.pop("raise_on_error", False))
        unknown = [k for k in options if k not in config.flag_names()]
        if unknown:
            raise ValueError(f"kiln.compile: unknown option(s) {', '.join(map(repr, unknown))}; options are "
                             f"'raise_on_error' and the flags {', '.join(config.flag_names())}")
        if mode not in MODES:
            raise ValueError(f"kiln.compile: unknown mode {mode!r}; modes: "
                             f"{', '.join(repr(m) for m in MODES if m)}")
        if MODES[mode] == "triton":
            if backend != "triton":
                warn_once(f"mode:{mode}:{backend}", f"kiln.compile(mode={mode!r}) autotunes only the triton "
                          "backend's kernels (`auto` picks it for CUDA tensors); other backends compile with the "
                          "default mode")
        elif MODES[mode] == "cpp":
            if backend not in ("cpp", "auto"):
                warn_once(f"mode:{mode}:{backend}", f"kiln.compile(mode={mode!r}): the cpp backend's runs (one "
                          "C++ entry per run of kernels and float32 products, always on) are its only form; "
                          f"{'the ' + repr(backend) if backend else 'this'} backend compiles with the default mode")
        elif MODES[mode] != "supported":
            warn_once(f"mode:{mode}", f"kiln.compile(mode={mode!r}) is not supported yet: compiling with the "
                      "default mode")
        if dynamic not in (None, False, True):
            raise ValueError(f"kiln.compile: dynamic must be None, True or False, got {dynamic!r}")
        return cls(raise_on_error, mode, dynamic, fullgraph, options)

    def key(self) -> tuple:
        """A hashable summary (equal contexts compile alike)."""
        options = tuple(sorted(self.options.items()))
        return (self.raise_on_error, self.mode, self.dynamic, self.fullgraph, options)

    def flag(self, name: str) -> Any:
        """This compile's value of a config flag: its option when given, else the process-wide flag."""
        if name in self.options:
            return self.options[name]
        return config.get(name)

    @property
    def raises(self) -> bool:
        """An internal compile error is raised, not turned into a warning and an eager fallback."""
        return self.raise_on_error or self.fullgraph or bool(config.get("raise_on_error"))


class Fuel:
    """Optimization fuel: `take(pass, decision)` allows a decision while the `fuel` flag's budget lasts."""

    def __init__(self) -> None:
        self.used = 0
        self.last: tuple[int, str, str] | None = None
        self.refused = 0

    def take(self, pass_name: str, decision: Callable[[], str] | str) -> bool:
        limit = config.get("fuel")
        if limit is None or limit < 0:
            return True
        if self.used >= limit:
            if self.refused == 0:
                what = decision() if callable(decision) else decision
                log.info("fuel: out after %d decisions; first refused: %s (pass %s)", self.used, what,
                         pass_name)
            self.refused += 1
            return False
        self.used += 1
        what = decision() if callable(decision) else decision
        self.last = (self.used, pass_name, what)
        log.debug("fuel: decision %d: %s (pass %s)", self.used, what, pass_name)
        return True

    def reset(self) -> None:
        self.used, self.last, self.refused = 0, None, 0


FUEL = Fuel()


class PassVerifyError(AssertionError):
    pass


@dataclasses.dataclass(frozen=True)
class Pass:
    """One step of a pipeline: `run(state, context)` updates the state's artifacts in place."""

    name: str
    run: Callable[[Any, CompileContext], None]
    printer: Callable[[Any], str] | None = None  # the IR after this pass, as runnable Python
    verifier: Callable[[Any], None] | None = None  # raises when the IR after this pass is malformed


@dataclasses.dataclass
class PassRecord:
    name: str
    ms: float
    dump: str | None = None


class CompileState:
    """The artifacts of one graph's compilation; each pass reads some and sets others."""

    def __init__(self, graph: Any, example_inputs: list, target: Any = None):
        self.graph = graph
        self.example_inputs = example_inputs
        self.target = target
        self.records: list[PassRecord] = []

    def __repr__(self) -> str:
        return f"CompileState({', '.join(k for k in vars(self) if k != 'records')})"


def without_cyclic_gc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run with Python's cyclic garbage collector paused (reference counting still frees).

    A compile allocates hundreds of thousands of short-lived objects (nodes, sympy expressions), which
    start full collections over everything the process holds; with torch, sympy and a model loaded each
    takes ~0.1 s, and they were a third to half of a warm compile. What one compile leaves in cycles is
    collected once the collector runs again. Nested calls leave it to the outermost."""
    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Any:
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return paused


# called as observer(pipeline name, state, context) after every pipeline run (the compile report,
# kiln.tracing, keeps a summary of each)
OBSERVERS: list[Callable[[str, CompileState, CompileContext], None]] = []


@without_cyclic_gc
def run_pipeline(name: str, passes: Sequence[Pass], state: CompileState, context: CompileContext,
                 dump: bool = False) -> CompileState:
    """Run the passes in order on `state`; time, verify and (with `dump`) print the IR after each."""
    verify = bool(context.flag("verify"))
    for p in passes:
        start = time.perf_counter()
        p.run(state, context)
        ms = (time.perf_counter() - start) * 1e3
        if verify and p.verifier is not None:
            try:
                p.verifier(state)
            except Exception as e:
                raise PassVerifyError(f"{name}: the IR after pass {p.name} is malformed: {e}") from e
        record = PassRecord(p.name, ms)
        if dump and p.printer is not None:
            record.dump = f"# {name}: after pass {p.name} ({ms:.1f} ms)\n{p.printer(state)}"
        state.records.append(record)
        log.debug("%s: pass %s %.2f ms", name, p.name, ms)
    if log.isEnabledFor(20):
        total = sum(r.ms for r in state.records)
        log.info("%s: %s (%.1f ms)", name, ", ".join(f"{r.name} {r.ms:.1f}" for r in state.records), total)
    for observe in OBSERVERS:
        observe(name, state, context)
    return state
