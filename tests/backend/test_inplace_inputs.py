"""A mutated input's final value written into the input's own memory by its kernel (no write-back copy),
where the input is last read at the same index: optimizer updates, running statistics."""
from __future__ import annotations

import re
import shutil

import pytest
import torch

import kiln
from kiln import config

pytestmark = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


def _momentum(ps, gs, bs, lr):
    for p, g, b in zip(ps, gs, bs):
        b.mul_(0.9).add_(g)
        p.add_(b * lr)  # reads the new b: computed once, stored into b, read back at the same index


def test_updates_are_written_into_the_inputs_and_equal_eager(tmp_path):
    torch.manual_seed(0)
    ps, gs, bs = ([torch.randn(64, 8) for _ in range(3)] for _ in range(3))
    lr = torch.tensor(-0.1)
    ref_p, ref_b = [p.clone() for p in ps], [b.clone() for b in bs]
    versions = [t._version for t in ps + bs]
    with config.patch(debug_dir=str(tmp_path)):
        f = kiln.compile(_momentum, backend="cpp")
        for _ in range(3):
            f(ps, gs, bs, lr)
            _momentum(ref_p, gs, ref_b, lr)
    for a, b in zip(ps + bs, ref_p + ref_b):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert all(t._version > v for t, v in zip(ps + bs, versions))  # as eager's in-place ops move them
    wrapper = next(tmp_path.glob("*/09_build.py")).read_text()
    for i in range(3):  # each new value is its input (or a view of it): the kernel stored into the input
        for name in (f"ps_{i}", f"bs_{i}"):
            assert re.search(rf"= {name}(\.as_strided\(|  #)", wrapper), wrapper


def test_an_input_read_after_its_update_at_another_index_is_not_overwritten():
    def f(x):
        y = x.flip(0)      # reads x at the mirrored index
        x.mul_(2)
        return y + x       # the old x (through y) and the new x
    torch.manual_seed(0)
    x = torch.randn(16)
    ref = x.clone()
    out = kiln.compile(f, backend="cpp")(x)
    torch.testing.assert_close(out, f(ref))
    torch.testing.assert_close(x, ref)


# ---- a fallback with an in-place reference (a static KV cache's index_copy_: prims.scatter) --------------

def _cache_update(cache, pos, k):
    cache.index_copy_(2, pos, k)  # HF StaticCache.update
    return (cache * 2).sum(-1)


def _wrapper_text(directory) -> str:
    return "\n".join(p.read_text() for p in sorted(directory.glob("*/09_build.py")))


@pytest.mark.parametrize("positions", [[3], [0, 7], [5, 1, 2]])
def test_a_static_cache_update_scatters_into_the_cache_itself(tmp_path, positions):
    torch.manual_seed(0)
    cache, k = torch.randn(1, 2, 8, 4), torch.randn(1, 2, len(positions), 4)
    pos = torch.tensor(positions)
    ref = cache.clone()
    version = cache._version
    with config.patch(debug_dir=str(tmp_path)):
        out = kiln.compile(_cache_update, backend="cpp")(cache, pos, k)
    expected = _cache_update(ref, pos, k)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(cache, ref, rtol=0, atol=0)
    assert cache._version == version + 1  # one in-place op, as eager's index_copy_ (no second copy_)
    assert "# in place of cache" in _wrapper_text(tmp_path)


def test_decode_steps_write_each_position_into_the_cache(counters):
    torch.manual_seed(0)
    cache, ref = torch.zeros(1, 2, 16, 4), torch.zeros(1, 2, 16, 4)
    f = kiln.compile(_cache_update, backend="cpp")
    for step in range(16):
        k, pos = torch.randn(1, 2, 1, 4), torch.tensor([step])
        torch.testing.assert_close(f(cache, pos, k), _cache_update(ref, pos, k), rtol=0, atol=0)
        torch.testing.assert_close(cache, ref, rtol=0, atol=0)
    assert sum(counters["captures"].values()) == 1
    assert counters["fallback"]["prims.scatter"] >= 1  # still a fallback (torch's scatter_), counted


