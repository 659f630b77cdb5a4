"""Every `transformers` model type as a census entry `hf:<model_type>`: built from a small config at
transformers' defaults (nothing is downloaded), with inputs made from the model's own signature.

The config is `AutoConfig.for_model(type, **sizes)`, where `sizes` lowers only the size settings the type's
default config has (width, layers, heads, feed-forward width, experts, vocabulary, positions, image side),
in sub-configs too (`text_config`, `vision_config`, ...); everything else keeps transformers' default
(attention implementation, cache, activation, norms, dropout). The model is the type's `AutoModel` class
(or its first task head where it has no base model), seeded, in eval mode.

Inputs follow the model's `main_input_name`: token ids (2, 32), images (2, channels, side, side), raw audio
(2, 8000) or spectrogram features; an encoder-decoder also gets decoder token ids, a model pairing text with
images both. Candidates are tried eagerly in order and the first that runs is the entry's input. A type
that cannot be built or called this way is not a kiln result: `build` raises `Unbuildable` with the
reason, and the census lists it as such.

    from kiln.testing import hf_all
    hf_all.model_types()              # every type transformers registers
    model, (args, kwargs) = hf_all.build("mixtral")
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

import torch
from torch import nn

PREFIX = "hf:"
BATCH = 2
LENGTH = 32
VOCAB = 1000
IMAGE = 64
MAX_PARAMETERS = 100_000_000   # a small config larger than this is not built (a census row says so)

# size settings and the value they are lowered to (never raised: min(default, value))
_WIDTH = ("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim", "word_embed_proj_dim",
          "projection_dim", "text_embed_dim", "vision_embed_dim", "hidden_dim", "embedding_size")
_LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
           "num_encoder_layers", "num_decoder_layers", "depth", "num_blocks")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
          "num_heads", "num_encoder_attention_heads", "num_decoder_attention_heads", "num_key_value_heads",
          "n_kv_heads", "num_kv_heads", "multi_query_group_num")
_FFN = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
        "ffn_hidden_size", "mlp_dim")
_SMALL = {**{k: 64 for k in _WIDTH}, **{k: 2 for k in _LAYERS}, **{k: 2 for k in _HEADS},
          **{k: 128 for k in _FFN},
          "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "expert_intermediate_size": 32,
          "head_dim": 32, "d_kv": 32, "kv_channels": 32, "attention_head_size": 32,
          "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 16,
          "q_lora_rank": 16, "rotary_dim": 16, "vocab_size_per_layer_input": VOCAB,
          "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
          "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "n_group": 1, "topk_group": 1, "n_groups": 1,
          "vocab_size": VOCAB, "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512,
          "max_target_positions": 512, "max_source_positions": 64, "image_size": IMAGE}
# settings some types leave None by default although their forward needs them (DeepSeek-V2's experts per
# token, ESM's vocabulary): given the small value
_NONE_DEFAULTS = ("num_experts_per_tok", "vocab_size")
# per-stage lists of vision models: one block per stage
_STAGE_DEPTHS = ("depths", "num_layers_per_stage", "stage_depths", "layers")


class Unbuildable(Exception):
    """This type cannot be built or called from a small config here (its reason is the message)."""


def model_types() -> list[str]:
    """Every model type transformers registers a config for, sorted."""
    from transformers import CONFIG_MAPPING
    return sorted(CONFIG_MAPPING.keys())


# what a shrink may lower: every size, or only the depth-like ones (layers, experts, vocabulary, positions,
# image side), for types whose widths are tied to other settings (rope sections, stage widths)
_DEPTH_ONLY = set(_LAYERS) | {"num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                              "vocab_size", "max_position_embeddings", "n_positions", "n_ctx",
                              "max_target_positions", "image_size"}


def _get(config: Any, key: str) -> Any:
    try:
        return getattr(config, key, None)
    except Exception:   # (transformers' per-layer attributes raise on the global read)
        return None


def sizes_for(config: Any, keys: set[str] | None = None, stages: bool = True) -> dict[str, Any]:
    """The size settings of `config` (a PretrainedConfig) lowered, sub-configs as nested dicts; only those
    in `keys` where given, and per-stage depths only with `stages`."""
    out: dict[str, Any] = {}
    for key, small in _SMALL.items():
        if keys is not None and key not in keys:
            continue
        value = _get(config, key)
        if isinstance(getattr(type(config), key, None), property):
            continue   # (derived from other settings: Falcon's head_dim)
        if value is None and key in _NONE_DEFAULTS and key in vars(config):
            out[key] = small
            if key == "vocab_size" and _get(config, "pad_token_id") is None:
                out["pad_token_id"] = 1   # (ESM: its embeddings need one)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int) and value > small:
            out[key] = small
        elif key == "image_size" and isinstance(value, (list, tuple)) and len(value) == 2 \
                and all(isinstance(v, int) and v > small for v in value):
            out[key] = [small, small]
    if isinstance(_get(config, "num_heads"), (list, tuple)):
        out.pop("embed_dim", None)   # (stage widths must stay divisible by their heads, e.g. Swin's 96 by 3)
    if "head_dim" in out and isinstance(_get(config, "qk_rope_head_dim"), int):
        out["head_dim"] = out.get("qk_rope_head_dim", config.qk_rope_head_dim)   # (DeepSeek: rope width)
    expand, width = _get(config, "expand"), out.get("hidden_size")
    if isinstance(expand, int) and width and isinstance(_get(config, "num_heads"), int) and \
            isinstance(_get(config, "head_dim"), int):   # (Mamba2: heads x head width = expand x width)
        out["num_heads"] = max(1, expand * width // out.get("head_dim", config.head_dim))
    for key in _STAGE_DEPTHS if stages else ():
        value = _get(config, key)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and v > 1 for v in value):
            out[key] = [1] * len(value)
    # token ids that would fall outside the smaller vocabulary
    vocab = out.get("vocab_size")
    if vocab is not None:
        for key, value in list(vars(config).items()):
            if key.endswith("_token_id") and isinstance(value, int) and value >= vocab:
                out[key] = vocab - 1
            elif key.endswith("_token_id") and isinstance(value, list) and any(
                    isinstance(v, int) and v >= vocab for v in value):
                out[key] = [min(v, vocab - 1) for v in value]
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = _get(config, key)
        if sub is not None and hasattr(sub, "to_dict"):
            nested = sizes_for(sub, keys, stages)
            if nested:   # (a dict rebuilds the sub-config: keep its type, as the parent chose it)
                out[key] = {"model_type": sub.model_type, **nested} if getattr(sub, "model_type", "") else nested
    return out


# every size lowered; all but the layer counts (hybrid models whose layer pattern needs its default depth to
# hold an attention layer); depth-like sizes only; none
SHRINKS = ("small", "narrow", "shallow", "default")
_NARROW = set(_SMALL) - set(_LAYERS)


def config_for(model_type: str, shrink: str = "small") -> Any:
    """transformers' default config of `model_type`, with its sizes lowered as `shrink` says."""
    from transformers import AutoConfig
    try:
        default = AutoConfig.for_model(model_type)
        if shrink == "default":
            return default
        keys = {"small": None, "narrow": _NARROW, "shallow": _DEPTH_ONLY}[shrink]
        return AutoConfig.for_model(model_type, **sizes_for(default, keys, stages=shrink != "narrow"))
    except Exception as e:
        raise Unbuildable(f"config: {type(e).__name__}: {e}".strip()[:300]) from None


