"""The one flag registry of kiln, and its log channels.

Every tunable lives here as a typed `Flag`. Each flag can be overridden from the environment as
`KILN_<NAME>` (upper case); nothing else in kiln reads `os.environ`. Code reads a flag with
`config.get("name")` or the attribute form `config.flags.name`, and tests change one for a block with
`with config.patch(name=value): ...`.

Log channels: `log = channel("fusion")` gives a `logging.Logger` named `kiln.fusion` that prints to
stderr when `KILN_LOGS=fusion` (comma separated; `all` switches every channel on), as torch's TORCH_LOGS:
a channel's `log.info` prints with `fusion`, its `log.debug` too with `+fusion`, its warnings always
unless `-fusion`. `KILN_LOGS=help` lists the channels (`CHANNELS`, `VERBOSE`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import platform
import sys
import textwrap
from typing import Any, Callable, Iterator


@dataclasses.dataclass(slots=True)
class Flag:
    name: str
    default: Any
    type: Callable[[str], Any]
    doc: str
    value: Any = None


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0/true/false), got {text!r}")


def _parse_optional_str(text: str) -> str | None:
    return text or None


def one_of(*choices: str) -> Callable[[str], str]:
    """A flag's parser that accepts one of `choices` (any case)."""
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected {', '.join(choices[:-1])} or {choices[-1]}, got {text!r}")
        return value
    return parse


_FLAGS: dict[str, Flag] = {}


def define(name: str, default: Any, doc: str, type: Callable[[str], Any] | None = None) -> Flag:
    """Register a flag. Its environment override is `KILN_<NAME>`."""
    if name in _FLAGS:
        raise ValueError(f"flag {name!r} is defined twice")
    if type is None:
        type = _parse_bool if isinstance(default, bool) else (builtin_type(default))
    flag = Flag(name, default, type, doc)
    env = os.environ.get("KILN_" + name.upper())
    if env is not None:
        try:
            flag.value = type(env)
        except (TypeError, ValueError) as e:
            raise ValueError(f"bad value for environment variable KILN_{name.upper()}={env!r}: {e}") from None
    else:
        flag.value = default
    _FLAGS[name] = flag
    return flag


def builtin_type(default: Any) -> Callable[[str], Any]:
    if default is None:
        return _parse_optional_str
    return type(default)


def flag_names() -> list[str]:
    return sorted(_FLAGS)


def get(name: str) -> Any:
    try:
        return _FLAGS[name].value
    except KeyError:
        raise KeyError(f"unknown kiln flag {name!r}; known flags: {sorted(_FLAGS)}") from None


def set(name: str, value: Any) -> None:  # noqa: A001 - mirrors get()
    get(name)
    _FLAGS[name].value = value


@contextlib.contextmanager
def patch(**values: Any) -> Iterator[None]:
    """Temporarily set flags: `with config.patch(verify=True): ...`."""
    old = {name: get(name) for name in values}
    try:
        for name, value in values.items():
            set(name, value)
        yield
    finally:
        for name, value in old.items():
            set(name, value)


def describe() -> str:
    """Every flag with its current value and doc, one per line."""
    return "\n".join(f"KILN_{f.name.upper()}={f.value!r}  # {f.doc}" for f in _FLAGS.values())


class _Flags:
    def __getattr__(self, name: str) -> Any:
        return get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        set(name, value)


flags = _Flags()

# ---- the flags -------------------------------------------------------------------------------------------
define("debug_dir", None, "dump every artifact of every compiled graph into this directory (1/true: "
       "./kiln_debug), one folder per graph and index.txt naming each one's frame and file:line")
define("trace_dir", None, "write a compile report (one static HTML page: captures, graphs, breaks, guards, "
       "passes, kernels with their user lines) for this process into this directory at exit (1/true: "
       "./kiln_trace); `kiln report script.py` sets it; compiles then skip the graph cache")
define("verify", False, "run the graph verifier after every pass")
define("cache_dir", os.path.join(os.path.expanduser("~"), ".cache", "kiln"), "on-disk cache directory",
       type=str)
define("cache_max_bytes", 1 << 30, "size cap of the kernel cache in bytes; least recently used entries go "
       "first (negative: no cap)")
define("raise_on_error", False, "raise internal compile errors instead of falling back to eager")
define("recompile_limit", 8, "recaptures of one code object before it runs eagerly")
define("strict_decompositions", False,
       "raise when a decomposition disagrees with eager instead of falling back to the torch op")