def test_a_cache_read_after_its_update_keeps_the_copy(tmp_path):
    def f(cache, pos, k):
        before = cache.flip(2)          # the old cache, read by the last kernel (after the update)
        cache.index_copy_(2, pos, k)
        return before + cache
    torch.manual_seed(0)
    cache, k, pos = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 1, 4), torch.tensor([6])
    ref = cache.clone()
    with config.patch(debug_dir=str(tmp_path)):
        out = kiln.compile(f, backend="cpp")(cache, pos, k)
    torch.testing.assert_close(out, f(ref, pos, k), rtol=0, atol=0)
    torch.testing.assert_close(cache, ref, rtol=0, atol=0)
    assert "# in place of" not in _wrapper_text(tmp_path)


def test_a_source_that_is_a_view_of_the_cache_and_a_returned_cache():
    def from_itself(cache, pos):
        cache.index_copy_(2, pos, cache[:, :, :2])  # source and target share memory
        return cache.sum()

    def returned(cache, pos, k):
        return cache.index_copy_(2, pos, k)
    torch.manual_seed(0)
    cache, pos = torch.randn(1, 2, 8, 4), torch.tensor([5, 6])
    ref = cache.clone()
    torch.testing.assert_close(kiln.compile(from_itself, backend="cpp")(cache, pos), from_itself(ref, pos))
    torch.testing.assert_close(cache, ref, rtol=0, atol=0)
    k = torch.randn(1, 2, 2, 4)
    out = kiln.compile(returned, backend="cpp")(cache, pos, k)
    torch.testing.assert_close(out, returned(ref, pos, k), rtol=0, atol=0)
    torch.testing.assert_close(cache, ref, rtol=0, atol=0)


def test_an_input_that_aliases_the_cache_sees_eagers_values():
    def read_before(cache, other, pos, k):
        y = other * 2                  # the old values: eager reads them before the update
        cache.index_copy_(2, pos, k)
        return y, cache.sum(-1)

    def read_after(cache, other, pos, k):
        cache.index_copy_(2, pos, k)
        return other * 2               # the new values, through the alias
    for fn in (read_before, read_after):
        outs, caches = [], []
        for run in (fn, kiln.compile(fn, backend="cpp")):
            base = torch.arange(64.).reshape(1, 2, 8, 4)
            outs.append(run(base, base[:, :, 2:6], torch.tensor([3]), torch.full((1, 2, 1, 4), -1.0)))
            caches.append(base)
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
        torch.testing.assert_close(caches[1], caches[0], rtol=0, atol=0)


@pytest.mark.parametrize("bad", [8, -1])
def test_an_index_out_of_range_raises_as_eager_and_leaves_the_cache(bad):
    cache, k = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 1, 4)
    ref = cache.clone()
    with pytest.raises(IndexError, match="out of bounds"):
        _cache_update(ref, torch.tensor([bad]), k)
    with pytest.raises(IndexError, match="out of bounds"):
        kiln.compile(_cache_update, backend="cpp")(cache, torch.tensor([bad]), k)
    torch.testing.assert_close(cache, ref, rtol=0, atol=0)


def test_kiln_profile_compiles_the_in_place_update():
    """kiln.profile lowers with OriginLowering (its fallback override passes the in-place reference on)."""
    cache, k, pos = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 1, 4), torch.tensor([2])
    ref = cache.clone()
    with config.patch(raise_on_error=True):
        report = kiln.profile(_cache_update, cache, pos, k, repeat=1, warmup=0)
    expected = _cache_update(ref, pos, k)   # (every call writes the same k at the same position)
    torch.testing.assert_close(report.result, expected, rtol=0, atol=0)
    torch.testing.assert_close(cache, ref, rtol=0, atol=0)
    assert "scatter" in str(report)
