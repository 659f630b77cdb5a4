"""Build and load C++: find the compiler, compile one shared object per graph, cache it on disk.

The cache key hashes the source, the compiler's version and the flags; `kiln.runtime.cache` keeps the
entries (where, in what format, whose, how many). A build compiles into a temporary file beside the
entries, seals it with its sha256 and renames it into place, so two processes building the same entry never
see a half-written file; the compiler runs in its own process group, killed with its helpers when the build
is interrupted (Ctrl-C), and every temporary is removed. An entry is verified before it is loaded; one that
fails (corrupt, truncated, another source's, not this user's, failing to load) costs one warning and is
rebuilt. A fresh build that fails to load raises `KernelLoadError`; a write that fails raises
`CacheWriteError`; the backend turns either into an eager fallback with a warning.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import platform
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import warnings

from .. import config
from ..counters import counters
from . import cache

log = config.channel("kernels")
cache_log = config.channel("cache")

# -fno-math-errno and -fno-trapping-math change no value (NaNs, infinities and signed zeros are kept): math
# calls set no errno and floating-point ops raise no exception anyone reads, so g++ may if-convert a select
# next to a SIMD math call (`mask ? x : -inf` before exp: without it the whole loop stays scalar)
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno",
         "-fno-trapping-math", "-Wno-unused-variable"]


@functools.lru_cache(maxsize=None)
def wide_int_to_float_simd() -> bool:
    """Whether -march=native vectorizes int64 -> float conversions: on x86 only with AVX-512DQ (where
    /proc/cpuinfo cannot be read, assumed). Other architectures have the instruction in their base SIMD."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "i386"):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512dq" in line.split()
    except OSError:
        pass
    return True


@functools.lru_cache(maxsize=None)
def flags() -> list[str]:
    """Compiler flags; with glibc's libmvec, math calls in loops vectorize (KILN_MVEC, -lmvec)."""
    import ctypes.util
    if ctypes.util.find_library("mvec"):
        return FLAGS + ["-DKILN_MVEC"]
    return list(FLAGS)


def libraries() -> list[str]:
    return ["-lmvec"] if "-DKILN_MVEC" in flags() else []


class CompilerNotFound(RuntimeError):
    """No C++ compiler: the cpp backend cannot build kernels."""


class BuildError(RuntimeError):
    """The C++ compiler rejected generated code (a kiln bug, or a broken compiler)."""


class KernelLoadError(RuntimeError):
    """A shared object kiln has just built fails to load."""


