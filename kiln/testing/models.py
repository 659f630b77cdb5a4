"""The model zoo shared by the tests and `kiln bench`.

Hand-written models need nothing beyond torch: MLP, a ResNet-18-style CNN, a MobileNet-style depthwise CNN,
a DenseNet-style CNN (dense blocks concatenating every earlier feature map), a PoolFormer-style MetaFormer,
an EfficientNet-style MBConv net with squeeze-excitation, a MobileViT-style conv/transformer net,
a BERT-style encoder, a nanoGPT-style decoder and a LLaMA-style stack (RMSNorm, rotary embedding, SwiGLU,
grouped-query attention). When `transformers` is installed (extra `models`), 21 Hugging Face architectures
(hf_models.py, suite `hf`) are built from small configs with `AutoModel.from_config` (nothing is
downloaded), at transformers' defaults for everything but sizes.

Every entry is a `ModelSpec`: a factory, example inputs at a batch size, a seed and the suites it belongs
to. `build(name)` returns the model (in eval mode) and its example inputs, both seeded, so two processes
building the same entry get the same weights and inputs:

    model, (args, kwargs) = build("mlp", batch=8)
    out = model(*args, **kwargs)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import hf_models as _hf_models
from .modelspec import (Example, ModelSpec, _encoder_decoder, _features, _images, _tokens,  # noqa: F401
                        _tokens_with_mask)


# ---- hand-written models ---------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, dim: int = 128, hidden: int = 256, depth: int = 3, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        width = dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU(), nn.LayerNorm(hidden)]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-18 layout (4 stages of basic blocks), narrow widths for CPU benchmarking."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64, 128), blocks: tuple[int, ...] = (2, 2, 2, 2),
                 classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        stages: list[nn.Module] = []
        cin = widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            for j in range(count):
                stages.append(BasicBlock(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, 3, H, W)
        y = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),   # depthwise
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class MobileNet(nn.Module):
    """MobileNetV2-style: inverted residual blocks with depthwise 3x3 convolutions."""

    def __init__(self, classes: int = 10):
        super().__init__()
        # (expand, out channels, repeats, stride)
        settings = [(1, 16, 1, 1), (4, 24, 2, 2), (4, 32, 2, 2), (4, 64, 2, 2)]
        layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()]
        cin = 16
        for expand, cout, repeats, stride in settings:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers += [nn.Conv2d(cin, 128, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x).mean(dim=(2, 3))
        return self.classifier(y)


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1 (bottleneck to 4 x growth) then BN-ReLU-Conv3x3 (growth new channels), over the
    concatenation of every earlier feature map of its block."""

    def __init__(self, cin: int, growth: int, bottleneck: int = 4):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, bottleneck * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bottleneck * growth)
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, 1, 1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        y = self.conv1(F.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(F.relu(self.norm2(y)))


class DenseBlock(nn.Module):
    def __init__(self, cin: int, layers: int, growth: int):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, cin, H, W) -> (B, cin + layers * growth, H, W)
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    """DenseNet-BC layout (torchvision's DenseNet-121 structure): dense blocks joined by transitions
    (BN-ReLU-Conv1x1 halving the channels, 2x2 average pool), narrow widths for CPU benchmarking."""

    def __init__(self, growth: int = 8, blocks: tuple[int, ...] = (4, 8, 18), stem: int = 16,
                 classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, stem, 3, 1, 1, bias=False)]
        width = stem
        for i, count in enumerate(blocks):
            layers.append(DenseBlock(width, count, growth))
            width += count * growth
            if i < len(blocks) - 1:   # transition
                layers += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                width //= 2
        layers += [nn.BatchNorm2d(width), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, 3, H, W)
        y = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(y, 1))


