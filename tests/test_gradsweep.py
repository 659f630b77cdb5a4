"""The op_db gradient sweep's CI subset: common entries' backward through the cpp backend vs eager autograd.

Each entry's first sample with its float tensors requiring gradients goes through kiln (differentiated
ahead of time, forward and backward compiled) and must match eager autograd (outputs and input gradients).
None of these hands its graph to torch; the whole sweep (where some do, counted with the reason) is
`python -m kiln.testing.gradsweep`.
"""
from __future__ import annotations

import shutil

import pytest

from kiln import config
from kiln.testing import gradsweep, opinfo

pytestmark = [pytest.mark.skipif(shutil.which(config.get("cxx")) is None, reason="no C++ compiler"),
              pytest.mark.usefixtures("kiln_cache")]

SUBSET = """
abs add addcdiv addcmul addmm amax amin atan2 baddbmm bmm cat clamp cos cosh cumsum div.no_rounding_mode erf
exp expand
flatten gather index_select lerp log log1p log_softmax logsumexp masked_fill matmul max.reduction_with_dim
maximum mean minimum mm mul mv neg nn.functional.conv2d nn.functional.cross_entropy
nn.functional.dropout nn.functional.embedding nn.functional.gelu nn.functional.layer_norm
nn.functional.linear nn.functional.mse_loss nn.functional.relu nn.functional.scaled_dot_product_attention
nn.functional.silu nn.functional.softplus permute pow prod reshape rsqrt sigmoid sin softmax split sqrt
squeeze stack std sub sum t tanh transpose tril unsqueeze var where
""".split()
OPS = {opinfo.op_id(op): op for op in opinfo.op_database()}


@pytest.mark.parametrize("name", [n for n in SUBSET if n in OPS])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_backward_matches_eager(name, dtype):
    import kiln.ops  # noqa: F401
    result = gradsweep.run_op(OPS[name], dtype)
    if result.status == "not applicable":
        pytest.skip(result.message)
    assert result.status == "compiled", f"{name} {dtype}: {result.status}: {result.message}"


def test_subset_names_exist():
    assert [n for n in SUBSET if n not in OPS] == []
