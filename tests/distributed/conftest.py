"""Fixtures of the rank tests (tests/distributed)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A kiln cache of the module's own, which its ranks share."""
    return str(tmp_path_factory.mktemp("kiln_cache"))