class PoolFormerBlock(nn.Module):
    """MetaFormer block with pooling as its token mixer (timm's PoolFormer): GroupNorm(1 group), the mixer
    avg_pool2d(3, 1, 1, count_include_pad=False) - x, a 1x1-conv MLP, each branch scaled per channel
    (LayerScale) before its residual add."""

    def __init__(self, dim: int, mlp_ratio: int = 4, init_scale: float = 1e-2):
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.norm2 = nn.GroupNorm(1, dim)
        self.fc1 = nn.Conv2d(dim, dim * mlp_ratio, 1)
        self.fc2 = nn.Conv2d(dim * mlp_ratio, dim, 1)
        # random rather than timm's constant init, so each channel's scale is exercised
        self.scale1 = nn.Parameter(init_scale * (1 + torch.rand(dim)))
        self.scale2 = nn.Parameter(init_scale * (1 + torch.rand(dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, C, H, W)
        y = self.norm1(x)
        y = F.avg_pool2d(y, 3, 1, 1, count_include_pad=False) - y
        x = x + self.scale1.view(-1, 1, 1) * y
        y = self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return x + self.scale2.view(-1, 1, 1) * y


class PoolFormer(nn.Module):
    """PoolFormer-S12 layout (4 stages, 7x7/4 patch stem, 3x3/2 downsampling convs), narrow widths."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64, 96), blocks: tuple[int, ...] = (2, 2, 4, 2),
                 classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 7, 4, 2)]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            if i > 0:
                layers.append(nn.Conv2d(widths[i - 1], width, 3, 2, 1))
            layers += [PoolFormerBlock(width) for _ in range(count)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.GroupNorm(1, widths[-1])
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, 3, H, W)
        return self.head(self.norm(self.features(x)).mean(dim=(2, 3)))


class SqueezeExcite(nn.Module):
    """Global average pool, 1x1 conv down (SiLU), 1x1 conv up, sigmoid gate on the input's channels."""

    def __init__(self, dim: int, reduced: int):
        super().__init__()
        self.reduce = nn.Conv2d(dim, reduced, 1)
        self.expand = nn.Conv2d(reduced, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)                       # (B, C, 1, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    """EfficientNet's MBConv: 1x1 expansion, depthwise kxk, squeeze-excitation, 1x1 projection (BN after
    each conv, SiLU after the first two), residual when the shape is kept."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                                    nn.SiLU()) if expand != 1 else nn.Identity()
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden,
                                                 bias=False), nn.BatchNorm2d(hidden), nn.SiLU())
        self.se = SqueezeExcite(hidden, max(1, cin // 4))
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.use_residual else y


class EfficientNet(nn.Module):
    """EfficientNet-B0 layout (MBConv stages with squeeze-excitation, 3x3 and 5x5 depthwise), fewer stages."""

    def __init__(self, classes: int = 10):
        super().__init__()
        # (expand, kernel, stride, out channels, repeats)
        settings = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 2)]
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
        cin = 32
        for expand, kernel, stride, cout, repeats in settings:
            for i in range(repeats):
                layers.append(MBConv(cin, cout, kernel, stride if i == 0 else 1, expand))
                cin = cout
        layers += [nn.Conv2d(cin, 320, 1, bias=False), nn.BatchNorm2d(320), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(320, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, 3, H, W)
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def _conv_bn_silu(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.SiLU())


class MV2Block(nn.Module):
    """MobileNetV2 inverted residual as MobileViT uses it (SiLU)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 2):
        super().__init__()
        hidden = cin * expand
        self.block = nn.Sequential(_conv_bn_silu(cin, hidden),
                                   _conv_bn_silu(hidden, hidden, 3, stride, hidden),   # depthwise
                                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_residual else y


class ViTBlock(nn.Module):
    """Pre-norm transformer layer (LayerNorm, multi-head attention, SiLU MLP), as timm's Block."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * mlp_ratio), nn.SiLU(), nn.Linear(dim * mlp_ratio, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, N, C)
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])   # (B, heads, N, C / heads)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
        return x + self.mlp(self.norm2(x))


