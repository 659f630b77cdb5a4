"""Build and load C++: find the compiler, compile one shared object per graph, cache it on disk.

The cache key hashes the source, the compiler's version and the flags. Entries live under
`config.cache_dir` (`KILN_CACHE_DIR`) as `<key>.so`; a build writes a temporary file and renames it into
place, so two processes building the same entry never see a half-written file. An entry that fails to
load (corrupt, truncated) is rebuilt.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time

from .. import config

log = config.channel("kernels")
cache_log = config.channel("cache")

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno",
         "-Wno-unused-variable"]


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
    """The C++ compiler rejected generated code (a kiln bug)."""


@functools.lru_cache(maxsize=None)
def find_compiler(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise CompilerNotFound(
            f"the cpp backend needs a C++ compiler but {name!r} is not on PATH; install g++ "
            f"(e.g. `apt-get install g++`) or point KILN_CXX at one")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else path


def cache_key(source: str, compiler: str) -> str:
    text = "\n".join([source, compiler_version(compiler), " ".join(flags() + libraries())])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_LOADED: dict[str, ctypes.CDLL] = {}


def build(source: str) -> ctypes.CDLL:
    """Compile `source` to a shared object (or take it from the cache) and load it."""
    compiler = find_compiler(config.get("cxx"))
    key = cache_key(source, compiler)
    if key in _LOADED:
        return _LOADED[key]
    cache_dir = os.path.join(config.get("cache_dir"), "cpp")
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{key}.so")
    if os.path.exists(path):
        try:
            lib = ctypes.CDLL(path)
            cache_log.debug("cache hit %s", path)
            _LOADED[key] = lib
            return lib
        except OSError as e:
            cache_log.warning("rebuilding corrupt cache entry %s (%s)", path, e)
    _compile(compiler, source, path)
    lib = ctypes.CDLL(path)
    _LOADED[key] = lib
    return lib


def _compile(compiler: str, source: str, path: str) -> None:
    directory = os.path.dirname(path)
    fd, src_path = tempfile.mkstemp(suffix=".cpp", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_so = src_path[:-4] + ".so.tmp"
    start = time.perf_counter()
    try:
        result = subprocess.run([compiler, *flags(), src_path, "-o", tmp_so, *libraries()],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BuildError(f"{compiler} failed on generated code ({src_path}):\n{result.stderr[-4000:]}")
        os.replace(tmp_so, path)  # atomic: readers see the old entry or the whole new one
    finally:
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
        if os.path.exists(src_path):
            os.unlink(src_path)  # KILN_DEBUG_DIR keeps the source
    log.debug("built %s in %.2f s", path, time.perf_counter() - start)


def forget_loaded() -> None:
    """Drop the in-process table of loaded objects (the next build reads the disk cache)."""
    _LOADED.clear()