define("check_metas", False,
       "while tracing, run every decomposed op with torch on the example inputs and compare its result's "
       "shapes and dtypes with the decomposition's (a mismatch runs the torch op, counted; raises under "
       "strict_decompositions). Off: ops are recorded from their metas and run on examples only where a "
       "real value is asked for (the test suite turns it on for the op sweeps)")
define("fuel", -1, "optimization fuel: allow this many optimizing decisions (fusions, rewrites, in-place "
       "writes) in this process, then refuse the rest (-1: unlimited); bisects a miscompile to one decision")
define("dynamic_compile_after", 2, "dynamic shapes: a graph with symbolic sizes is compiled on its Nth call "
       "(once for every size where the backend can, else per size: on the Nth call at that size); earlier "
       "calls run the captured graph with torch (1: compile at once)")
define("dynamic_symbolic", True, "dynamic shapes: compile a graph with symbolic sizes once for every size "
       "(kernels take the sizes as arguments) where the backend can; off: always compile per size")
define("dynamic_size_limit", 16, "dynamic shapes: sizes compiled per graph with symbolic sizes; calls at further "
       "sizes run the captured graph with torch, counted and warned once")
define("cxx", "g++", "C++ compiler used by the cpp backend", type=str)
define("build_jobs", 0, "compiler processes a large kernel source is split across (one translation unit each, "
       "then linked); 0: the CPUs this process may run on (at most 8); 1: one process", type=int)
define("graph_cache", True, "cpp backend: keep each compiled graph's wrapper beside its kernels in the cache; a "
       "new process compiling the same graph loads it and skips the pipeline")
define("memory_order", True, "cpp backend: order kernels to keep peak memory low")
define("triton_tile", 0, "triton backend: at most this many elements per kernel tile (0: the size heuristics; "
       "tests set it small to run many programs and loops)")
define("autograd_recompute", True, "training: the backward recomputes cheap forward values (pointwise, views, "
       "reductions) instead of saving them, where a minimum cut says that saves memory")
define("cpp_in_place", True, "cpp backend: a pointwise kernel may write over the buffer it last reads, and a "
       "fallback with an in-place torch op (scatter: a static KV cache's index_copy_) into the input it updates")
define("fuel_report", None, "write the optimization fuel this process used (decisions taken, the last one) "
       "as JSON to this path at exit (set by `kiln bisect` in the runs it makes)")
define("conv_gemm_max_macs", 1_000_000, "CPU convolutions with at most this many multiply-adds run as a gather of "
       "their input windows and one matrix product (im2col; forward and backward), not oneDNN's convolution, "
       "whose per-call cost dominates small ones (0: always oneDNN)")
define("conv_pointwise", "measure", "CPU 1x1 convolutions (stride 1, no padding, ungrouped) above "
       "conv_gemm_max_macs: 'measure' times oneDNN's convolution against the matrix product kiln would run, once "
       "per shape on this machine (cached in cache_dir), and takes the product where it is clearly faster "
       "(torch's NCHW 1x1 convolution over 2x2 or 3x3 images ran 4-9x slower than it); 'gemm' always the "
       "product; 'conv' always oneDNN's", type=one_of("measure", "gemm", "conv"))
define("conv_pointwise_measure_max_macs", 1 << 27, "1x1 convolutions with more multiply-adds than this are not "
       "timed by conv_pointwise='measure' (they keep oneDNN's convolution)")
define("conv_depthwise_max_macs", 250_000, "CPU depthwise convolutions with at most this many multiply-adds "
       "run as a sum of shifted products (one kernel with their neighbours) instead of oneDNN's (0: never)")
define("bfloat16_rounding", "store", "bfloat16 values inside a fused kernel: 'store' computes a chain of ops in "
       "float and rounds to bfloat16 once, where a value is stored or converted to a dtype other than float32 "
       "(torch.compile's rule, which drops a decomposition's round trip through the half type: within "
       "bfloat16's tolerance of eager and closer to the float64 result; bfloat16 has float32's range, so only "
       "the last bits differ), 'op' rounds after every op as eager does (eager's values bit for bit; the "
       "roundings cost more than the memory traffic: a bfloat16 tanh chain ran 3x slower)",
       type=one_of("store", "op"))
define("float16_rounding", "op", "float16 values inside a fused kernel: 'op' rounds after every op as eager does, "
       "so that a value eager overflows to inf (above 65504) or flushes to 0 does so here too (a GradScaler "
       "skips the steps eager skips); 'store' rounds once where stored, as bfloat16_rounding",
       type=one_of("store", "op"))
