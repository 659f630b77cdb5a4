"""The README's claims that a test can check: the files it cites exist, its first two commands, what
`dynamic=True` does, and that it says the cpp backend needs a C++ compiler."""
from __future__ import annotations

import pathlib
import re
import warnings

import torch

import kiln

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_cited_file_exists():
    cited = set(re.findall(r"[\w./-]+\.(?:md|py)\b", README))
    # (paths in the layout block are relative to kiln/)
    missing = [path for path in sorted(cited) if "/" in path or path.endswith(".md")
               if not (ROOT / path).exists() and not (ROOT / "kiln" / path).exists()]
    assert "DESIGN.md" not in README and not missing, missing


def test_first_two_commands_unchanged():
    commands = README.split("```bash\n", 1)[1].splitlines()[:2]
    assert commands[0].startswith("pip install torch==2.13.0 -e '.[models,plots]' && "
                                  "kiln bench --suite quick")
    assert commands[1].startswith("pip install torch==2.13.0 -e '.[test]' && python -m pytest -q -n 2")


def test_dynamic_true_is_supported_without_a_warning():
    assert "`dynamic=True` is supported" in README and "`dynamic=True` warn" not in README
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = kiln.compile(lambda x: x * 2, backend="eager", dynamic=True)
        for n in (3, 5, 7):
            torch.testing.assert_close(compiled(torch.ones(n)), torch.full((n,), 2.0))
    assert sum(kiln.counters["captures"].values()) == 1 and not kiln.counters["recompiles"]


def test_says_a_cpp_compiler_is_needed():
    assert "needs a C++ compiler, `g++`" in README
