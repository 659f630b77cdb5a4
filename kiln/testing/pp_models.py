"""Models split into pipeline stages (tests/distributed/test_pp.py, `kiln bench --distributed N --strategy pp`).

    stage, example, target = build_stage("nanogpt" | "llama", index, stages, size="test" | "bench")

Each stage is built as pipeline-parallel users build one (torchtitan's way): the whole model is made with
the same seed on every rank, then the stage keeps its share of the blocks, the first stage the embedding and
the last the final norm and the LM head; the rest is dropped. The stage's forward is the model's, with the
parts it does not own skipped. nanoGPT's head is untied from its embedding (they live on different ranks).
`example` is the whole batch of tokens (stage 0 takes it), `target` the next tokens for the loss.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .models import Llama, NanoGPT

SIZES = {  # (vocab, dim, heads, layers, batch, tokens)
    "test": (128, 32, 2, 4, 8, 16),
    "bench": (512, 64, 4, 4, 16, 64),
}
MODELS = ("nanogpt", "llama")


class Stage(nn.Module):
    """One pipeline stage of a decoder: embedding (first stage), blocks, final norm and head (last stage)."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], first: bool, last: bool):
        super().__init__()
        self.embed = model.wte if first and isinstance(model, NanoGPT) else (model.embed if first else None)
        self.wpe = model.wpe if first and isinstance(model, NanoGPT) else None
        self.blocks = nn.ModuleList(blocks)
        norm = getattr(model, "ln_f", None) or getattr(model, "norm", None)
        self.norm = norm if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            h = self.embed(x)
            if self.wpe is not None:
                h = h + self.wpe(torch.arange(x.shape[1], device=x.device))
            x = h
        for block in self.blocks:
            x = block(x)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The last stage's loss (what a schedule's `loss_fn` gets: one microbatch's output and target)."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def build_stage(name: str, index: int, stages: int, size: str = "test",
                seed: int = 0) -> tuple[Stage, torch.Tensor, torch.Tensor]:
    """Stage `index` of `stages` of the model `name`; the batch of tokens and the targets (same on every rank)."""
    vocab, dim, heads, layers, batch, tokens = SIZES[size]
    torch.manual_seed(seed)
    if name == "nanogpt":
        model = NanoGPT(vocab=vocab, dim=dim, heads=heads, layers=layers, max_len=tokens)
        model.lm_head = nn.Linear(dim, vocab, bias=False)  # untied: the two live on different ranks
    elif name == "llama":
        model = Llama(vocab=vocab, dim=dim, heads=heads, kv_heads=max(1, heads // 2), layers=layers,
                      max_len=tokens)
    else:
        raise ValueError(f"unknown pipeline model {name!r}; choose from {', '.join(MODELS)}")
    if layers % stages:
        raise ValueError(f"{layers} blocks do not split into {stages} equal stages")
    per = layers // stages
    stage = Stage(model, list(model.blocks[index * per:(index + 1) * per]), index == 0, index == stages - 1)
    data = torch.Generator().manual_seed(seed + 1)
    sequence = torch.randint(0, vocab, (batch, tokens + 1), generator=data)
    return stage, sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()
