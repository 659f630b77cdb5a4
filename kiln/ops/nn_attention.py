"""Decomposition of F.multi_head_attention_forward (nn.MultiheadAttention, nn.Transformer* layers).

The common path — in-projection (packed or separate weights), optional bool/float attention and key padding
masks, need_weights with or without head averaging, dropout while training — follows eager's steps: with
need_weights the scores are softmax(q / sqrt(head_dim) @ k^T + mask), dropped out, otherwise
scaled_dot_product_attention. bias_k/bias_v, add_zero_attn and static keys and values fall back.

Also here: scaled_dot_product_attention with dropout (`attention_with_dropout`), which eager's CPU runs on its
math path, op for op, so that the same seed drops the same attention weights.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ..prims.registry import check
from .nn_layout import safe_softmax
from .registry import NoDecomposition, register


def attention_with_dropout(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float, is_causal: bool,
                           scale: float | None) -> Any:
    """sdpa with dropout_p > 0 as eager's CPU computes it (its math path; the fused CPU kernel has no dropout):
    safe_softmax(q @ k^T * scale + mask), then torch.dropout of those weights (one bernoulli draw over their
    shape), @ v. The scores come out of the matmul unscaled, and the scale, mask, softmax and dropout fuse
    into one kernel (eager scales q and k by sqrt(scale) each: the same product up to rounding).
    `attn_mask` is additive (a bool mask already made 0 / -inf) and checked by the caller."""
    if query.dtype not in (torch.float32, torch.float64):
        raise NoDecomposition(f"scaled_dot_product_attention with dropout in {query.dtype}")
    s = scale if scale is not None else 1.0 / math.sqrt(int(query.shape[-1]))  # (a symbolic size: guarded)
    scores = torch.matmul(query, torch.transpose(key, -2, -1)) * s
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        keep = torch.tril(torch.ones([length, source], dtype=torch.bool, device=query.device))
        attn_mask = torch.where(keep, torch.zeros([], dtype=query.dtype, device=query.device), float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask
    weights = torch.dropout(safe_softmax(scores, -1), dropout_p, True)
    return torch.matmul(weights, value)


def _float_mask(mask: Any, dtype: torch.dtype) -> Any:
    """A bool mask as 0 / -inf in dtype (True = masked out); a float mask as it is."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.masked_fill(torch.zeros_like(mask, dtype=dtype), mask, float("-inf"))
    if not mask.dtype.is_floating_point:
        raise NoDecomposition("multi_head_attention_forward with an integer mask")  # eager refuses it
    return mask


def _in_projection(query: Any, key: Any, value: Any, embed: int, in_proj_weight: Any, in_proj_bias: Any,
                   separate: bool, q_weight: Any, k_weight: Any, v_weight: Any) -> tuple[Any, Any, Any]:
    if separate:
        if q_weight is None or k_weight is None or v_weight is None:
            raise NoDecomposition("multi_head_attention_forward without its projection weights")
        biases = [None] * 3 if in_proj_bias is None else list(torch.chunk(in_proj_bias, 3))
        return (F.linear(query, q_weight, biases[0]), F.linear(key, k_weight, biases[1]),
                F.linear(value, v_weight, biases[2]))
    if in_proj_weight is None:
        raise NoDecomposition("multi_head_attention_forward without in_proj_weight")
    if key is value and query is key:  # self-attention: one projection, split in three
        proj = F.linear(query, in_proj_weight, in_proj_bias)
        return tuple(torch.narrow(proj, -1, i * embed, embed) for i in range(3))  # type: ignore[return-value]
    weights = torch.split(in_proj_weight, [embed, embed, embed])
    biases = [None] * 3 if in_proj_bias is None else torch.split(in_proj_bias, [embed, embed, embed])
    return (F.linear(query, weights[0], biases[0]), F.linear(key, weights[1], biases[1]),
            F.linear(value, weights[2], biases[2]))


