"""The kernel cache: the entry format and its checks, private directories, refusing another user's or a
shared-writable directory or entry, the size cap with least-recently-used eviction, `kiln cache`."""
import importlib
import os
import shutil
import stat
import time
import warnings

import pytest

from kiln import cli, config
from kiln.counters import counters
from kiln.runtime import build, cache, forget_loaded
from kiln.runtime.build import cache_key, find_compiler

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


def source(answer):
    return f'extern "C" int kiln_answer(void) {{ return {answer}; }}\n'


def key_of(answer):
    return cache_key(source(answer), find_compiler(config.get("cxx")))


@pytest.fixture
def cache_dir(tmp_path):
    """An empty cache for the test; nothing loaded, nothing warned, the counters empty."""
    forget_loaded()
    cache._WARNED.clear()
    counters.clear()
    with config.patch(cache_dir=str(tmp_path / "cache")):
        yield tmp_path / "cache"
    forget_loaded()


def entry(cache_dir, answer):
    return cache_dir / "cpp" / f"{key_of(answer)}.so"


def build_quietly(answer):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lib = build(source(answer))
    assert lib.kiln_answer() == answer
    return lib


def build_warning(answer, *fragments):
    """Build and load `source(answer)`; it must warn once, naming every fragment."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = build(source(answer))
    assert lib.kiln_answer() == answer
    assert len(caught) == 1, [str(w.message) for w in caught]
    for fragment in fragments:
        assert fragment in str(caught[0].message), str(caught[0].message)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


# ---- the entry format ------------------------------------------------------------------------------------

def test_an_entry_is_the_object_and_its_sealed_digest(cache_dir):
    build_quietly(7)
    path = entry(cache_dir, 7)
    assert sorted(os.listdir(cache_dir / "cpp")) == [path.name]  # no temporary left
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert data[-cache.TRAILER_SIZE:] == cache.trailer(key_of(7), data[:-cache.TRAILER_SIZE])
    assert mode(cache_dir) == mode(cache_dir / "cpp") == mode(path) == 0o700  # private
    stamp = path.stat().st_mtime_ns
    forget_loaded()
    build_quietly(7)  # a verified hit: not rebuilt
    assert counters["cache"]["hits"] == 1 and path.stat().st_mtime_ns == stamp


def write_entry(path, body, key):
    path.write_bytes(body + cache.trailer(key, body))


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[:-1], "has no kiln trailer"),
    (lambda data: data[:10], "has no kiln trailer"),
    (lambda data: b"\x7fELG" + data[4:], "failed its integrity check"),
    (lambda data: data[:-cache.TRAILER_SIZE] + data[-cache.TRAILER_SIZE:].replace(b"ab" * 16, b"cd" * 16),
     "holds the kernels of another source"),
])
def test_verify_entry_refuses_damage(tmp_path, damage, reason):
    path = tmp_path / "entry.so"
    write_entry(path, b"\x7fELF" + bytes(range(256)) * 4, "ab" * 16)
    cache.verify_entry(str(path), "ab" * 16)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(cache.BadEntry, match=reason):
        cache.verify_entry(str(path), "ab" * 16)


def test_verify_entry_refuses_what_another_user_could_have_written(tmp_path, monkeypatch):
    key = "ab" * 16
    path = tmp_path / "entry.so"
    write_entry(path, b"\x7fELF" + b"\1" * 300, key)
    path.chmod(0o620)
    with pytest.raises(cache.BadEntry, match="writable by its group or by others"):
        cache.verify_entry(str(path), key)
    path.chmod(0o600)
    monkeypatch.setattr(cache, "current_uid", lambda: os.geteuid() + 1)  # root can't fake an owner
    with pytest.raises(cache.BadEntry, match=f"owned by uid {os.geteuid()}, not by this user"):
        cache.verify_entry(str(path), key)
    monkeypatch.undo()
    os.symlink(path, tmp_path / "link.so")
    with pytest.raises(cache.BadEntry, match="symbolic link"):
        cache.verify_entry(str(tmp_path / "link.so"), key)
    (tmp_path / "dir.so").mkdir()
    with pytest.raises(cache.BadEntry, match="not a regular file"):
        cache.verify_entry(str(tmp_path / "dir.so"), key)
    with pytest.raises(FileNotFoundError):
        cache.verify_entry(str(tmp_path / "absent.so"), key)


def test_another_entry_or_an_unloadable_one_is_rebuilt(cache_dir):
    build_quietly(1)
    build_quietly(2)
    forget_loaded()
    entry(cache_dir, 1).unlink()  # (never write into a loaded object in place: replace it)
    shutil.copyfile(entry(cache_dir, 2), entry(cache_dir, 1))  # another source's entry under this key
    build_warning(1, str(entry(cache_dir, 1)), "holds the kernels of another source", "rebuilding it")
    forget_loaded()
    entry(cache_dir, 1).unlink()  # sealed by kiln, but the loader refuses it (a library went missing)
    write_entry(entry(cache_dir, 1), b"\x7fELF" + b"\0" * 200, key_of(1))
    build_warning(1, "fails to load", "rebuilding it", "kiln cache clear")
    cache.verify_entry(str(entry(cache_dir, 1)), key_of(1))
    assert counters["cache"]["entries rebuilt"] == 2


# ---- whose directory and entries -------------------------------------------------------------------------

@pytest.mark.parametrize("shared", ["cache root", "cpp directory"])
def test_a_directory_others_can_write_is_refused(cache_dir, shared):
    directory = cache_dir if shared == "cache root" else cache_dir / "cpp"
    directory.mkdir(parents=True)
    directory.chmod(0o777)  # as a cache on /tmp made by someone else's umask
    build_warning(3, f"cache directory {directory}", "writable by its group or by others (mode 0777)",
                  "private temporary directory", "KILN_CACHE_DIR")
    build_quietly(4)  # one warning per directory, not per build
    assert not entry(cache_dir, 3).exists() and not entry(cache_dir, 4).exists()
    private = cache.private_directory()
    assert mode(private) == 0o700 and os.path.exists(cache.entry_path(private, key_of(3)))
    assert counters["cache"]["directory refused: private directory used"] == 2


def test_a_directory_of_another_user_is_refused(cache_dir, monkeypatch):
    cache_dir.mkdir(mode=0o700)
    monkeypatch.setattr(cache, "current_uid", lambda: os.geteuid() + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        directory = cache.directory()
    assert directory == cache.private_directory()
    (warning,) = caught
    assert f"owned by uid {os.geteuid()}, not by this user (uid {os.geteuid() + 1})" in str(warning.message)
    assert not (cache_dir / "cpp").exists() or not os.listdir(cache_dir / "cpp")


def test_an_entry_others_can_write_is_replaced(cache_dir):
    build_quietly(5)
    forget_loaded()
    entry(cache_dir, 5).chmod(0o666)
    build_warning(5, "writable by its group or by others (mode 0666)", "rebuilding it")
    assert mode(entry(cache_dir, 5)) == 0o700


# ---- size cap, `kiln cache` ------------------------------------------------------------------------------

def test_least_recently_used_entries_go_first(cache_dir):
    build_quietly(10)
    size = entry(cache_dir, 10).stat().st_size
    with config.patch(cache_max_bytes=int(size * 2.5)):
        build_quietly(11)
        forget_loaded()
        build_quietly(10)  # a hit: 10 is now used more recently than 11
        assert counters["cache"]["hits"] == 1
        build_quietly(12)  # three entries do not fit: the least recently used (11) goes
    assert entry(cache_dir, 10).exists() and entry(cache_dir, 12).exists()
    assert not entry(cache_dir, 11).exists()
    assert counters["cache"]["entries evicted"] == 1
    with config.patch(cache_max_bytes=-1):
        build_quietly(13)
    assert len(cache.entries(str(cache_dir / "cpp"))) == 3


def test_a_write_reads_the_directory_only_when_the_cache_may_be_over_its_cap(tmp_path, monkeypatch):
    """Regression: every write used to stat every entry to learn the cache's size. With the 62,000 entries
    of a long-lived cache that was 0.4 s a write, and 1,000 pyfuzz programs took an hour (CI timed out)."""
    directory = str(tmp_path)
    reads = []
    real_entries = cache.entries
    monkeypatch.setattr(cache, "entries", lambda d: reads.append(d) or real_entries(d))
    data = b"x" * 1000
    size = len(data) + cache.TRAILER_SIZE
    with config.patch(cache_max_bytes=size * 4):
        cache.write_entry(directory, "0" * 32, data, ".text")  # this process's first write: read it
        assert len(reads) == 1
        for k in (1, 2):  # four entries fit: the tally says so, no read
            cache.write_entry(directory, str(k) * 32, data, ".text")
        assert len(reads) == 1 and len(real_entries(directory)) == 3
        cache.write_entry(directory, "3" * 32, data, ".text")  # the tally is at the cap: still fits
        assert len(reads) == 1
        cache.write_entry(directory, "4" * 32, data, ".text")  # past the cap: read, evict the oldest
        assert len(reads) == 2
        kept = sorted(os.path.basename(e.path)[0] for e in real_entries(directory))
        assert len(kept) == 4 and "4" in kept, kept  # (which went is LRU's test above)
        monkeypatch.setattr(cache, "RESCAN_S", 0.0)  # an old tally is read again (others write too)
        (tmp_path / ("5" * 32 + ".text")).write_bytes(data + cache.trailer("5" * 32, data))
        cache.write_entry(directory, "6" * 32, data, ".text")
        kept = sorted(os.path.basename(e.path)[0] for e in real_entries(directory))
        assert len(reads) == 3 and len(kept) == 4 and "6" in kept, kept


def test_kiln_cache_info_and_clear(cache_dir, capsys):
    assert cli.main(["cache", "info"]) == 0
    assert "entries: 0" in capsys.readouterr().out
    build_quietly(20)
    build_quietly(21)
    stale = cache_dir / "cpp" / f"{cache.TEMP_PREFIX}killed-build.cpp"  # a killed process's temporary
    stale.write_text("")
    os.utime(stale, (time.time() - 2 * cache.STALE_TEMP_S,) * 2)
    fresh = cache_dir / "cpp" / f"{cache.TEMP_PREFIX}running-build.cpp"  # a build still running
    fresh.write_text("")
    total = sum(entry(cache_dir, a).stat().st_size for a in (20, 21))
    assert cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"directory: {cache_dir / 'cpp'}" in out and "entries: 2" in out
    assert f"size: {cli.human_bytes(total)} ({total} bytes)" in out and "KiB" in out, out  # (readable sizes)
    cap = config.get("cache_max_bytes")
    assert "status: ok" in out and f"max size: {cli.human_bytes(cap)} ({cap} bytes)" in out, out
    assert cli.main(["cache", "clear"]) == 0
    assert f"removed 2 entries ({cli.human_bytes(total)})" in capsys.readouterr().out
    assert os.listdir(cache_dir / "cpp") == [fresh.name]
    forget_loaded()
    build_quietly(20)  # rebuilt after the clear


# ---- a large source built as several translation units in parallel -------------------------------------

units = importlib.import_module("kiln.runtime.build")  # (kiln.runtime.build is also the function)

def many_entries(n, pad=0):
    head = "#include <cstdint>\nstatic inline int64_t twice(int64_t v) { return 2 * v; }\n"
    body = "".join(f'extern "C" int kiln_e{i}(void) {{ /*{"x" * pad}*/ return (int)twice({i}); }}\n'
                   for i in range(n))
    return head + body


def test_split_units_keep_the_header_and_every_entry_once():
    src = many_entries(7, pad=units.SPLIT_MIN_CHARS // 7)
    parts = units.split_units(src, 3)
    assert len(parts) == 3
    head = src[:src.index('extern "C"')]
    assert all(u.startswith(head) for u in parts)
    bodies = sorted(line for u in parts for line in u[len(head):].splitlines())
    assert bodies == sorted(src[len(head):].splitlines())
    assert max(map(len, parts)) - min(map(len, parts)) < 2 * len(src) / 7  # balanced
    assert units.split_units(src, 1) is None  # one job: one unit
    assert units.split_units(many_entries(7), 3) is None  # small: not worth the header's compile


def test_a_split_build_loads_every_entry(cache_dir):
    with config.patch(build_jobs=2):
        lib = units.build(many_entries(5, pad=units.SPLIT_MIN_CHARS // 5))
    assert [getattr(lib, f"kiln_e{i}")() for i in range(5)] == [0, 2, 4, 6, 8]
    assert counters["cpp"]["sources built as several units in parallel"] == 1


def test_a_split_that_fails_to_build_is_built_whole(cache_dir, monkeypatch):
    # an entry needing a definition another unit holds: the units fail, the whole source builds
    src = many_entries(4, pad=units.SPLIT_MIN_CHARS // 4)
    monkeypatch.setattr(units, "split_units", lambda s, jobs: [s + "int broken(", s])
    with config.patch(build_jobs=2):
        lib = units.build(src)
    assert lib.kiln_e3() == 6
    assert counters["cpp"]["sources built as several units in parallel"] == 0
    assert not [p for p in os.listdir(cache_dir / "cpp") if p.startswith(cache.TEMP_PREFIX)]  # no leftovers


def test_a_split_that_fails_to_link_is_built_whole(cache_dir, monkeypatch):
    src = many_entries(4, pad=units.SPLIT_MIN_CHARS // 4)
    run = units._run_compiler
    linking = lambda command: any(a.endswith(".o") for a in command) and "-c" not in command  # noqa: E731
    monkeypatch.setattr(units, "_run_compiler", lambda c: (1, "link failed") if linking(c) else run(c))
    with config.patch(build_jobs=2):
        lib = units.build(src)
    assert lib.kiln_e3() == 6
    assert counters["cpp"]["sources built as several units in parallel"] == 0
