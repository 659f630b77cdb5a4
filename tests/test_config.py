"""kiln.config: the flag registry (KILN_* overrides, patch), and the log channels."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

from kiln import config


@pytest.fixture
def scratch_flags():
    """Names of flags a test defines; they are removed from the registry afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        config._FLAGS.pop(name, None)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_") or k == "KILN_CACHE_DIR"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=120)


def test_builtin_flags_have_defaults():
    # in a process without KILN_* variables (this one may run with KILN_VERIFY=1)
    code = ("from kiln import config; print(config.get('verify'), config.get('recompile_limit'), "
            "config.flags.fuel, 'KILN_VERIFY=False' in config.describe())")
    assert _python(code).stdout.split() == ["False", "8", "-1", "True"]


def test_define_reads_environment_override(monkeypatch, scratch_flags):
    monkeypatch.setenv("KILN_TEST_SCRATCH_INT", "17")
    monkeypatch.setenv("KILN_TEST_SCRATCH_BOOL", "yes")
    monkeypatch.setenv("KILN_TEST_SCRATCH_STR", "hello")
    scratch_flags += ["test_scratch_int", "test_scratch_bool", "test_scratch_str", "test_scratch_none"]
    assert config.define("test_scratch_int", 3, "an int").value == 17
    assert config.define("test_scratch_bool", False, "a bool").value is True
    assert config.define("test_scratch_str", "x", "a string").value == "hello"
    assert config.define("test_scratch_none", None, "optional").value is None
    assert config.get("test_scratch_int") == 17
    assert config.flags.test_scratch_bool is True


@pytest.mark.parametrize("text, value", [("1", True), ("true", True), ("ON", True), ("0", False),
                                         ("off", False), ("", False)])
def test_bool_parsing(monkeypatch, scratch_flags, text, value):
    monkeypatch.setenv("KILN_TEST_SCRATCH_FLAG", text)
    scratch_flags.append("test_scratch_flag")
    assert config.define("test_scratch_flag", not value, "a bool").value is value


def test_bad_environment_value_names_the_variable(monkeypatch, scratch_flags):
    monkeypatch.setenv("KILN_TEST_SCRATCH_BAD", "maybe")
    scratch_flags.append("test_scratch_bad")
    with pytest.raises(ValueError, match="KILN_TEST_SCRATCH_BAD"):
        config.define("test_scratch_bad", False, "a bool")


def test_define_twice_and_unknown_flags(scratch_flags):
    scratch_flags.append("test_scratch_twice")
    config.define("test_scratch_twice", 1, "once")
    with pytest.raises(ValueError, match="defined twice"):
        config.define("test_scratch_twice", 2, "twice")
    with pytest.raises(KeyError, match="no_such_flag"):
        config.get("no_such_flag")
    with pytest.raises(KeyError):
        config.set("no_such_flag", 1)


def test_patch_restores_even_on_error():
    verify, fuel = config.get("verify"), config.get("fuel")
    with config.patch(verify=not verify, fuel=3):
        assert config.get("verify") is (not verify)
        assert config.flags.fuel == 3
    assert config.get("verify") is verify and config.get("fuel") == fuel
    with pytest.raises(ZeroDivisionError):
        with config.patch(verify=not verify):
            1 / 0
    assert config.get("verify") is verify
    with pytest.raises(KeyError):
        with config.patch(no_such_flag=1):
            pass


def test_set_and_attribute_form():
    old = config.get("recompile_limit")
    try:
        config.flags.recompile_limit = 2
        assert config.get("recompile_limit") == 2
    finally:
        config.set("recompile_limit", old)


def test_environment_override_in_a_fresh_process():
    code = "from kiln import config; print(config.get('verify'), config.get('recompile_limit'))"
    assert _python(code).stdout.split() == ["False", "8"]
    assert _python(code, KILN_VERIFY="1", KILN_RECOMPILE_LIMIT="3").stdout.split() == ["True", "3"]
    bad = _python(code, KILN_RECOMPILE_LIMIT="many")
    assert bad.returncode != 0 and "KILN_RECOMPILE_LIMIT" in bad.stderr


