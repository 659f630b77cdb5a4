"""Integer arithmetic past the type's range wraps in kiln's kernels as in eager's (two's complement), and
an int constant past the range is taken modulo the width as eager takes it. Before, signed overflow in the
generated C++ was undefined: g++ folded `(torch.arange(5) + 2**62) * 4` into INT64_MAX (eager: 0, 4, 8, ...),
and `x - 2**63` crashed the lowering."""
import shutil

import pytest
import torch

import kiln.ops
from kiln import config
from kiln.backends.cpp import compile_graph

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache_raising")]

PROGRAMS = {
    "arange times": lambda x: (torch.arange(x.shape[0]) + 2 ** 62) * 4 + x,
    "sum then times": lambda x: (x + 2 ** 62).sum() * 4,
    "prod": lambda x: (x + 2 ** 40).prod(),
    "neg of min": lambda x: -(x - 2 ** 63),
    "int64 past 2**63": lambda x: x + (2 ** 64 - 1),
    "int32": lambda x: (x.to(torch.int32) + 2 ** 40 + 5) * 4 - 2 ** 31,
    "int16 neg": lambda x: -(x.to(torch.int16) - 2 ** 15),
    "int8": lambda x: x.to(torch.int8) * 100 + 300,
    "column sum": lambda x: (x.view(-1, 1) * 2 ** 61 + torch.arange(8)).sum(0),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_integer_overflow_wraps_as_eager(name):
    fn = PROGRAMS[name]
    x = torch.arange(9, dtype=torch.int64)
    got, want = compile_graph(kiln.ops.trace(fn, x), [x])(x), fn(x)
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