def model_class(config: Any) -> type:
    """The type's base model class (AutoModel), else its first task head."""
    import transformers
    for auto in ("AutoModel", "AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForImageClassification",
                 "AutoModelForMaskedLM", "AutoModelForSpeechSeq2Seq", "AutoModelForCTC",
                 "AutoModelForImageTextToText", "AutoModelForTextToWaveform"):
        mapping = getattr(getattr(transformers, auto, None), "_model_mapping", None)
        if mapping is None:
            continue
        try:
            return mapping[type(config)]
        except (KeyError, ValueError, AttributeError, ImportError):
            continue
    raise Unbuildable(f"no AutoModel class for {type(config).__name__} (a sub-config, or a model without a "
                      f"base class)")


def _parameters_on_meta(cls: type, config: Any) -> int:
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls._from_config(config)
    return sum(p.numel() for p in model.parameters())


def _setting(config: Any, key: str, default: Any) -> Any:
    for owner in (config, getattr(config, "vision_config", None), getattr(config, "audio_config", None),
                  getattr(config, "encoder_config", None)):
        value = getattr(owner, key, None) if owner is not None else None
        if value is not None:
            return value
    return default


def _side(config: Any) -> int:
    side = _setting(config, "image_size", IMAGE)
    return int(side[0] if isinstance(side, (list, tuple)) else side)