class MobileViTBlock(nn.Module):
    """timm's MobileViT (v1) block: local 3x3 and 1x1 convs, unfold into 2x2 patches, transformer layers
    over the patches, fold back, 1x1 projection, 3x3 fusion of the concatenation with the input."""

    def __init__(self, dim: int, transformer_dim: int, layers: int, heads: int = 4, patch: int = 2):
        super().__init__()
        self.patch = patch
        self.conv_kxk = _conv_bn_silu(dim, dim, 3)
        self.conv_1x1 = nn.Conv2d(dim, transformer_dim, 1, bias=False)
        self.transformer = nn.Sequential(*(ViTBlock(transformer_dim, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(transformer_dim)
        self.conv_proj = _conv_bn_silu(transformer_dim, dim)
        self.conv_fusion = _conv_bn_silu(2 * dim, dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, C, H, W)
        shortcut = x
        x = self.conv_1x1(self.conv_kxk(x))
        b, c, h, w = x.shape
        p = self.patch
        nh, nw = h // p, w // p
        # unfold: (B, C, H, W) -> (B * p * p, nh * nw, C)
        x = x.reshape(b * c * nh, p, nw, p).transpose(1, 2)
        x = x.reshape(b, c, nh * nw, p * p).transpose(1, 3).reshape(b * p * p, nh * nw, c)
        x = self.norm(self.transformer(x))
        # fold: (B * p * p, nh * nw, C) -> (B, C, H, W)
        x = x.contiguous().view(b, p * p, nh * nw, c).transpose(1, 3).reshape(b * c * nh, nw, p, p)
        x = x.transpose(1, 2).reshape(b, c, h, w)
        return self.conv_fusion(torch.cat((shortcut, self.conv_proj(x)), 1))


class MobileViT(nn.Module):
    """MobileViT-XXS layout (MV2 blocks, then MobileViT blocks at the low resolutions), fewer stages."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_silu(3, 16, 3, 2),
            MV2Block(16, 16, 1), MV2Block(16, 24, 2), MV2Block(24, 24, 1),
            MV2Block(24, 48, 2), MobileViTBlock(48, 64, 2),
            MV2Block(48, 64, 2), MobileViTBlock(64, 80, 2),
            _conv_bn_silu(64, 256))
        self.classifier = nn.Linear(256, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, 3, H, W)
        return self.classifier(self.features(x).mean(dim=(2, 3)))


class BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads) + mask_bias   # (B, H, T, T)
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = self.ln1(x + self.proj(y))                     # post-norm, as BERT
        return self.ln2(x + self.ffn(x))


class BertEncoder(nn.Module):
    """BERT-style encoder: token/position/type embeddings, post-norm layers, padding mask, tanh pooler."""

    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2, max_len: int = 128):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.types = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(BertLayer(dim, heads, 4 * dim) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions) + self.types(torch.zeros_like(input_ids))
        x = self.ln(x)
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -1e4
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x, torch.tanh(self.pooler(x[:, 0]))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        att = att.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, max_len)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class NanoGPT(nn.Module):
    """nanoGPT-style decoder: pre-norm blocks, masked causal attention, tied lm_head."""

    def __init__(self, vocab: int = 512, dim: int = 64, heads: int = 4, layers: int = 2, max_len: int = 64):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads, max_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:   # (B, T) -> (B, T, vocab)
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim: int, max_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)   # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)                                  # (T, D)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LlamaAttention(nn.Module):
    """Grouped-query attention with rotary position embedding."""

    def __init__(self, dim: int, heads: int, kv_heads: int, max_len: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)
        cos, sin = rotary_tables(self.head_dim, max_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)      # (B, H, T, D)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)   # (B, KV, T, D)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, max_len: int):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = LlamaAttention(dim, heads, kv_heads, max_len)
        self.ffn_norm = RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))   # SwiGLU


class Llama(nn.Module):
    """LLaMA-style decoder: RMSNorm, rotary embedding, SwiGLU, grouped-query attention."""

    def __init__(self, vocab: int = 512, dim: int = 64, heads: int = 4, kv_heads: int = 2, layers: int = 2,
                 max_len: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, kv_heads, 176 * dim // 64, max_len)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


# ---- the zoo ---------------------------------------------------------------------------------------------
ZOO: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add an entry to the zoo (names are unique)."""
    if spec.name in ZOO:
        raise ValueError(f"model {spec.name!r} is registered twice")
    ZOO[spec.name] = spec
    return spec


register(ModelSpec("mlp", MLP, _features(128), batch=32, suites=("quick", "full"),
                   description="3 x (Linear, GELU, LayerNorm) + head"))
register(ModelSpec("resnet_tiny", lambda: ResNet(widths=(8, 16), blocks=(1, 1)), _images(3, 16), batch=4,
                   suites=("quick", "full"), description="2 basic blocks, 8-16 channels, 16x16 images"))
register(ModelSpec("nanogpt_tiny", lambda: NanoGPT(vocab=256, dim=32, heads=2, layers=1, max_len=32),
                   _tokens(256, 32), batch=2, suites=("quick", "full"),
                   description="1 block, dim 32, 32 tokens"))
register(ModelSpec("resnet18", ResNet, _images(3, 32), batch=8,
                   description="ResNet-18 layout, widths 16-128, 32x32 images"))
register(ModelSpec("mobilenet", MobileNet, _images(3, 32), batch=8,
                   description="MobileNetV2-style inverted residuals, depthwise convs"))
register(ModelSpec("densenet", DenseNet, _images(3, 32), batch=8,
                   description="DenseNet-BC layout: 3 dense blocks (4, 8, 18 layers, growth 8), 32x32 images"))
register(ModelSpec("poolformer", PoolFormer, _images(3, 64), batch=8,
                   description="PoolFormer-S12 layout: pooling mixer, GroupNorm, LayerScale, 64x64 images"))
register(ModelSpec("efficientnet", EfficientNet, _images(3, 32), batch=8,
                   description="EfficientNet-B0 layout: MBConv, squeeze-excitation, 3x3 and 5x5 depthwise"))
register(ModelSpec("mobilevit", MobileViT, _images(3, 64), batch=8,
                   description="MobileViT-XXS layout: MV2 blocks, unfold/transformer/fold, 64x64 images"))
register(ModelSpec("bert", BertEncoder, _tokens_with_mask(1000, 64), batch=4,
                   description="2 post-norm layers, dim 64, padding mask"))
register(ModelSpec("nanogpt", NanoGPT, _tokens(512, 64), batch=4,
                   description="2 pre-norm blocks, dim 64, causal mask, tied head"))
register(ModelSpec("llama", Llama, _tokens(512, 64), batch=4,
                   description="2 blocks: RMSNorm, rotary, SwiGLU, GQA 4q/2kv heads"))

# the Hugging Face entries (suite "hf"; a few also in "full") are built in hf_models.py
for _spec in _hf_models.SPECS:
    register(_spec)

SUITES = ("quick", "full", "hf")


def names(suite: str | None = None, include_unavailable: bool = False) -> list[str]:
    """Zoo entries in registration order, of one suite ('quick', 'full' or 'hf') or all."""
    if suite is not None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites: {', '.join(SUITES)}")
    return [name for name, spec in ZOO.items()
            if (suite is None or suite in spec.suites) and (include_unavailable or spec.available())]


def get(name: str) -> ModelSpec:
    """The zoo entry called `name`."""
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; the zoo has: {', '.join(ZOO)}") from None


def build(name: str, batch: int | None = None, seed: int | None = None) -> tuple[nn.Module, Example]:
    """The seeded model (eval mode, float32) and its example (args, kwargs) at `batch`."""
    spec = get(name)
    if not spec.available():
        raise ImportError(f"model {name!r} needs {', '.join(spec.requires)} (pip install -e '.[models]')")
    seed = spec.seed if seed is None else seed
    torch.manual_seed(seed)
    model = spec.factory().eval()
    generator = torch.Generator().manual_seed(seed)
    example = spec.make_inputs(spec.batch if batch is None else batch, generator)
    return model, example
