"""KILN_LOGS, one test per channel: each channel, switched on, prints what `KILN_LOGS=help` says it prints
(kiln.config.CHANNELS, and VERBOSE for `+name`), on a small compile that exercises it; `-name` silences a
channel's warnings. The channels print on whatever sys.stderr is, so capsys reads them."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys

import pytest
import torch

import kiln
from kiln import config
from kiln.runtime import forget_loaded

needs_cxx = pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler")


@contextlib.contextmanager
def logs(spec: str, **flags):
    """KILN_LOGS=spec (and other flags) for a block, as if set in the environment."""
    try:
        with config.patch(logs=spec, **flags):
            config.refresh_channels()
            yield
    finally:
        config.refresh_channels()


def logged(capsys, spec: str, run, **flags) -> str:
    """What `run()` prints on stderr with KILN_LOGS=spec."""
    capsys.readouterr()
    with logs(spec, **flags):
        run()
    return capsys.readouterr().err


def scaled(x):
    return (x * 2).relu().sum(-1)


def exp_and_sum(x):
    y = x.exp()
    return y, y.sum(-1)


def compile_fresh(fn, *inputs, backend="cpp"):
    """A compile as a new process makes it: no captures, nothing loaded in memory, the disk cache as it is."""
    kiln.reset()
    forget_loaded()
    return kiln.compile(fn, backend=backend)(*inputs)


def test_every_channel_has_a_test_here():
    tested = {name.removeprefix("test_channel_") for name in globals() if name.startswith("test_channel_")}
    assert set(config.CHANNELS) <= tested, set(config.CHANNELS) - tested


def test_levels_of_plain_plus_and_minus_names():
    with logs("graph,+fusion,-prims"):
        levels = config.channel_levels()
        assert (levels["graph"], levels["fusion"], levels["prims"]) == (logging.INFO, logging.DEBUG,
                                                                        logging.ERROR)
        assert levels["kernels"] == logging.WARNING  # (not named: warnings only)
        assert logging.getLogger("kiln.fusion").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("kiln.graph").isEnabledFor(logging.DEBUG)
    with logs("+all,-cache,graph"):  # a channel named on its own overrides all, wherever it stands
        levels = config.channel_levels()
        assert levels["cache"] == logging.ERROR and levels["graph"] == logging.INFO
        assert levels["kernels"] == logging.DEBUG
    with pytest.raises(ValueError, match="unknown log channel.*'\\+graphs'"):
        with logs("+graphs"):
            pass
    assert "+output_code" in config.channels_help() and "'-name' silences" in config.channels_help()


def test_channel_capture(capsys):
    kiln.reset()
    err = logged(capsys, "capture", lambda: kiln.compile(scaled, backend="eager")(torch.randn(4, 8)))
    assert re.search(r"^\[kiln\.capture\] captured scaled in \d+\.\d ms \(\d+ guards\)$", err, re.M), err


def test_channel_guards(capsys):
    kiln.reset()
    err = logged(capsys, "guards", lambda: kiln.compile(scaled, backend="eager")(torch.randn(4, 8)))
    assert "[kiln.guards] guards of scaled:" in err
    assert "x: Tensor float32[4, 8] strides=(8, 1)" in err and "torch.is_grad_enabled() is True" in err


def test_channel_recompiles(capsys):
    kiln.reset()
    compiled = kiln.compile(scaled, backend="eager")
    compiled(torch.randn(4, 8))
    err = logged(capsys, "recompiles", lambda: compiled(torch.randn(4, 8, dtype=torch.float64)))
    assert "[kiln.recompiles] recompiling scaled: guard failed: x: Tensor float32[4, 8]" in err, err


def item_of_sum(x):
    y = x.sum()
    return y.item()


def test_channel_breaks(capsys):
    kiln.reset()
    err = logged(capsys, "breaks", lambda: kiln.compile(item_of_sum, backend="eager")(torch.randn(3)))
    assert f"[kiln.breaks] graph break in item_of_sum at {__file__}:" in err and "item" in err, err


def test_channel_graph(capsys):
    kiln.reset()
    err = logged(capsys, "graph", lambda: kiln.compile(scaled, backend="eager")(torch.randn(4, 8)))
    assert "[kiln.graph] captured scaled:\n# capture of scaled\ndef scaled(x):" in err, err
    assert "torch.Tensor.__mul__(x, 2)  # f32[4, 8]" in err
    assert "# " + __file__ not in err  # (source lines are +graph's)
    kiln.reset()
    err = logged(capsys, "+graph", lambda: kiln.compile(scaled, backend="eager")(torch.randn(4, 8)))
    line = scaled.__code__.co_firstlineno + 1
    assert f"    # {__file__}:{line}: return (x * 2).relu().sum(-1)\n    t0 = torch.Tensor.__mul__" in err, err
    # the printed graph still runs (the source lines are comments)
    code = err.split("[kiln.graph] captured scaled:\n", 1)[1].split("\n\n", 1)[0]
    env = {"torch": torch}
    exec(code, env)
    x = torch.randn(4, 8)
    torch.testing.assert_close(env["scaled"](x)[0], scaled(x))


@needs_cxx
def test_channel_prims(capsys, tmp_path):
    with config.patch(cache_dir=str(tmp_path)):
        err = logged(capsys, "prims", lambda: compile_fresh(scaled, torch.randn(4, 8)))
    assert "[kiln.prims] scaled in prims:\n# scaled decomposed into prims\ndef scaled(x):" in err, err
    assert "prims.mul(x, 2" in err and "prims.sum(" in err


@needs_cxx
def test_channel_passes(capsys, tmp_path):
    x = torch.randn(4, 8)
    with config.patch(cache_dir=str(tmp_path)):
        cold = logged(capsys, "passes", lambda: compile_fresh(scaled, x))
        warm = logged(capsys, "passes", lambda: compile_fresh(scaled, x))
        fuel = logged(capsys, "+passes", lambda: compile_fresh(exp_and_sum, x), fuel=100, graph_cache=False)
    assert re.search(r"^\[kiln\.passes\] cpp scaled: to_prims [\d.]+, dce .* fuse [\d.]+, .*build [\d.]+ "
                     r"\([\d.]+ ms\)$", cold, re.M), cold
    assert "pass fuse" not in cold and "fuel:" not in cold  # (each pass and decision: +passes)
    assert re.search(r"\[kiln\.passes\] cpp scaled: loaded from the graph cache \(\w+\): passes skipped",
                     warm), warm
    assert "to_prims" not in warm
    assert re.search(r"cpp exp_and_sum: pass fuse [\d.]+ ms", fuel), fuel
    assert "[kiln.passes] fuel: decision 1: fuse buf1 into kernel0 (pass fuse)" in fuel


@needs_cxx
def test_channel_fusion(capsys, tmp_path):
    x = torch.randn(4, 8)
    with config.patch(cache_dir=str(tmp_path)):
        cold = logged(capsys, "fusion", lambda: compile_fresh(scaled, x))
        warm = logged(capsys, "fusion", lambda: compile_fresh(scaled, x))
        verbose = logged(capsys, "+fusion", lambda: compile_fresh(exp_and_sum, x), graph_cache=False)
    assert "[kiln.fusion] cpp scaled: 1 kernels, 0 externs/fallbacks\nkernel0: " in cold, cold
    assert "fuse " not in cold.replace("fusion", "")
    assert "cpp scaled: loaded from the graph cache" in warm and "fusion skipped" in warm, warm
    assert "1 kernels" not in warm
    assert "[kiln.fusion] fuse buf1 into kernel0: outer=[4] inner=[8] members=[buf0:inner, buf1:reduction]" \
        in verbose, verbose


@needs_cxx
def test_channel_kernels(capsys, tmp_path):
    with config.patch(cache_dir=str(tmp_path)):
        err = logged(capsys, "kernels", lambda: compile_fresh(scaled, torch.randn(4, 8)))
    built = re.search(r"\[kiln\.kernels\] built (\S+\.so) in [\d.]+ s", err)
    assert built and os.path.isfile(built[1]) and built[1].startswith(str(tmp_path)), err
    assert re.search(r"compiled scaled for cpp in [\d.]+ s: 1 kernels, 0 externs/fallbacks", err), err


@needs_cxx
def test_channel_output_code(capsys, tmp_path):
    x = torch.randn(4, 8)
    with config.patch(cache_dir=str(tmp_path / "cache")):
        err = logged(capsys, "output_code", lambda: compile_fresh(scaled, x))
        where = re.search(r"\[kiln\.output_code\] cpp scaled: kernels in (\S+\.so); the C\+\+ source is not "
                          r"kept on disk", err)
        assert where and os.path.isfile(where[1]), err
        assert 'extern "C"' not in err  # (the source itself is +output_code's)
        dumped = logged(capsys, "output_code", lambda: compile_fresh(scaled, x), debug_dir=str(tmp_path / "d"))
        folder = re.search(r"C\+\+ source and IR dumps in (\S+)$", dumped, re.M)
        assert folder and os.path.isfile(os.path.join(folder[1], "kernels.cpp")), dumped
        verbose = logged(capsys, "+output_code", lambda: compile_fresh(scaled, x), graph_cache=False)
    assert "cpp scaled: the generated C++ source:\n" in verbose and 'extern "C"' in verbose, verbose
    assert "cpp scaled: the Python wrapper:\n" in verbose and "def kiln_call(x):" in verbose


@needs_cxx
def test_channel_cache(capsys, tmp_path):
    x = torch.randn(4, 8)
    with config.patch(cache_dir=str(tmp_path)):
        cold = logged(capsys, "cache", lambda: compile_fresh(scaled, x))
        warm = logged(capsys, "cache", lambda: compile_fresh(scaled, x))
    so = re.search(r"\[kiln\.cache\] kernel cache miss (\S+\.so): building it", cold)
    assert so and f"[kiln.cache] kernel cache wrote {so[1]}" in cold, cold
    assert re.search(r"\[kiln\.cache\] graph cache miss \w+", cold) and "graph cache wrote " in cold
    assert re.search(r"\[kiln\.cache\] graph cache hit \S+\.graph", warm), warm
    assert f"[kiln.cache] kernel cache hit {so[1]}" in warm and "miss" not in warm


def test_channel_bench(capsys, tmp_path):
    from kiln.bench import runner

    def launch(job, timeout_s):
        return {"status": "pass", "compiled_ms": 1.0, "eager_ms": 1.0, "speedup": 1.0, "compile_s": 0.0}
    options = runner.Options(models=["mlp"], backends=("eager", "kiln"), out=str(tmp_path), plots=False,
                             progress=False)
    err = logged(capsys, "bench", lambda: runner.run(options, launch=launch))
    assert "[kiln.bench] mlp / eager: compile (cold) and measure\n[kiln.bench] mlp / eager: pass\n" in err, err
    assert "[kiln.bench] mlp / kiln: compile (warm)\n[kiln.bench] mlp / kiln: warm pass\n" in err
    assert "[kiln.bench] row mlp / eager: pass\n" in err and "[kiln.bench] row mlp / kiln: pass\n" in err


def sized(x):
    if x.shape[0] > 2:
        x = x * 2
    return x.relu() + x.shape[0]


@needs_cxx
def test_channel_dynamic(capsys, tmp_path):
    kiln.reset()

    def calls():
        compiled = kiln.compile(sized, backend="cpp")
        for n in (4, 5, 6):
            x = torch.randn(n, 3)
            torch.testing.assert_close(compiled(x), sized(x))
    with config.patch(cache_dir=str(tmp_path)):
        err = logged(capsys, "dynamic", calls)
        verbose = logged(capsys, "+dynamic", lambda: (kiln.reset(), calls()))
    assert "[kiln.dynamic] sized: x.size(0) 4 -> 5: now dynamic" in err, err
    assert "[kiln.dynamic] symbolic sizes of sized:\n  s0 = x.size(0) (was 5)\n  (s0 > 2)" in err
    assert "[kiln.dynamic] sized: compiled once for every size of s0" in err
    assert "size fact: " not in err and "[kiln.dynamic] size fact: s0 > 2" in verbose, verbose


def test_minus_silences_a_channels_warnings(capsys, tmp_path, monkeypatch):
    """KILN_DEBUG_DIR announces its directory as a `kernels` warning: printed whatever KILN_LOGS names,
    but not with -kernels."""
    from kiln.runtime import debug_dump
    monkeypatch.setattr(debug_dump, "_announced", set())
    files = {"a.py": "x = 1\n"}
    err = logged(capsys, "", lambda: debug_dump.dump_graph(str(tmp_path / "a"), "g", "g (f.py:1)", files))
    assert "[kiln.kernels] KILN_DEBUG_DIR: dumping" in err, err
    err = logged(capsys, "-kernels", lambda: debug_dump.dump_graph(str(tmp_path / "b"), "g", "g", files))
    assert "KILN_DEBUG_DIR" not in err and (tmp_path / "b" / "index.txt").is_file()


def test_plus_name_in_the_environment(tmp_path):
    """KILN_LOGS=+graph in a fresh process prints the graph with its source lines."""
    import subprocess
    script = tmp_path / "prog.py"
    script.write_text("import torch, kiln\n\ndef f(x):\n    return x.exp() + 1\n\n"
                      "kiln.compile(f, backend='eager')(torch.randn(3))\n")
    env = dict(os.environ, KILN_LOGS="+graph,-prims", PYTHONPATH=os.path.dirname(os.path.dirname(
        os.path.abspath(kiln.__file__))))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"    # {script}:4: return x.exp() + 1\n" in out.stderr, out.stderr


def test_channel_output_code_triton(capsys, tmp_path):
    """The triton backend's kernels are Python modules in the cache: output_code names them (here on
    Triton's interpreter, TRITON_INTERPRET=1, tests/conftest.py)."""
    pytest.importorskip("triton")
    with config.patch(cache_dir=str(tmp_path)):
        err = logged(capsys, "output_code", lambda: compile_fresh(scaled, torch.randn(4, 8), backend="triton"))
    where = re.search(r"\[kiln\.output_code\] triton scaled: kernels in (\S+\.py)$", err, re.M)
    assert where and "@triton.jit" in open(where[1]).read(), err
