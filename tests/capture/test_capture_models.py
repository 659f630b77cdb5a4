"""Whole models captured with the eager backend: outputs equal eager's, in one graph without breaks."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln


def forward_entries(cm):
    return cm._compiled_forward.cache.entries


def check_model(model, *inputs, graphs=1, breaks=0, **kwargs):
    kiln.reset()
    cm = kiln.compile(model, backend="eager")
    with torch.no_grad():
        expected = model(*inputs, **kwargs)
        for _ in range(2):
            actual = cm(*inputs, **kwargs)
            if isinstance(expected, torch.Tensor):
                torch.testing.assert_close(actual, expected)
    entries = forward_entries(cm)
    assert sum(1 for e in entries if e.graph is not None) == graphs, [e.brk for e in entries]
    assert sum(1 for e in entries if e.brk is not None) == breaks, [e.brk for e in entries]
    return cm, actual, expected


def test_mlp():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)).eval()
    check_model(model, torch.randn(8, 16))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.conv2(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def test_small_cnn_eval():
    check_model(SmallCNN().eval(), torch.randn(2, 3, 16, 16))


def test_small_cnn_train_updates_running_stats():
    kiln.reset()
    torch.manual_seed(0)
    model, ref = SmallCNN().train(), SmallCNN().train()
    ref.load_state_dict(model.state_dict())
    cm = kiln.compile(model, backend="eager")
    x = torch.randn(4, 3, 16, 16)
    for _ in range(2):
        torch.testing.assert_close(cm(x), ref(x))
    torch.testing.assert_close(model.bn1.running_mean, ref.bn1.running_mean)
    torch.testing.assert_close(model.bn1.num_batches_tracked, ref.bn1.num_batches_tracked)


class Attention(nn.Module):
    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.causal = causal

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)  # (B, h, T, d)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
            att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim=32, heads=4, causal=False):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def test_transformer_block():
    check_model(Block().eval(), torch.randn(2, 8, 32))


class NanoGPT(nn.Module):
    def __init__(self, vocab=64, block=16, dim=32, layers=2, heads=4):
        super().__init__()
        self.block_size = block
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, causal=True) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.block_size, f"sequence {t} is longer than {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def test_nanogpt_inference():
    idx = torch.randint(0, 64, (2, 12))
    _, (logits, loss), (ref_logits, _) = check_model(NanoGPT().eval(), idx)
    torch.testing.assert_close(logits, ref_logits)
    assert loss is None


def test_nanogpt_training_step_matches_eager():
    kiln.reset()
    torch.manual_seed(0)
    model, ref = NanoGPT().train(), NanoGPT().train()
    ref.load_state_dict(model.state_dict())
    cm = kiln.compile(model, backend="eager")
    idx = torch.randint(0, 64, (2, 12))
    targets = torch.randint(0, 64, (2, 12))
    torch.manual_seed(1)
    _, loss = cm(idx, targets)
    loss.backward()
    torch.manual_seed(1)
    _, ref_loss = ref(idx, targets)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert len(forward_entries(cm)) == 1 and forward_entries(cm)[0].graph is not None


def _hf_models():
    transformers = pytest.importorskip("transformers")
    return transformers


HF_CONFIGS = {
    "gpt2": lambda t: t.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                                   bos_token_id=0, eos_token_id=0),
    "bert": lambda t: t.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                   intermediate_size=64, vocab_size=100, max_position_embeddings=64),
    "llama": lambda t: t.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                     intermediate_size=64, vocab_size=100, max_position_embeddings=64,
                                     num_key_value_heads=2, bos_token_id=0, eos_token_id=0),
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_huggingface_model_one_graph(name):
    transformers = _hf_models()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_config(HF_CONFIGS[name](transformers)).eval()
    ids = torch.randint(0, 100, (2, 8))
    kiln.reset()
    cm = kiln.compile(model, backend="eager")
    with torch.no_grad():
        expected = model(input_ids=ids)
        actual = cm(input_ids=ids)
        again = cm(input_ids=ids)
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state)
    torch.testing.assert_close(again.last_hidden_state, expected.last_hidden_state)
    assert type(actual) is type(expected)
    entries = forward_entries(cm)
    assert len(entries) == 1 and entries[0].brk is None, entries[0].brk
    assert entries[0].graph is not None


ZOO_HF = ["hf_gpt2", "hf_bert", "hf_llama", "hf_t5", "hf_vit"]


def _assert_outputs_equal(actual, expected):
    assert type(actual) is type(expected)
    keys = list(expected.keys())
    assert list(actual.keys()) == keys
    compared = 0
    for key in keys:
        if isinstance(expected[key], torch.Tensor):
            torch.testing.assert_close(actual[key], expected[key], msg=key)
            compared += 1
    assert compared


@pytest.mark.parametrize("backend", ["eager", "prims"])
@pytest.mark.parametrize("name", ZOO_HF)
def test_zoo_huggingface_model_one_graph(name, backend):
    """The benchmark zoo's Hugging Face models (transformers' defaults: sdpa attention, whose GQA check reads
    os.environ through Mapping.get's try/except KeyError; the KV cache on) capture whole, and compute
    eager's outputs."""
    pytest.importorskip("transformers")
    from kiln.testing import models
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, (args, kwargs) = models.build(name)
    kiln.reset()
    cm = kiln.compile(model, backend=backend)
    with torch.no_grad():
        expected = model(*args, **kwargs)
        for _ in range(2):
            _assert_outputs_equal(cm(*args, **kwargs), expected)
    entries = forward_entries(cm)
    assert len(entries) == 1 and entries[0].brk is None, entries[0].brk
    assert entries[0].graph is not None


def test_sliced_module_list_keeps_parameter_sources():
    """`self.layers[:n]` is a new ModuleList of the same modules: their parameters stay graph inputs guarded
    by identity (HF LLaMA loops over such a slice), so a plain function taking the model captures whole."""
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
            self.scale = nn.Parameter(torch.randn(8))

    def run(model, x):
        for layer in model.layers[:2]:
            x = model.scale * layer(x)
        return x

    kiln.reset()
    model, x = Stack(), torch.randn(4, 8)
    compiled = kiln.compile(run, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(model, x), run(model, x))
        report = kiln.explain(run, model, x)
        assert (report.graph_count, report.graph_break_count) == (1, 0), report.breaks
        model.layers[1] = nn.Linear(8, 8)   # a different module in the slice: guards see it
        torch.testing.assert_close(compiled(model, x), run(model, x))