@register(F.multi_head_attention_forward)
def multi_head_attention_forward(
        query: Any, key: Any, value: Any, embed_dim_to_check: int, num_heads: int, in_proj_weight: Any,
        in_proj_bias: Any, bias_k: Any, bias_v: Any, add_zero_attn: bool, dropout_p: float,
        out_proj_weight: Any, out_proj_bias: Any, training: bool = True, key_padding_mask: Any = None,
        need_weights: bool = True, attn_mask: Any = None, use_separate_proj_weight: bool = False,
        q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None, static_k: Any = None,
        static_v: Any = None, average_attn_weights: bool = True, is_causal: bool = False) -> Any:
    extras = (bias_k, bias_v, static_k, static_v)
    if add_zero_attn or any(e is not None for e in extras):
        raise NoDecomposition("multi_head_attention_forward with bias_k/bias_v, add_zero_attn or static k/v")
    if not training:
        dropout_p = 0.0
    batched = query.ndim == 3
    if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise NoDecomposition("multi_head_attention_forward with unusual input ranks")  # eager's checks
    if not batched:
        query, key, value = _unsqueeze_all(query, key, value)
        if key_padding_mask is not None:
            key_padding_mask = torch.unsqueeze(key_padding_mask, 0)
    tgt_len, bsz, embed = query.shape
    src_len = key.shape[0]
    check(embed == embed_dim_to_check, lambda: f"was expecting embedding dimension of {embed_dim_to_check}, "
          f"but got {embed}", AssertionError)
    head_dim = embed // num_heads
    check(head_dim * num_heads == embed, lambda: f"embed_dim {embed} not divisible by num_heads {num_heads}",
          AssertionError)
    if (use_separate_proj_weight and list(key.shape[:2]) != list(value.shape[:2])) or \
            (not use_separate_proj_weight and list(key.shape) != list(value.shape)):
        raise NoDecomposition("multi_head_attention_forward: key and value shapes differ")

    key_padding_mask = _float_mask(key_padding_mask, query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                           "module method `generate_square_subsequent_mask` to create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None
    else:
        attn_mask = _float_mask(attn_mask, query.dtype)
        if key_padding_mask is not None:
            is_causal = False

    q, k, v = _in_projection(query, key, value, embed, in_proj_weight, in_proj_bias, use_separate_proj_weight,
                             q_proj_weight, k_proj_weight, v_proj_weight)
    if attn_mask is not None:
        if attn_mask.ndim == 2:
            check(list(attn_mask.shape) == [tgt_len, src_len], lambda: f"The shape of the 2D attn_mask is "
                  f"{torch.Size(attn_mask.shape)}, but should be {(tgt_len, src_len)}.", RuntimeError)
            attn_mask = torch.unsqueeze(attn_mask, 0)
        elif attn_mask.ndim == 3:
            want = [bsz * num_heads, tgt_len, src_len]
            check(list(attn_mask.shape) == want, lambda: f"The shape of the 3D attn_mask is "
                  f"{torch.Size(attn_mask.shape)}, but should be {tuple(want)}.", RuntimeError)
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.ndim} is not supported")

    # (L, N, E) -> (N * H, L, head_dim)
    q = torch.transpose(q.reshape([tgt_len, bsz * num_heads, head_dim]), 0, 1)
    k = torch.transpose(k.reshape([src_len, bsz * num_heads, head_dim]), 0, 1)
    v = torch.transpose(v.reshape([src_len, bsz * num_heads, head_dim]), 0, 1)
    if key_padding_mask is not None:
        check(list(key_padding_mask.shape) == [bsz, src_len], lambda: f"expecting key_padding_mask shape of "
              f"{(bsz, src_len)}, but got {torch.Size(key_padding_mask.shape)}", RuntimeError)
        padding = key_padding_mask.reshape([bsz, 1, 1, src_len]).expand(-1, num_heads, -1, -1)
        padding = padding.reshape([bsz * num_heads, 1, src_len])
        attn_mask = padding if attn_mask is None else attn_mask + padding

    if need_weights:
        q_scaled = q * math.sqrt(1.0 / float(head_dim))
        kt = torch.transpose(k, -2, -1)
        scores = torch.bmm(q_scaled, kt) if attn_mask is None else torch.baddbmm(attn_mask, q_scaled, kt)
        weights = F.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, dropout_p)
        out = torch.transpose(torch.bmm(weights, v), 0, 1).reshape([tgt_len * bsz, embed])
        out = F.linear(out, out_proj_weight, out_proj_bias).reshape([tgt_len, bsz, -1])
        weights = weights.reshape([bsz, num_heads, tgt_len, src_len])
        if average_attn_weights:
            weights = torch.mean(weights, 1)
        if not batched:
            out, weights = torch.squeeze(out, 1), torch.squeeze(weights, 0)
        return out, weights

    if attn_mask is not None:
        if attn_mask.shape[0] == 1 and attn_mask.ndim == 3:
            attn_mask = torch.unsqueeze(attn_mask, 0)
        else:
            attn_mask = attn_mask.reshape([bsz, num_heads, -1, src_len])
    q = q.reshape([bsz, num_heads, tgt_len, head_dim])
    k = k.reshape([bsz, num_heads, src_len, head_dim])
    v = v.reshape([bsz, num_heads, src_len, head_dim])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = torch.permute(out, [2, 0, 1, 3]).reshape([bsz * tgt_len, embed])
    out = F.linear(out, out_proj_weight, out_proj_bias).reshape([tgt_len, bsz, -1])
    if not batched:
        out = torch.squeeze(out, 1)
    return out, None


def _unsqueeze_all(query: Any, key: Any, value: Any) -> tuple[Any, Any, Any]:
    """Add the batch dim at 1, keeping `query is key is value` identities (self-attention is detected so)."""
    q = torch.unsqueeze(query, 1)
    k = q if key is query else torch.unsqueeze(key, 1)
    v = k if value is key else (q if value is query else torch.unsqueeze(value, 1))
    return q, k, v