@functools.lru_cache(maxsize=None)
def find_compiler(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        where = "does not exist or is not executable" if os.sep in name else "is not on PATH"
        raise CompilerNotFound(
            f"the cpp backend needs a C++ compiler but {name!r} {where}; install g++ "
            f"(e.g. `apt-get install g++`) or point KILN_CXX at one")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else path


def cache_key(source: str, compiler: str) -> str:
    text = "\n".join([source, compiler_version(compiler), " ".join(flags() + libraries()), cache.FORMAT])
    return hashlib.sha256(text.encode()).hexdigest()[:cache.KEY_DIGITS]


_LOADED: dict[str, ctypes.CDLL] = {}


def build(source: str) -> ctypes.CDLL:
    """Compile `source` to a shared object (or take it from the cache), verify it and load it."""
    compiler = find_compiler(config.get("cxx"))
    key = cache_key(source, compiler)
    if key in _LOADED:
        return _LOADED[key]
    directory = cache.directory()
    path = cache.entry_path(directory, key)
    lib = _load_cached(path, key)
    if lib is None:
        cache_log.info("kernel cache miss %s: building it", path)
        lib = _compile(compiler, source, directory, key)
    _LOADED[key] = lib
    return lib


def load_built(key: str) -> ctypes.CDLL | None:
    """The object of cache key `key` (built by an earlier compile of this or another process), loaded; None
    when the cache no longer holds it (evicted, cleared, refused)."""
    if key in _LOADED:
        return _LOADED[key]
    lib = _load_cached(cache.entry_path(cache.directory(), key), key, warn=False)
    if lib is not None:
        _LOADED[key] = lib
    return lib


def _load_cached(path: str, key: str, warn: bool = True) -> ctypes.CDLL | None:
    """The entry at `path` loaded, or None when there is none or it must be rebuilt (one warning; none
    without `warn`, where the caller's rebuild will warn)."""
    try:
        with cache.verified_name(path, key) as name:
            lib = ctypes.CDLL(name)
    except FileNotFoundError:
        return None
    except cache.BadEntry as e:
        if warn:
            _warn_rebuild(path, e.reason)
        return None
    except OSError as e:
        if warn:
            _warn_rebuild(path, f"fails to load ({_loader_message(e)})")
        return None
    cache.touch(path)
    cache_log.info("kernel cache hit %s", path)
    counters["cache"]["hits"] += 1
    return lib


def _loader_message(e: OSError) -> str:
    """The dynamic loader's message without the private name the object was loaded under."""
    text = str(e)
    return text.split(": ", 1)[1] if text.startswith("/") and ": " in text else text


def _warn_rebuild(path: str, reason: str) -> None:
    counters["cache"]["entries rebuilt"] += 1
    warnings.warn(f"kiln: the kernel cache entry {path} {reason}; rebuilding it (if this repeats, something "
                  f"else writes into {os.path.dirname(path)}: `kiln cache clear` empties the cache)",
                  UserWarning, stacklevel=4)


def _compile(compiler: str, source: str, directory: str, key: str) -> ctypes.CDLL:
    """Compile into temporaries in `directory`, seal, verify and load the object, and only then rename it
    into place (an object that fails to load never becomes an entry)."""
    start = time.perf_counter()
    path = cache.entry_path(directory, key)
    src_path = tmp_so = None
    try:
        fd, src_path = tempfile.mkstemp(prefix=f"{cache.TEMP_PREFIX}{key}-", suffix=".cpp", dir=directory)
        tmp_so = src_path[:-len(".cpp")] + ".so"
        try:
            cache.write_all(fd, source.encode())
        finally:
            os.close(fd)
        returncode, stderr = _compile_units(compiler, source, directory, key, tmp_so)
        if returncode is None:  # not split, or a split build that failed: the source as one unit
            returncode, stderr = _run_compiler([compiler, *flags(), src_path, "-o", tmp_so, *libraries()])
        if returncode != 0:
            if "No space left on device" in stderr:
                raise OSError(errno.ENOSPC, "No space left on device (the compiler's output)")
            raise BuildError(_build_error_message(compiler, returncode, stderr, source, key))
        cache.seal(tmp_so, key)
        lib = _load_new(tmp_so, key, compiler)
        cache.install(tmp_so, path)
    except OSError as e:
        raise cache.CacheWriteError(
            f"writing the kernel cache entry {path} failed: {e.strerror or e}; free space on that disk, "
            f"`kiln cache clear`, or point KILN_CACHE_DIR at a disk with room") from e
    finally:
        for temporary in (tmp_so, src_path):
            if temporary is not None:
                cache.remove(temporary)  # KILN_DEBUG_DIR keeps the source
    cache_log.info("kernel cache wrote %s", path)
    cache.evict(directory, keep=path)
    log.info("built %s in %.2f s", path, time.perf_counter() - start)
    return lib


def _load_new(object_path: str, key: str, compiler: str) -> ctypes.CDLL:
    """Load the object this process has just built and sealed; it must verify and load."""
    try:
        cache.verify_entry(object_path, key)
        return ctypes.CDLL(object_path)
    except (OSError, cache.BadEntry) as e:
        reason = _loader_message(e) if isinstance(e, OSError) else f"it {e}"
        raise KernelLoadError(
            f"the shared object {compiler} built for these kernels fails to load: {reason}; the compiler "
            f"or its libraries (libgomp, libmvec) are broken or missing at run time — fix the toolchain or "
            f"point KILN_CXX at another compiler") from None


# a source at least this long, with several segment entries, is compiled as several translation units in
# parallel (resnet18's training backward, 228 KB in 22 entries: 2.06 s as one unit, 1.15 s as two on two
# CPUs; the shared header alone takes ~0.04 s to compile)
SPLIT_MIN_CHARS = 40_000
_ENTRY = re.compile(r'^extern "C" int kiln_', re.M)


def build_jobs() -> int:
    jobs = int(config.get("build_jobs"))
    if jobs > 0:
        return jobs
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cpus = os.cpu_count() or 1
    return min(cpus, 8)  # (each -O3 compiler process takes a few hundred MB)


def split_units(source: str, jobs: int) -> list[str] | None:
    """The source as up to `jobs` translation units, each the shared header (everything before the first
    `extern "C" int kiln_...` entry) and whole entries, balanced by length; None when it is not worth it."""
    starts = [m.start() for m in _ENTRY.finditer(source)]
    if jobs < 2 or len(starts) < 2 or len(source) < SPLIT_MIN_CHARS:
        return None
    head = source[:starts[0]]
    entries = [source[a:b] for a, b in zip(starts, starts[1:] + [len(source)])]
    units: list[list[str]] = [[] for _ in range(min(jobs, len(entries)))]
    sizes = [0] * len(units)
    for text in sorted(entries, key=len, reverse=True):  # longest first, each to the smallest unit
        i = sizes.index(min(sizes))
        units[i].append(text)
        sizes[i] += len(text)
    return [head + "".join(u) for u in units]


def _compile_units(compiler: str, source: str, directory: str, key: str, tmp_so: str) -> tuple[int | None, str]:
    """Compile the source split into translation units (`split_units`), all at once, and link them into
    `tmp_so`. (None, "") when it is not split or a unit fails to build: the caller then compiles the source
    whole, which also reports a genuine error against the whole source."""
    units = split_units(source, build_jobs())
    if units is None:
        return None, ""
    temporaries: list[str] = []
    try:
        commands, objects = [], []
        for text in units:
            fd, path = tempfile.mkstemp(prefix=f"{cache.TEMP_PREFIX}{key}-", suffix=".cpp", dir=directory)
            temporaries.append(path)
            try:
                cache.write_all(fd, text.encode())
            finally:
                os.close(fd)
            objects.append(path[:-len(".cpp")] + ".o")
            temporaries.append(objects[-1])
            commands.append([compiler, *[f for f in flags() if f != "-shared"], "-c", path, "-o", objects[-1]])
        results = _run_compilers(commands)
        if any(code != 0 for code, _ in results):
            log.debug("split build of %s failed; building it as one unit", key)
            return None, ""
        code, stderr = _run_compiler([compiler, *flags(), *objects, "-o", tmp_so, *libraries()])
        if code != 0:
            log.debug("linking the split build of %s failed; building it as one unit", key)
            return None, ""
        counters["cpp"]["sources built as several units in parallel"] += 1
        return code, stderr
    finally:
        for path in temporaries:
            cache.remove(path)


def _run_compilers(commands: list[list[str]]) -> list[tuple[int, str]]:
    """Run the commands at once, each in a process group of its own; an interrupt (Ctrl-C) or any other
    exception kills every one with the helpers it started before it propagates."""
    processes = []
    try:
        for command in commands:
            processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True, start_new_session=True))
        results = []
        for process in processes:
            _, stderr = process.communicate()
            results.append((process.returncode, stderr))
        return results
    except BaseException:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        raise


def _run_compiler(command: list[str]) -> tuple[int, str]:
    """Run the compiler in a process group of its own; an interrupt (Ctrl-C) or any other exception kills
    it with every helper it started (cc1plus, as, ld) before it propagates, so none writes on after."""
    return _run_compilers([command])[0]


def _build_error_message(compiler: str, returncode: int, stderr: str, source: str, key: str) -> str:
    try:
        fd, kept = tempfile.mkstemp(prefix=f"kiln-failed-{key[:12]}-", suffix=".cpp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
    except OSError as e:
        kept = f"(not kept: {e})"
    return (f"{compiler} exited with status {returncode} on the generated kernels (a kiln bug, or a broken "
            f"compiler); the source is kept at {kept} — please report it with the compiler's message "
            f"below, or point KILN_CXX at another compiler:\n{stderr[-4000:].rstrip()}")


def forget_loaded() -> None:
    """Drop the in-process table of loaded objects (the next build reads the disk cache)."""
    _LOADED.clear()
