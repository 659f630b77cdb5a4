"""Models for tensor parallelism (tests/distributed/test_tp.py, `kiln bench --distributed N --strategy tp`).

    model, plan, example = build("mlp" | "llama", size="test" | "bench", bias=False)

`plan` is a ColwiseParallel/RowwiseParallel plan for `parallelize_module`; models are seeded (the same on
every rank). The models are written as tensor-parallel users write them: sizes that shrink under the plan
(heads, hidden width) are read from the tensors (`view(b, t, -1, head_dim)`), not fixed.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .models import RMSNorm   # (the zoo's)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=bias)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MLPStack(nn.Module):
    """Two SwiGLU blocks with residuals (the issue's example)."""

    def __init__(self, dim: int = 64, hidden: int = 128, bias: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList([SwiGLU(dim, hidden, bias), SwiGLU(dim, hidden, bias)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / world of them
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class LlamaBlock(nn.Module):
    """A LLaMA-style block: RMSNorm, causal attention, RMSNorm, SwiGLU MLP, residuals; then a norm."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


SIZES = {  # (dim, hidden, heads, batch, tokens)
    "test": (64, 128, 4, 2, 16),
    "bench": (256, 1024, 8, 4, 64),
}


def build(name: str, bias: bool = False, size: str = "test") -> tuple[nn.Module, dict, torch.Tensor]:
    """The model (seeded: the same on every rank), its Colwise/Rowwise plan and an example input."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    dim, hidden, heads, batch, tokens = SIZES[size]
    torch.manual_seed(0)
    if name == "mlp":
        model = MLPStack(dim, hidden, bias=bias)
        plan = {}
        for i in range(len(model.blocks)):
            plan.update({f"blocks.{i}.gate": ColwiseParallel(), f"blocks.{i}.up": ColwiseParallel(),
                         f"blocks.{i}.down": RowwiseParallel()})
        return model, plan, torch.randn(batch, tokens, dim)
    if name == "llama":
        model = LlamaBlock(dim, heads, hidden)
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.gate": ColwiseParallel(), "feed_forward.up": ColwiseParallel(),
                "feed_forward.down": RowwiseParallel()}
        return model, plan, torch.randn(batch, tokens, dim)
    raise ValueError(f"unknown tensor-parallel model {name!r}: mlp or llama")