def candidates(config: Any, cls: type) -> list[Callable[[torch.Generator], dict[str, Any]]]:
    """Input makers to try in order, from the model's main input and forward signature."""
    main = getattr(cls, "main_input_name", "input_ids")
    try:
        params = set(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        params = set()
    vocab = min(int(_setting(config, "vocab_size", VOCAB) or VOCAB), VOCAB)
    channels = int(_setting(config, "num_channels", 3) or 3)
    mel = int(_setting(config, "num_mel_bins", 80) or 80)
    frames = 2 * int(_setting(config, "max_source_positions", 64) or 64)
    spectrogram = int(_setting(config, "max_length", 128) or 128)   # (Audio Spectrogram Transformer's frames)

    def tokens(g: torch.Generator, length: int = LENGTH) -> torch.Tensor:
        return torch.randint(min(3, vocab - 1), vocab, (BATCH, length), generator=g)

    def images(g: torch.Generator) -> torch.Tensor:
        return torch.randn(BATCH, channels, _side(config), _side(config), generator=g)

    mains: list[Callable[[torch.Generator], dict[str, Any]]]
    if main == "pixel_values":
        mains = [lambda g: {"pixel_values": images(g)}]
    elif main == "input_values":
        mains = [lambda g: {"input_values": torch.randn(BATCH, 8000, generator=g)},
                 lambda g: {"input_values": torch.randn(BATCH, spectrogram, mel, generator=g)}]
    elif main == "input_features":
        mains = [lambda g: {"input_features": torch.randn(BATCH, mel, frames, generator=g)},
                 lambda g: {"input_features": torch.randn(BATCH, frames, mel, generator=g)}]
    else:
        mains = [lambda g: {"input_ids": tokens(g)}]
    out = []
    for make in mains:
        out.append(make)
        if "decoder_input_ids" in params:
            out.append(lambda g, make=make: {**make(g), "decoder_input_ids": tokens(g, LENGTH // 2)})
        if "pixel_values" in params and main == "input_ids":
            out.append(lambda g, make=make: {**make(g), "pixel_values": images(g)})
    return out


def _build_one(model_type: str, shrink: str, seed: int) -> tuple[nn.Module, dict[str, Any]]:
    config = config_for(model_type, shrink)
    cls = model_class(config)
    try:
        count = _parameters_on_meta(cls, config)
    except Exception as e:
        raise Unbuildable(f"model: {type(e).__name__}: {e}".strip()[:300]) from None
    if count > MAX_PARAMETERS:
        raise Unbuildable(f"{count / 1e6:.0f}M parameters (over {MAX_PARAMETERS / 1e6:.0f}M)")
    torch.manual_seed(seed)
    try:
        model = cls._from_config(config).eval()
    except Exception as e:
        raise Unbuildable(f"model: {type(e).__name__}: {e}".strip()[:300]) from None
    errors = []
    for make in candidates(config, cls):
        kwargs = make(torch.Generator().manual_seed(seed))
        try:
            with torch.no_grad():
                model(**kwargs)
        except Exception as e:
            errors.append(f"{sorted(kwargs)}: {type(e).__name__}: {e}".strip()[:200])
            continue
        return model, kwargs
    raise Unbuildable("inputs: " + "; ".join(errors) if errors else "inputs: no candidate")


def build(model_type: str, batch: int | None = None, seed: int = 0) -> tuple[nn.Module, tuple[tuple, dict]]:
    """The seeded model (eval mode, float32) of `model_type` and the first example input it runs eagerly
    with (no_grad): at the small config, else with only its depth-like sizes lowered, else at transformers'
    default config when that is under MAX_PARAMETERS. `model.kiln_shrink` says which. Raises Unbuildable
    with each attempt's reason otherwise. `batch` is fixed at BATCH."""
    reasons = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shrink in SHRINKS:
            try:
                model, kwargs = _build_one(model_type, shrink, seed)
            except Unbuildable as e:
                reasons.append(f"{shrink}: {e}")
                if str(e).startswith("no AutoModel class"):
                    break   # (the same at every size)
                continue
            model.kiln_shrink = shrink
            return model, ((), kwargs)
    raise Unbuildable(" | ".join(reasons))
