"""The compile report (kiln.report, KILN_TRACE_DIR, `kiln report`): its content for the quick zoo and for a
model with graph breaks (sections, breaks with reasons and hints, escaping, links, size), the exit-time
page and the CLI, and the page in a real browser: headless chromium renders it (screenshots kept beside the
test's pages and, on the development machine, in /work/notes/s20/), its `<details>` start folded, its
links' targets exist in the rendered DOM and a link into a folded graph opens it. The browser test skips,
saying why, only where chromium is not installed (`apt-get install chromium`)."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch

import kiln
from kiln import config, report_html
from kiln.testing import models

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTES = pathlib.Path("/work/notes/s20")  # (the closing note's screenshots, where that folder's parent is)
ZOO = ("mlp", "resnet_tiny", "nanogpt_tiny")
HOSTILE = "<script>alert('kiln')</script> & \"quoted\""


class Breaky(torch.nn.Module):
    """Two graph breaks: a print() and a Python branch on a tensor's value (.item())."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.lin(x))
        print(HOSTILE, tuple(y.shape))
        if y.sum().item() > 0:
            return (y * 2).tanh()
        return y - 1


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return (x * 3 + 1).relu().sum(-1)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The quick zoo's page and the page of a model with breaks (and a kiln.profile), written by
    kiln.report while the trace_dir flag is set (as KILN_TRACE_DIR sets it)."""
    folder = tmp_path_factory.mktemp("report")
    written = {}
    with config.patch(trace_dir=str(folder)), torch.no_grad():
        kiln.reset()
        for name in ZOO:
            model, (args, kwargs) = models.build(name)
            kiln.compile(model)(*args, **kwargs)
        written["zoo"] = pathlib.Path(kiln.report(str(folder / "zoo.html")))
        kiln.reset()
        breaky = kiln.compile(Breaky())
        breaky(torch.randn(4, 8))
        breaky(torch.randn(4, 8))
        kiln.profile(_scaled, torch.randn(64, 32), repeat=2, warmup=0)
        written["breaks"] = pathlib.Path(kiln.report(str(folder / "breaks.html")))
    kiln.reset()
    return {name: path.read_text() for name, path in written.items()} | {"paths": written}


def _ids(page: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page))


def _links(page: str) -> set[str]:
    return set(re.findall(r'href="#([^"]+)"', page))


def test_every_section_is_there(pages):
    for name in ("zoo", "breaks"):
        assert {"summary", "breaks", "recompiles", "captures", "compiles", "profiles", "counters"} <= \
            _ids(pages[name]), name
    zoo = pages["zoo"]
    for frame in ("MLP.forward", "ResNet.forward", "NanoGPT.forward"):
        assert f"{frame} (" in zoo, frame
    assert "Graph breaks (0)" in zoo and "None: every captured frame ran as whole graphs" in zoo
    # each compile: its passes with times, its kernels with the user lines lowered into them
    assert re.search(r"<td>lower</td><td class=\"num\">\d+\.\d</td>", zoo)
    assert "user lines fused into it" in zoo and "models.py:" in zoo
    kernel_rows = re.findall(r"<tr><td>kernel\d+</td><td>kernel</td>.*?</tr>", zoo)
    assert kernel_rows and any("models.py:" in row for row in kernel_rows)
    # graphs print with the user's source lines as comments
    assert "self.head(self.body(x))" in zoo
    assert "generated C++" in zoo and "Python wrapper" in zoo and "guards (" in zoo


def test_breaks_are_listed_with_reasons_hints_and_links(pages):
    page = pages["breaks"]
    assert "Graph breaks (2)" in page
    cards = re.findall(r'<div class="card brk" id="break-(\d+)">(.*?)</div></div>', page, re.S)
    text = " ".join(body for _, body in cards)
    assert "call to print()" in text and "item()" in text
    assert text.count("hint:") >= 2
    assert "test_report.py" in text  # the user's file and line
    for n, body in cards:  # each break links its capture, which links back
        capture = re.search(r'href="#(capture-\d+)"', body)[1]
        assert f'href="#break-{n}"' in page and capture in _ids(page)
    # the resume functions' captures are linked from the frame that broke
    assert "continues in" in page and "resumed at line" in page
    # the profile is on the page with its rows
    assert "kiln.profile _scaled" in page and 'id="profile-0"' in page


def test_user_text_is_escaped(pages):
    page = pages["breaks"]
    assert "<script>alert(" not in page
    assert "&lt;script&gt;alert(" in page
    assert page.count("<script>") == 1  # the page's own few lines


def test_links_resolve_and_sections_fold(pages):
    for name in ("zoo", "breaks"):
        page = pages[name]
        missing = _links(page) - _ids(page)
        assert not missing, (name, sorted(missing))
        assert "<details open" not in page
        assert page.count("<details") >= 6


def test_the_quick_zoo_page_is_small(pages):
    size = len(pages["zoo"].encode())
    assert size < 1 << 20, f"the quick zoo's report is {size} bytes"


def test_long_text_is_cut_with_a_note():
    text = "\n".join(f"line {i}" for i in range(1000))
    cut = report_html.cut(text, 100)
    assert len(cut) < 200 and cut.startswith("line 0\n") and "more characters" in cut
    assert report_html.cut("short", 100) == "short"


def test_trace_dir_writes_a_page_at_exit_and_the_cli_says_where(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import torch, kiln

        @kiln.compile
        def f(x):
            y = x.sin()
            print("between graphs")
            return y.cos() + 1

        f(torch.randn(8))
    """))
    out = tmp_path / "pages"
    run = subprocess.run([sys.executable, "-m", "kiln.cli", "report", "--out", str(out), str(script)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    written = re.findall(r"kiln report: wrote (\S+\.html)", run.stdout)
    assert len(written) == 1 and pathlib.Path(written[0]).parent == out, run.stdout
    page = pathlib.Path(written[0]).read_text()
    assert "call to print()" in page and "Graph breaks (1)" in page
    assert re.fullmatch(r"kiln_report_\d+\.html", pathlib.Path(written[0]).name)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _browser(binary: str, profile: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", *args]
    # (chromium also writes crash reports and dconf state under HOME and XDG dirs: the test's own instead)
    env = dict(os.environ, HOME=str(profile), XDG_CONFIG_HOME=str(profile / "config"),
               XDG_CACHE_HOME=str(profile / "cache"))
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(_chromium() is None,
                    reason="headless chromium is not installed (apt-get install chromium; .ci/run does)")
def test_the_page_in_headless_chromium(pages, tmp_path, record_property):
    binary = _chromium()
    shots = []
    for name in ("zoo", "breaks"):
        path = pages["paths"][name]
        url = path.resolve().as_uri()
        dom = _browser(binary, tmp_path / f"profile-{name}", "--dump-dom", url)
        assert dom.returncode == 0 and "</html>" in dom.stdout, dom.stderr[-2000:]
        rendered = dom.stdout
        assert "kiln compile report" in rendered
        details = re.findall(r"<details\b[^>]*>", rendered)
        assert len(details) >= 6 and not [d for d in details if " open" in d], details[:5]
        missing = _links(rendered) - _ids(rendered)
        assert not missing, (name, sorted(missing))
        # a link into a folded graph opens it (the page's few lines of script)
        target = next(i for i in sorted(_ids(rendered)) if i.startswith("graph-"))
        opened = _browser(binary, tmp_path / f"profile-{name}-hash", "--dump-dom", f"{url}#{target}").stdout
        assert re.search(rf'<details id="{target}" open', opened), target
        shot = path.with_suffix(".png")
        run = _browser(binary, tmp_path / f"profile-{name}-shot", f"--screenshot={shot}",
                       "--window-size=1280,2400", url)
        assert shot.is_file() and shot.stat().st_size > 10_000, run.stderr[-2000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        shots.append(shot)
    if NOTES.parent.is_dir():
        NOTES.mkdir(exist_ok=True)
        for shot in shots:
            shutil.copy(shot, NOTES / f"report_{shot.name}")
            shutil.copy(shot.with_suffix(".html"), NOTES / f"report_{shot.stem}.html")
    record_property("screenshots", ", ".join(map(str, shots)))
    print("screenshots:", *shots)


def test_the_record_holds_captures_weakly():
    """The record is always on: it must not be what keeps a dropped compiled function's capture entries
    (their graphs and the parameters they hold) alive."""
    import gc
    from kiln import tracing
    from kiln.capture import cache as capture_cache
    kiln.reset()
    compiled = kiln.compile(lambda x: torch.relu(x) * 2, backend="eager")
    compiled(torch.randn(2, 3))
    (entry,) = tracing.TRACE.captures
    alive = weakref.ref(entry)
    del entry, compiled
    capture_cache.reset()  # the capture caches let go (not the record: kiln.reset() would clear it too)
    gc.collect()
    assert alive() is None and tracing.TRACE.captures == []