def test_log_channels():
    log = config.channel("fusion")
    assert isinstance(log, logging.Logger) and log.name == "kiln.fusion"
    with pytest.raises(ValueError, match="unknown log channel"):
        config.channel("no_such_channel")
    try:
        with config.patch(logs="fusion,+graph"):
            config.refresh_channels()
            assert log.isEnabledFor(logging.INFO) and not log.isEnabledFor(logging.DEBUG)
            assert logging.getLogger("kiln.graph").isEnabledFor(logging.DEBUG)
            assert not logging.getLogger("kiln.kernels").isEnabledFor(logging.INFO)
        with config.patch(logs="all"):
            config.refresh_channels()
            assert all(logging.getLogger("kiln." + c).isEnabledFor(logging.INFO) for c in config.CHANNELS)
    finally:
        config.refresh_channels()
    assert not log.isEnabledFor(logging.INFO)


def test_log_channels_print_to_stderr_when_switched_on():
    code = ("from kiln import config; log = config.channel('fusion'); log.info('fused %d kernels', 3); "
            "log.debug('fuse buf1 into kernel0'); log.warning('careful')")
    off = _python(code).stderr
    assert "fused 3 kernels" not in off and "fuse buf1" not in off and "[kiln.fusion] careful" in off
    on = _python(code, KILN_LOGS="fusion").stderr
    assert "[kiln.fusion] fused 3 kernels" in on and "fuse buf1" not in on
    verbose = _python(code, KILN_LOGS="+fusion").stderr
    assert "[kiln.fusion] fused 3 kernels" in verbose and "[kiln.fusion] fuse buf1 into kernel0" in verbose
    assert "[kiln.fusion] fused 3 kernels" in _python(code, KILN_LOGS="all").stderr
    assert "fused 3 kernels" not in _python(code, KILN_LOGS="graph").stderr
    assert "careful" not in _python(code, KILN_LOGS="-fusion").stderr


def test_unknown_log_channels_fail_loudly():
    """KILN_LOGS=graphs,recompile (typos) was silently ignored: it now fails naming them and listing the
    channels; KILN_LOGS=help lists them and goes on."""
    bad = _python("import kiln", KILN_LOGS="graphs,recompile")
    assert bad.returncode != 0
    assert "unknown log channel(s) 'graphs', 'recompile'" in bad.stderr
    assert all(name in bad.stderr for name in config.CHANNELS)
    ok = _python("from kiln import config; print(config.get('logs'))", KILN_LOGS="help,graph")
    assert ok.returncode == 0 and ok.stdout.strip() == "graph"
    assert re.search(r"recompiles +each recapture", ok.stderr) and "+graph" in ok.stderr
    with pytest.raises(ValueError, match="unknown log channel"):
        with config.patch(logs="fusion,nope"):
            config.refresh_channels()
    config.refresh_channels()


def test_tests_use_a_temporary_cache():
    """The suite writes nothing into the user's home: kiln's cache, here and in the processes tests start,
    is the run's temporary directory (tests/conftest.py)."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    assert os.path.abspath(config.get("cache_dir")) != os.path.abspath(default)
    assert os.environ["KILN_CACHE_DIR"] == config.get("cache_dir")
    child = _python("from kiln import config; print(config.get('cache_dir'))")
    assert child.stdout.strip() == config.get("cache_dir")


def test_cli_version_and_human_sizes(capsys):
    """`kiln --version` prints kiln's and torch's versions; sizes read in binary units."""
    import torch
    from kiln import cli
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("kiln 0.") and f"torch {torch.__version__.split('+')[0]}" in out, out
    assert [cli.human_bytes(n) for n in (0, 1023, 1536, 12_897_484, 3 << 30)] == [
        "0 bytes", "1023 bytes", "1.5 KiB", "12.3 MiB", "3.0 GiB"]