define("half_addmm_min_macs", 1 << 23, "float16/bfloat16 biased matrix products (F.linear, addmm) with at "
       "least this many multiply-adds run as one half-precision addmm (eager's call, its values bit for bit); "
       "smaller ones as a float32 mm of the upcast operands plus the bias, rounded once (within the dtype's "
       "tolerance of eager), since oneDNN's half-precision gemm costs ~30 us per call where sgemm's is ~10 "
       "us: in compiled models under bf16 autocast the zoo's mlp ([32, 256] @ [256, 256], 2.1M) and nanogpt "
       "([256, 64] @ [64, 256] and [256, 256] @ [256, 64], 4.2M) ran 20-25 us slower per Linear with it; a "
       "[256, 128] @ [128, 384] Linear (12.6M) ran 2-3x faster (0: always the half-precision addmm)")
define("conv_gemm_max_bytes", 8 << 20, "CPU convolutions whose gathered input windows (im2col) would exceed this "
       "many bytes keep oneDNN's convolution")
define("pool_buffers", True, "generated wrappers keep their freed buffers of pool_min_bytes or more for their "
       "next call (no page faults on fresh memory); off for training's forward and backward graphs, where a pool "
       "would hold the forward's buffers through the backward and raise peak memory above eager's")
define("pool_min_bytes", 128 << 10, "the smallest buffer a generated wrapper keeps for its next call (smaller ones "
       "glibc hands back from its free lists without page faults, and torch.empty_strided, ~1 us, costs less than "
       "a pool round trip, ~3 us)")
define("malloc_thresholds", True, "the first compiled C++ graph fixes glibc's malloc thresholds at its own "
       "maxima (mmap 32 MiB, trim 64 MiB; kiln.runtime.malloc): torch's allocations inside graphs (externs' "
       "results) then reuse heap memory instead of faulting in fresh pages each call (DenseNet at batch 8: "
       "10.0 -> 8.5 ms); off: glibc's defaults. Not applied where GLIBC_TUNABLES or MALLOC_*_ set them")
define("native_runs", True, "cpp backend: consecutive segments of kernels and float32 matrix products (mm, "
       "addmm, bmm: BLAS's sgemm_, the routine torch calls, with torch's arguments) run as one C++ entry "
       "(kiln.codegen.cpp_native): one ctypes call instead of a ctypes or torch call per step")
define("native_run_max_bytes", 16 << 20, "cpp backend: a run allocates its steps' buffers before its one call; "
       "beyond its first step's, at most this many bytes of fresh buffers (a longer run is cut)")
define("pool_max_bytes", 256 << 20, "cpp backend: the most bytes of freed buffers the generated wrappers "
       "keep across calls for reuse, all graphs together (0: none; -1: no bound); kiln.reset() frees them")


# ---- log channels ----------------------------------------------------------------------------------------
# what each channel prints when named in KILN_LOGS (logging's INFO level)
CHANNELS = {
    "capture": "each capture of a frame: its time and guard count",
    "guards": "the guards of each capture",
    "recompiles": "each recapture and the guard that failed",
    "breaks": "each graph break: where and why",
    "graph": "each captured graph, as runnable Python",
    "prims": "each graph decomposed into prims, as runnable Python; decompositions that fail or disagree "
             "with eager warn here whatever KILN_LOGS says (the op then runs with torch)",
    "passes": "each graph's compiler passes with their times in one line (with KILN_FUEL, the decision "
              "where the fuel ran out), or that its compile came from the graph cache and the passes were "
              "skipped",
    "fusion": "each graph's kernels and what each one fuses, or that its compile came from the graph cache "
              "and fusion was skipped",
    "kernels": "each graph compiled (seconds, kernels, externs and fallbacks) and each shared object built",
    "output_code": "where each graph's generated code is: its kernels' shared object or Triton modules, "
                   "and its KILN_DEBUG_DIR folder",
    "cache": "kernel and graph cache hits, misses, writes, refused entries and evictions",
    "bench": "the benchmark runner's steps: each model and compiler's runs as they start and end, and "
             "each row's status",
    "dynamic": "symbolic sizes: a size a recompile makes dynamic, each graph's symbols and the facts "
               "guarded, sizes specialized, and whether a graph compiles once for every size",
}
# what `+name` adds (logging's DEBUG level); a channel without an entry prints the same with `+`
VERBOSE = {
    "graph": "the user's source line above the nodes it made, and nodes dead-code elimination removed",
    "passes": "each pass as it ends, and each optimization decision (KILN_FUEL)",
    "fusion": "each decision: a node fused into a kernel or starting one, dims collapsed, buffers "
              "reused or written in place, kernels reordered",
    "kernels": "split builds that fell back to one unit, and autotuning's configs",
    "output_code": "the generated C++ or Triton source and the Python wrapper",
    "cache": "the capture's entry-function cache (kiln.graph.memo): hits, misses and writes",
    "dynamic": "each size fact as the capture decides it, and where a size is specialized",
}
_handler: logging.Handler | None = None


