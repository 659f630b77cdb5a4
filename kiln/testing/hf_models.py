"""The zoo's Hugging Face models: 21 `transformers` architectures built from small configs (nothing is
downloaded), at transformers' defaults for everything but sizes.

Each config sets only sizes (hidden size, layers, heads, vocabulary, positions, image size; and token ids
that must fall inside the small vocabulary). Attention is transformers' default implementation (sdpa),
the KV cache is on as by default (`use_cache=True`: decoders return a `DynamicCache`), dropout keeps its
default value (the zoo builds models in eval mode). The point is to see what kiln makes of third-party
code as users run it, not of a configuration chosen to suit kiln.

Every entry belongs to the `hf` suite; the five older ones (hf_gpt2, hf_bert, hf_llama, hf_t5, hf_vit)
also stay in `full`. `kiln explain --models all` runs a graph-break census over them.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .modelspec import ModelSpec, _encoder_decoder, _images, _tokens, _tokens_with_mask

VOCAB = 1000
LENGTH = 32        # tokens per sequence
IMAGE = 32         # image side, pixels


def hf_model(config_name: str, **sizes: Any) -> Callable[[], nn.Module]:
    """A factory: `transformers.<config_name>(**sizes)` built by `AutoModel.from_config` (defaults kept)."""
    def factory() -> nn.Module:
        import transformers
        return transformers.AutoModel.from_config(getattr(transformers, config_name)(**sizes))
    factory.__qualname__ = f"hf_model({config_name})"
    return factory


_TEXT = dict(vocab_size=VOCAB, max_position_embeddings=128)
_ENCODER = dict(_TEXT, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
_DECODER = dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2)


def _encoder(name: str, config: str, what: str, full: bool = False, **sizes: Any) -> ModelSpec:
    return ModelSpec(name, hf_model(config, **sizes), _tokens_with_mask(VOCAB, LENGTH, keywords=True), batch=2,
                     suites=("full", "hf") if full else ("hf",), requires=("transformers",), description=what)


def _decoder(name: str, config: str, what: str, full: bool = False, **sizes: Any) -> ModelSpec:
    return ModelSpec(name, hf_model(config, **sizes), _tokens(VOCAB, LENGTH), batch=2,
                     suites=("full", "hf") if full else ("hf",), requires=("transformers",), description=what)


def _seq2seq(name: str, config: str, what: str, full: bool = False, **sizes: Any) -> ModelSpec:
    return ModelSpec(name, hf_model(config, **sizes), _encoder_decoder(VOCAB, LENGTH), batch=2,
                     suites=("full", "hf") if full else ("hf",), requires=("transformers",), description=what)


def _vision(name: str, config: str, what: str, full: bool = False, **sizes: Any) -> ModelSpec:
    return ModelSpec(name, hf_model(config, **sizes), _images(3, IMAGE, key="pixel_values"), batch=2,
                     suites=("full", "hf") if full else ("hf",), requires=("transformers",), description=what)


SPECS: list[ModelSpec] = [
    # decoders: input_ids only (B, 32)
    _decoder("hf_gpt2", "GPT2Config", "GPT2Model, 2 layers, dim 64", full=True,
             vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
             eos_token_id=0),
    # encoders: input_ids and a padding attention_mask (odd rows end with padding)
    _encoder("hf_bert", "BertConfig", "BertModel, 2 layers, dim 64", full=True, **_ENCODER),
    _encoder("hf_roberta", "RobertaConfig", "RobertaModel, 2 layers, dim 64", **_ENCODER),
    _encoder("hf_distilbert", "DistilBertConfig", "DistilBertModel, 2 layers, dim 64",
             vocab_size=VOCAB, max_position_embeddings=128, dim=64, n_layers=2, n_heads=2, hidden_dim=128),
    _encoder("hf_albert", "AlbertConfig", "AlbertModel, 2 layers (shared), dim 64, embeddings 32",
             **dict(_ENCODER, embedding_size=32)),
    _encoder("hf_electra", "ElectraConfig", "ElectraModel, 2 layers, dim 64, embeddings 32",
             **dict(_ENCODER, embedding_size=32)),
    _encoder("hf_deberta_v2", "DebertaV2Config", "DebertaV2Model, 2 layers, dim 64", **_ENCODER),
    # encoder-decoders: input_ids (B, 32) and decoder_input_ids (B, 16)
    _seq2seq("hf_t5", "T5Config", "T5Model, 2+2 layers, dim 64", full=True,
             vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
             num_heads=2),
    _seq2seq("hf_bart", "BartConfig", "BartModel, 2+2 layers, dim 64",
             vocab_size=VOCAB, max_position_embeddings=128, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128),
    _decoder("hf_opt", "OPTConfig", "OPTModel, 2 layers, dim 64",
             **dict(_TEXT, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=2,
                    word_embed_proj_dim=64)),
    _decoder("hf_gpt_neox", "GPTNeoXConfig", "GPTNeoXModel, 2 layers, dim 64, partial rotary",
             **dict(_DECODER, num_attention_heads=2)),
    _decoder("hf_phi", "PhiConfig", "PhiModel, 2 layers, dim 64, partial rotary",
             **dict(_DECODER, num_attention_heads=2)),
    # LLaMA keeps the zoo's grouped-query attention (4 query heads, 2 KV heads): head counts are sizes
    _decoder("hf_llama", "LlamaConfig", "LlamaModel, 2 layers, GQA 4q/2kv", full=True,
             **dict(_DECODER, num_attention_heads=4, num_key_value_heads=2)),
    # Mistral's default ratio is 32 query heads to 8 KV heads; Qwen2's and Gemma's defaults are equal counts
    _decoder("hf_mistral", "MistralConfig", "MistralModel, 2 layers, GQA 4q/1kv, sliding window",
             **dict(_DECODER, num_attention_heads=4, num_key_value_heads=1, head_dim=16)),
    _decoder("hf_qwen2", "Qwen2Config", "Qwen2Model, 2 layers, 4 heads",
             **dict(_DECODER, num_attention_heads=4, num_key_value_heads=4)),
    _decoder("hf_gemma", "GemmaConfig", "GemmaModel, 2 layers, 2 heads of 32",
             **dict(_DECODER, num_attention_heads=2, num_key_value_heads=2, head_dim=32)),
    # vision: pixel_values (B, 3, 32, 32)
    _vision("hf_vit", "ViTConfig", "ViTModel, 32x32 images, patch 8", full=True,
            image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128),
    _vision("hf_swin", "SwinConfig", "SwinModel, 32x32 images, patch 4, window 4, 2 stages of 2 blocks",
            image_size=IMAGE, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[1, 2], window_size=4),
    _vision("hf_convnext", "ConvNextConfig", "ConvNextModel, 32x32 images, 2 stages, widths 16-32",
            image_size=IMAGE, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]),
    _vision("hf_resnet", "ResNetConfig", "ResNetModel, bottleneck blocks, 2 stages, widths 32-64",
            embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1]),
    _vision("hf_mobilenet_v2", "MobileNetV2Config", "MobileNetV2Model, depth multiplier 0.25",
            image_size=IMAGE, depth_multiplier=0.25),
]
