"""The kernel cache on disk: where it lives, what an entry is, whose entries kiln trusts, how big it grows.

Directory: `<config.cache_dir>/cpp` (`KILN_CACHE_DIR`), created private (0700). kiln uses a directory only
when this user owns it and neither its group nor others can write it, for the cache root and `cpp/` alike: a
cache on a shared path such as /tmp must never let another user's code into the process. A directory that
cannot be created or that is refused costs one warning, and this process builds its kernels in a private
temporary directory instead (removed at exit).

Entry: `<key>.so`, the shared object's bytes followed by a trailer of `TRAILER_SIZE` bytes,

    b"KILNCACHE1 " + key (32 hex digits) + b" " + sha256 of the object's bytes (64 hex digits) + b"\\n"

The key hashes the source, the compiler's version and the flags (build.cache_key); the digest hashes what
the compiler wrote. Both travel in the one file, which is written under a temporary name in the same
directory and renamed into place: a reader sees no entry or a whole one, and two processes writing the
same entry at once can never pair one's object with the other's digest (two files renamed one after the
other could). The dynamic loader maps an object by its ELF program headers and never reads the trailing
bytes. `verify_entry` checks owner, mode, trailer, key and digest before anything loads the file; kiln
loads no shared object that it did not write and verify.

Size: `cache_max_bytes` (`KILN_CACHE_MAX_BYTES`, default 1 GiB; negative: no cap). Loading an entry sets
its access time; when a write takes the cache past its cap, the least recently used entries are removed
until it fits. Knowing the size means a stat of every entry, and a cache that has run for weeks holds tens
of thousands (62,000 took 0.4 s to read; reading them after every write made a run of 1,000 small programs
take an hour instead of minutes). So each process reads the directory on its first write and then keeps a
tally: the bytes it found plus the bytes it has written since. It reads the directory again when the tally
passes the cap or when `RESCAN_S` have gone by (other processes write too: the cache can pass its cap by
what they wrote in that time, never for longer). `kiln cache info` and `kiln cache clear` show and empty it.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
import warnings
from typing import Iterator

from .. import config
from ..counters import counters

log = config.channel("cache")

FORMAT = "kiln cache entry v1"  # in every key: entries of an older format are never looked up, only evicted
MAGIC = b"KILNCACHE1 "
KEY_DIGITS = 32
TRAILER_SIZE = len(MAGIC) + KEY_DIGITS + 1 + 64 + 1
ENTRY_NAME = re.compile(r"^[0-9a-f]{32}\.(so|graph|code|text)$")  # kernels, graph wrappers (kiln.backends.graph_cache),
# compiled entry functions and guard text (kiln.graph.memo)
TEMP_PREFIX = ".tmp-"
STALE_TEMP_S = 3600.0  # a temporary this old belongs to no running build (a killed process left it)
RESCAN_S = 60.0  # the longest a process trusts its tally of the cache's size without reading the directory


class BadEntry(Exception):
    """A cache entry kiln must not load: `reason` says why (and is shown in the warning)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CacheWriteError(RuntimeError):
    """Writing a cache entry failed (a full disk, a read-only file system)."""


def current_uid() -> int:
    """The user whose entries kiln trusts (tests replace it to play another user)."""
    return os.geteuid()


# ---- the directory ---------------------------------------------------------------------------------------

_WARNED: set[tuple[str, str]] = set()
_PRIVATE: list[str] = []  # this process's private build directory, made on first need


def warn_once(key: tuple[str, str], message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)