def channels_help() -> str:
    """What KILN_LOGS=help prints: every channel, what it prints and what `+name` adds."""
    width = max(len(name) for name in CHANNELS) + 1
    lines = []
    for name, doc in CHANNELS.items():
        entries = [(name, doc)] + ([("+" + name, "also " + VERBOSE[name])] if name in VERBOSE else [])
        for label, text in entries:
            lines.append(textwrap.fill(text, 110, initial_indent=f"  {label:{width}s}  ",
                                       subsequent_indent=" " * (width + 4)))
    return ("KILN_LOGS takes comma-separated channels ('all' for every one). 'name' prints what the channel "
            "names;\n'+name' also its details; '-name' silences its warnings too (only errors print); "
            "'+all'/'-all' set\nevery channel, and a channel named on its own overrides 'all':\n"
            + "\n".join(lines))


def _channel_names(text: str) -> list[str]:
    """The names in a KILN_LOGS value, checked: an unknown name raises, listing the channels."""
    names = [c.strip() for c in str(text).split(",") if c.strip()]
    unknown = [n for n in names if n.lstrip("+-") not in CHANNELS and n.lstrip("+-") != "all"
               and n != "help"]
    if unknown:
        raise ValueError(f"unknown log channel(s) {', '.join(map(repr, unknown))} in KILN_LOGS\n"
                         f"{channels_help()}")
    return names


def _parse_logs(text: str) -> str:
    names = _channel_names(text)
    if "help" in names:
        print(channels_help(), file=sys.stderr)
    return ",".join(n for n in names if n != "help")


define("logs", "", "comma-separated log channels to print: name, +name (more detail), -name (not even "
       "warnings); 'all' for every one, 'help' lists them", type=_parse_logs)

_LEVEL_OF_PREFIX = {"+": logging.DEBUG, "-": logging.ERROR}


def channel_levels() -> dict[str, int]:
    """The logging level of every channel under the current KILN_LOGS: WARNING when not named, INFO for
    `name`, DEBUG for `+name`, ERROR for `-name`; `all` (with its prefix) first, single names over it."""
    levels = dict.fromkeys(CHANNELS, logging.WARNING)
    names = _channel_names(get("logs"))
    for every in (True, False):
        for text in names:
            name = text.lstrip("+-")
            if (name == "all") != every:
                continue
            level = _LEVEL_OF_PREFIX.get(text[0], logging.INFO)
            for target in (CHANNELS if every else (name,)):
                levels[target] = level
    return levels


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time (pytest's capture, a redirect), not the stream
    there was when the first channel was made."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr


def channel(name: str) -> logging.Logger:
    """The logger of one channel; it prints when the channel is named in KILN_LOGS (see channel_levels)."""
    global _handler
    if name not in CHANNELS:
        raise ValueError(f"unknown log channel {name!r}; channels: {', '.join(CHANNELS)}")
    logger = logging.getLogger("kiln." + name)
    if _handler is None:
        _handler = _StderrHandler()
        _handler.setFormatter(logging.Formatter("[kiln.%(name_short)s] %(message)s"))
        _handler.addFilter(_short_name)
    if _handler not in logger.handlers:
        logger.addHandler(_handler)
        logger.propagate = False
    logger.setLevel(channel_levels()[name])
    return logger


def refresh_channels() -> None:
    """Re-read `logs` after it was changed at run time (e.g. by config.patch)."""
    for name, level in channel_levels().items():
        logging.getLogger("kiln." + name).setLevel(level)


def _short_name(record: logging.LogRecord) -> bool:
    record.name_short = record.name.removeprefix("kiln.")
    return True


def read_json_dict(path: str) -> dict:
    """A JSON object kept in kiln's cache (machine measurements): {} when the file is missing or not one."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write_json(path: str, data: Any) -> None:
    """Write `data` as JSON to `path` whole: into a temporary, then renamed (a reader sees the old file or
    the new one). Raises OSError where the cache cannot be written."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(temporary, path)


def cpu_name() -> str:
    """This machine's CPU model (its measurements, cached on disk, are keyed by it)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def child_environment(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """A copy of this process's environment for a child process, without the variables in `drop`."""
    return {k: v for k, v in os.environ.items() if k not in drop}


def process_environment() -> Any:
    """The process's environment mapping itself, for the capture frontend: a user program that reads
    `os.environ` is modelled (the value read is guarded), never used to configure kiln."""
    return os.environ
