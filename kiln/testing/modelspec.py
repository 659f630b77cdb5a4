"""What a zoo entry is (`ModelSpec`) and the example inputs its entries are called with.

models.py registers the entries (hand-written ones, and the Hugging Face ones of hf_models.py); both
import this module, which imports neither.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from typing import Callable

import torch
from torch import nn

Example = tuple[tuple, dict]   # positional and keyword arguments of the model's forward


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One zoo entry. `make_inputs(batch, generator)` returns the forward's (args, kwargs)."""
    name: str
    factory: Callable[[], nn.Module]
    make_inputs: Callable[[int, torch.Generator], Example]
    batch: int
    seed: int = 0
    suites: tuple[str, ...] = ("full",)
    requires: tuple[str, ...] = ()   # importable modules the entry needs, e.g. ("transformers",)
    description: str = ""

    def available(self) -> bool:
        """Whether every module this entry needs can be imported."""
        return all(importlib.util.find_spec(module) is not None for module in self.requires)


# ---- inputs ----------------------------------------------------------------------------------------------
def _features(dim: int) -> Callable[[int, torch.Generator], Example]:
    return lambda batch, gen: ((torch.randn(batch, dim, generator=gen),), {})


def _images(channels: int, size: int, key: str | None = None) -> Callable[[int, torch.Generator], Example]:
    def make(batch: int, gen: torch.Generator) -> Example:
        x = torch.randn(batch, channels, size, size, generator=gen)
        return ((), {key: x}) if key else ((x,), {})
    return make


def _tokens(vocab: int, length: int) -> Callable[[int, torch.Generator], Example]:
    return lambda batch, gen: ((torch.randint(0, vocab, (batch, length), generator=gen),), {})


def _tokens_with_mask(vocab: int, length: int, keywords: bool = False) -> Callable[[int, torch.Generator],
                                                                                   Example]:
    def make(batch: int, gen: torch.Generator) -> Example:
        ids = torch.randint(0, vocab, (batch, length), generator=gen)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[1::2, length - length // 4:] = 0   # odd rows end with padding
        if keywords:
            return (), {"input_ids": ids, "attention_mask": mask}
        return (ids, mask), {}
    return make


def _encoder_decoder(vocab: int, length: int) -> Callable[[int, torch.Generator], Example]:
    def make(batch: int, gen: torch.Generator) -> Example:
        ids = torch.randint(0, vocab, (batch, length), generator=gen)
        decoder_ids = torch.randint(0, vocab, (batch, length // 2), generator=gen)
        return (), {"input_ids": ids, "decoder_input_ids": decoder_ids}
    return make