def unsafe_reason(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with this status may hold another user's code; None when it is safe."""
    uid = current_uid()
    if st.st_uid != uid:
        return f"the {what} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the {what} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def configured_directory() -> str:
    """The cache directory the flags name (it may not exist, or be refused)."""
    return os.path.join(os.path.abspath(os.path.expanduser(config.get("cache_dir"))), "cpp")


def directory() -> str:
    """The directory to build and cache kernels in: the configured one when it is private to this user,
    else (after one warning) a private temporary directory of this process."""
    path = configured_directory()
    root = os.path.dirname(path)
    try:
        for d in (root, path):
            os.makedirs(d, mode=0o700, exist_ok=True)
            reason = unsafe_reason(os.stat(d), f"cache directory {d}")
            if reason is not None:
                return _refuse(path, reason, f"`chmod 700 {d}` if it is yours, or set KILN_CACHE_DIR to a "
                                             f"directory of your own")
    except OSError as e:
        cause = f"cannot create the kernel cache directory {path}: {e.strerror or e}"
        return _refuse(path, cause, "set KILN_CACHE_DIR to a directory you can write")
    return path


def _refuse(path: str, reason: str, remedy: str) -> str:
    private = private_directory()
    counters["cache"]["directory refused: private directory used"] += 1
    warn_once((path, reason), f"kiln: {reason}; kernels are built in a private temporary directory for this "
                              f"process instead (rebuilt by every process) — {remedy}")
    return private


def private_directory() -> str:
    if not _PRIVATE:
        _PRIVATE.append(tempfile.mkdtemp(prefix="kiln-cpp-"))  # mode 0700
        atexit.register(shutil.rmtree, _PRIVATE[0], True)
    return _PRIVATE[0]


# ---- entries ---------------------------------------------------------------------------------------------

def entry_path(directory: str, key: str, suffix: str = ".so") -> str:
    return os.path.join(directory, f"{key}{suffix}")


def trailer(key: str, data: bytes) -> bytes:
    if len(key) != KEY_DIGITS:
        raise ValueError(f"cache key {key!r} must have {KEY_DIGITS} hex digits")
    return MAGIC + key.encode() + b" " + hashlib.sha256(data).hexdigest().encode() + b"\n"


def verify_entry(path: str, key: str) -> None:
    """Raise `BadEntry` unless `path` is a regular file of this user, writable by no one else, that holds
    an object and a trailer naming `key` and the object's sha256; FileNotFoundError when there is none."""
    read_verified(path, key)


def read_verified(path: str, key: str) -> bytes:
    """The body of the entry at `path` (without its trailer), after the checks of `verify_entry`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symbolic link, which O_NOFOLLOW refuses
            raise BadEntry("is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadEntry("is not a regular file")
        reason = unsafe_reason(st, "entry")
        if reason is not None:
            raise BadEntry(reason)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
    finally:
        os.close(fd)
    if len(data) <= TRAILER_SIZE or not data[-TRAILER_SIZE:].startswith(MAGIC):
        raise BadEntry(f"has no kiln trailer (truncated, or not written by kiln: {len(data)} bytes)")
    body, tail = data[:-TRAILER_SIZE], data[-TRAILER_SIZE:]
    recorded_key = tail[len(MAGIC):len(MAGIC) + KEY_DIGITS]
    recorded_digest = tail[len(MAGIC) + KEY_DIGITS + 1:-1]
    if hashlib.sha256(body).hexdigest().encode() != recorded_digest:
        raise BadEntry("failed its integrity check (the object's sha256 differs from the one kiln recorded)")
    if recorded_key != key.encode():
        raise BadEntry("holds the kernels of another source (its trailer names another key)")
    return body


@contextlib.contextmanager
def verified_name(path: str, key: str) -> Iterator[str]:
    """A name of this process's own for the entry at `path`, verified: load it under that name.

    The name is a hard link made before the check, so what is checked is what loads, whatever replaces
    `path` meanwhile; and it is new, so the dynamic loader never hands back an object it loaded earlier
    under the same name (it matches names before it opens files). The link goes when the block ends.
    FileNotFoundError when there is no entry; BadEntry when it must not load."""
    own = os.path.join(os.path.dirname(path), f"{TEMP_PREFIX}load-{os.getpid()}-{secrets.token_hex(6)}.so")
    try:
        os.link(path, own, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        verify_entry(path, key)  # a file system without hard links: check and load the entry's own name
        yield path
        return
    try:
        verify_entry(own, key)
        yield own
    finally:
        remove(own)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (os.write may write fewer than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def seal(object_path: str, key: str) -> None:
    """Append the trailer to a freshly built object (still under its temporary name)."""
    with open(object_path, "rb") as f:
        data = f.read()
    fd = os.open(object_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        write_all(fd, trailer(key, data))
    finally:
        os.close(fd)
    os.chmod(object_path, 0o700)


def read_entry(key: str, suffix: str, refused: str = "entries refused") -> bytes | None:
    """The body of the entry `<key><suffix>` of the cache directory, verified; None when there is none or
    it cannot be read, or when it is refused (removed, and counted under `counters["cache"][refused]`)."""
    path = entry_path(directory(), key, suffix)
    try:
        return read_verified(path, key)
    except FileNotFoundError:
        return None
    except BadEntry as e:
        counters["cache"][refused] += 1
        log.info("%s refused: %s", path, e.reason)
        remove(path)
        return None
    except OSError:
        return None


def write_entry(directory: str, key: str, data: bytes, suffix: str) -> str:
    """Write `data` as the sealed entry `<key><suffix>` (temporary, trailer, rename), then fit the cap."""
    path = entry_path(directory, key, suffix)
    fd, temporary = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{key}-", suffix=suffix, dir=directory)
    try:
        try:
            write_all(fd, data + trailer(key, data))
        finally:
            os.close(fd)
        os.chmod(temporary, 0o600)
        install(temporary, path)
    except BaseException:
        remove(temporary)
        raise
    evict(directory, keep=path)
    return path


def install(temporary: str, path: str) -> None:
    """Rename a sealed entry into place: readers see the old entry or the whole new one."""
    os.replace(temporary, path)


def touch(path: str) -> None:
    """Mark an entry used (its access time is the LRU clock; the modification time stays the build's)."""
    try:
        st = os.stat(path)
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except OSError:
        pass  # an entry evicted meanwhile: nothing to mark


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---- size cap, info, clear -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Entry:
    path: str
    size: int
    used: float  # access time: last load


def entries(directory: str) -> list[Entry]:
    """The entries in `directory`, least recently used first."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not ENTRY_NAME.match(name):
            continue
        try:
            st = os.lstat(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        found.append(Entry(os.path.join(directory, name), st.st_size, st.st_atime))
    return sorted(found, key=lambda e: e.used)


@dataclasses.dataclass
class _Tally:
    bytes: int  # found at the last read of the directory, plus what this process wrote since
    read_at: float  # time.monotonic() of that read


_tallies: dict[str, _Tally] = {}  # directory -> this process's tally of its size


def evict(directory: str, keep: str) -> None:
    """After writing `keep`: when the cache may be over `cache_max_bytes`, remove least recently used
    entries until it fits (never `keep`), and temporaries that killed processes left behind. The directory
    is read only when this process's tally says it may be over the cap, or is older than `RESCAN_S`."""
    limit = config.get("cache_max_bytes")
    tally = _tallies.get(directory)
    if tally is not None and time.monotonic() - tally.read_at < RESCAN_S:
        try:
            tally.bytes += os.lstat(keep).st_size
        except OSError:
            pass
        if limit is None or limit < 0 or tally.bytes <= limit:
            return
    _remove_stale_temporaries(directory)
    found = entries(directory)
    total = sum(e.size for e in found)
    _tallies[directory] = tally = _Tally(total, time.monotonic())
    if limit is None or limit < 0:
        return
    for e in found:
        if total <= limit:
            break
        if e.path == keep:
            continue
        remove(e.path)
        total -= e.size
        tally.bytes = total
        counters["cache"]["entries evicted"] += 1
        log.info("evicted %s (%d bytes; cache now %d of %d bytes)", e.path, e.size, total, limit)


def _remove_stale_temporaries(directory: str, older_than: float = STALE_TEMP_S) -> int:
    removed, now = 0, time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if name.startswith(TEMP_PREFIX):
            path = os.path.join(directory, name)
            try:
                if now - os.lstat(path).st_mtime >= older_than:
                    os.unlink(path)
                    removed += 1
            except OSError:
                pass
    return removed


def info() -> dict:
    """What `kiln cache info` shows: the directory, its entries and bytes, the cap, whether it is used."""
    path = configured_directory()
    found = entries(path)
    status = "absent (made on the first build)"
    if os.path.isdir(path):
        status = "ok"
        for d in (os.path.dirname(path), path):
            try:
                reason = unsafe_reason(os.stat(d), f"directory {d}")
            except OSError as e:
                reason = f"{d}: {e.strerror or e}"
            if reason is not None:
                status = f"refused: {reason}"
                break
    return {"directory": path, "entries": len(found), "bytes": sum(e.size for e in found),
            "max_bytes": config.get("cache_max_bytes"), "status": status}


def clear() -> tuple[int, int]:
    """Remove every entry of the configured cache, and temporaries no running build still uses; returns
    (entries, bytes) removed."""
    path = configured_directory()
    found = entries(path)
    for e in found:
        remove(e.path)
    _remove_stale_temporaries(path)
    _tallies.pop(path, None)
    return len(found), sum(e.size for e in found)
