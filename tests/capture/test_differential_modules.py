"""Differential programs: nn.Module structure seen from compiled code: children(), modules(), parameters(),
named_parameters(), named_children(), buffers(), `in` / len / indexing / slicing of Sequential, ModuleList,
ModuleDict and ParameterList, modules nested in parents, attribute and buffer updates."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from diff_helpers import params, run_program

X = torch.randn(3, 4)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        return self.act(self.lin(x)) * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        self.register_buffer("steps", torch.zeros(()))
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))])
        self.gain = nn.Parameter(torch.ones(4))
        self.mode = "sum"

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.seq(x) * self.gain


class NoParams(nn.Module):
    def forward(self, x):
        return x + 1


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def net():
    torch.manual_seed(1)
    return Net()


SEQ = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
MLIST = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
MDICT = nn.ModuleDict({"up": nn.Linear(4, 8), "down": nn.Linear(8, 4)})
PLIST = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(3)])
PDICT = nn.ParameterDict({"w": nn.Parameter(torch.randn(4)), "b": nn.Parameter(torch.zeros(4))})


def m_children_count(x, m): return x * len(list(m.children()))
def m_children_call(x, m):
    for c in m.children():
        x = c(x)
    return x
def m_modules_count(x, m): return x * sum(1 for _ in m.modules())
def m_modules_types(x, m): return [type(s).__name__ for s in m.modules()], x
def m_modules_isinstance(x, m):
    n = 0
    for s in m.modules():
        if isinstance(s, nn.Linear):
            n += 1
    return x * n
def m_named_modules(x, m): return [name for name, _ in m.named_modules()], x
def m_parameters_sum(x, m): return sum(p.sum() for p in m.parameters()) + x
def m_parameters_count(x, m): return x * sum(p.numel() for p in m.parameters())
def m_named_parameters(x, m): return [n for n, _ in m.named_parameters()], x
def m_named_parameters_filter(x, m):
    out = x
    for n, p in m.named_parameters():
        if n.endswith("bias"):
            out = out + p.sum()
    return out
def m_parameters_norecurse(x, m): return [tuple(p.shape) for p in m.parameters(recurse=False)], x
def m_named_children(x, m): return {n: type(c).__name__ for n, c in m.named_children()}, x
def m_named_children_call(x, m):
    out = {}
    for n, c in m.named_children():
        if isinstance(c, nn.Linear):
            out[n] = c(x)
    return out
def m_buffers(x, m): return [b.clone() for b in m.buffers()], x
def m_named_buffers(x, m): return [n for n, _ in m.named_buffers()], x
def m_buffer_update(x, m):
    m.steps.add_(1)
    return x * m.steps
def m_buffer_in_block(x, m):
    for b in m.blocks:
        b.scale.mul_(0.5)
    return m(x)
def m_seq_len_index(x, s): return s[len(s) - 1](s[0](x))
def m_seq_negative_index(x, s): return s[-1](x)
def m_seq_slice(x, s): return s[:2](x)
def m_seq_slice_len(x, s): return x * len(s[1:])
def m_seq_iter(x, s):
    for layer in s:
        x = layer(x)
    return x
def m_seq_in(x, s):
    first = s[0]
    return x * (first in s) + (nn.ReLU() in s)
def m_seq_enumerate(x, s):
    for i, layer in enumerate(s):
        if i == 1:
            return layer(x)
    return x
def m_seq_reversed_types(x, s): return [type(layer).__name__ for layer in reversed(s)], x
def m_mlist_len(x, ml): return x * len(ml)
def m_mlist_index(x, ml): return ml[1](x) + ml[-1](x)
def m_mlist_slice(x, ml):
    for layer in ml[1:]:
        x = layer(x)
    return x
def m_mlist_in(x, ml): return x * (ml[2] in ml)
def m_mlist_zip(x, ml): return [layer(x * i) for i, layer in zip(range(5), ml)]
def m_mlist_enumerate(x, ml): return sum(layer(x) * i for i, layer in enumerate(ml))
def m_mdict_keys(x, md): return list(md.keys()), x
def m_mdict_items(x, md):
    return md["down"](md["up"](x)), [k for k, _ in md.items()]
def m_mdict_in(x, md): return x * ("up" in md) + ("left" in md)
def m_mdict_len_values(x, md): return x * len(md), [type(v).__name__ for v in md.values()]
def m_mdict_missing_key(x, md): return md["nope"](x)
def m_mlist_out_of_range(x, ml): return ml[7](x)
def m_plist_sum(x, pl): return x + sum(pl)
def m_plist_len_index(x, pl): return x * len(pl) + pl[-1]
def m_plist_iter(x, pl):
    for p in pl:
        x = x * p
    return x
def m_pdict(x, pd): return x * pd["w"] + pd["b"], sorted(pd.keys())
def m_nested_blocks(x, m):
    out = m.stem(x)
    for b in m.blocks:
        out = b.act(b.lin(out)) + b.scale
    return out
def m_nested_head(x, m): return {k: h(m.stem(x)) for k, h in m.heads.items()}
def m_nested_seq_index(x, m): return m.seq[2](m.seq[0](x))
def m_forward_full(x, m): return m(x)
def m_attr_str(x, m): return x.sum() if m.mode == "sum" else x.mean()
def m_training_flag(x, m): return x * 2 if m.training else x
def m_eval_inside(x, m):
    m.eval()
    return x * m.training, m.training
def m_set_attr(x, m):
    m.mode = "mean"
    return x
def m_counting_calls(x, m):
    m(x)
    return m(x), m.calls
def m_getattr_submodule(x, m): return getattr(m, "stem")(x)
def m_hasattr_module(x, m): return x * hasattr(m, "heads") + hasattr(m, "tails")
def m_get_submodule(x, m): return m.get_submodule("seq.0")(x)
def m_no_params(x, m): return x * len(list(m.parameters())), m(x)
def m_param_requires_grad(x, m): return [p.requires_grad for p in m.parameters()], x
def m_state_dict_keys(x, m): return list(m.state_dict().keys()), x
def m_param_data_inplace(x, m):
    with torch.no_grad():
        m.gain.mul_(3)
    return m.gain * x
def m_apply_param_list(x, m): return torch.stack([p.detach() for p in m.plist]) + x.sum()
def m_zero_grad_none(x, m):
    m.zero_grad()
    return x * all(p.grad is None for p in m.parameters())
def m_module_in_list(x, m): return x * (m.stem in list(m.children())) + (m.seq in [m.stem])


# ---- harder: structure changes, hooks, shared modules, repr, dtype moves ------------------------------
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.dec = nn.Linear(4, 4)
        self.dec.weight = self.enc.weight
        self.shared = nn.ModuleList([self.enc, self.enc])


def n_tied_parameters(x, m): return len(list(m.parameters())), [n for n, _ in m.named_parameters()], x
def n_shared_modules(x, m): return len(list(m.modules())), [n for n, _ in m.named_modules()], x
def n_named_modules_duplicates(x, m): return [n for n, _ in m.named_modules(remove_duplicate=False)], x
def n_mlist_append(x, ml):
    ml.append(nn.Identity())
    return len(ml), ml[-1](x)
def n_seq_append_call(x, s):
    s.append(nn.Tanh())
    return s(x)
def n_mdict_update_del(x, md):
    md["extra"] = nn.ReLU()
    del md["up"]
    return list(md.keys()), x
def n_add_module(x, m):
    m.add_module("late", nn.Linear(4, 1))
    return m.late(x), [n for n, _ in m.named_children()]
def n_register_buffer_inside(x, m):
    m.register_buffer("fresh", x.sum(0))
    return [n for n, _ in m.named_buffers()], m.fresh
def n_setattr_parameter(x, m):
    m.extra = nn.Parameter(torch.ones(4))
    return [n for n, _ in m.named_parameters()][-1], x * m.extra
def n_requires_grad_toggle(x, m):
    m.stem.weight.requires_grad_(False)
    return [p.requires_grad for p in m.stem.parameters()], m.stem(x)
def n_forward_pre_hook(x):
    lin = nn.Linear(4, 4)
    calls = []
    lin.register_forward_pre_hook(lambda mod, inp: calls.append(inp[0].shape))
    lin(x)
    return calls
def n_forward_hook_modifies(x, m):
    h = m.register_forward_hook(lambda mod, inp, out: out * 0)
    y = m(x)
    h.remove()
    return y, m(x)
def n_train_returns_self(x, m):
    r = m.train(False)
    return r is m, m.training, [c.training for c in m.children()]
def n_apply(x, m):
    seen = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    return seen, x
def n_module_repr(x, m): return repr(m), x
def n_extra_repr(x, m): return m.extra_repr(), x
def n_isinstance_containers(x, m):
    return (isinstance(m.blocks, nn.ModuleList), isinstance(m.seq, nn.Sequential),
            isinstance(m, nn.Sequential), x)
def n_missing_module_attr(x, m): return m.not_there
def n_getattr_default_module(x, m): return getattr(m, "not_there", None), getattr(m.seq, "0")(x)
def n_hasattr_param_buffer(x, m):
    return hasattr(m, "gain"), hasattr(m, "steps"), hasattr(m.blocks[0], "scale"), x
def n_state_dict_values(x, m):
    sd = m.state_dict()
    return len(sd), sd["seq.0.bias"].clone(), x
def n_load_state_dict(x, m):
    sd = {k: v * 0 for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    return m(x)
def n_double_dtype(x, m):
    m.double()
    return m(x.double())
def n_zero_grad_after_backward(x, m):
    m(x).sum().backward()
    had = m.stem.weight.grad is not None
    m.zero_grad()
    return had, m.stem.weight.grad
def n_backward_grads(x, m):
    m(x).pow(2).mean().backward()
    return x
def n_parameter_identity(x, m): return m.stem.weight is next(m.stem.parameters()), x
def n_param_in_list(x, m):
    ps = list(m.parameters())
    return m.gain in ps, x
def n_plist_append(x, pl):
    pl.append(nn.Parameter(torch.zeros(4)))
    return len(pl), x + pl[-1]
def n_mlist_insert_extend(x, ml):
    ml.insert(0, nn.Identity())
    ml.extend([nn.ReLU()])
    return [type(m).__name__ for m in ml], x
def n_seq_getitem_slice_type(x, s): return type(s[1:]).__name__, len(s[::2]), x
def n_module_call_kwargs(x):
    class K(nn.Module):
        def forward(self, a, scale=1.0, *, shift=0.0):
            return a * scale + shift
    k = K()
    return k(x, 2.0, shift=1.0), k(a=x)
def n_module_dunder_call_counts(x, m): return m(m(x)), m.calls
def n_children_generator_partly(x, m):
    it = m.children()
    first = next(it)
    return type(first).__name__, x
def n_modules_with_index(x, m): return {i: type(s).__name__ for i, s in enumerate(m.modules()) if i < 4}, x
def n_sum_param_norms(x, m): return sum(p.norm() for p in m.parameters() if p.dim() > 1) * x

def n_replace_submodule(x, m):
    m.stem = nn.Identity()
    return m.stem(x), m(x)
def n_replace_parameter(x, m):
    m.stem.weight = nn.Parameter(torch.zeros(4, 4))
    return m.stem(x)
def n_weight_data_fill(x, m):
    m.stem.weight.data.fill_(0)
    return m.stem(x)
def n_weight_no_grad_copy(x, m):
    with torch.no_grad():
        m.stem.weight.copy_(torch.eye(4))
    return m.stem(x)
def n_bias_set_none(x, m):
    m.stem.bias = None
    return m.stem(x)
def n_delattr_submodule(x, m):
    del m.heads
    return hasattr(m, "heads"), [n for n, _ in m.named_children()], x

def n_mlist_setitem(x, m):
    m.blocks[0] = nn.Identity()
    return m(x), type(m.blocks[0]).__name__
def n_seq_delitem(x, s):
    del s[1]
    return s(x), len(s)
def n_mdict_pop(x, m):
    head = m.heads.pop("a")
    return head(x), list(m.heads.keys())
def n_setattr_new_submodule_call(x, m):
    setattr(m, "post", nn.Linear(4, 2))
    return m.post(m(x))
def n_seq_insert_call(x, s):
    s.insert(0, nn.Tanh())
    return s(x)
def n_plist_extend(x, pl):
    pl.extend([nn.Parameter(torch.ones(4))])
    return sum(pl) + x
def n_train_eval_toggle_in_forward(x, m):
    m.train()
    a = m.training
    m.eval()
    return a, m.training, m.seq.training, x
# a tensor made in forward assigned to a module attribute (RecurrentGemma's recurrent_states): replayed
def n_tensor_attr_new(x, m):
    m.state = torch.zeros(x.shape[0], 4)
    m.state = m.state + m.stem(x)
    return m.state * 2, m.state.shape
def n_tensor_attr_overwrite(x, m):
    m.state = torch.ones(2, 4)
    out = m.state + x
    m.state = out * 3
    return out, m.state
def n_tensor_attr_on_submodule(x, m):
    m.stem.cache = m.stem(x).detach()
    return m.stem.cache.sum() + x
def n_tensor_attr_to_parameter_name(x, m):
    m.stem.weight = x * 2  # TypeError: cannot assign a tensor as parameter 'weight'
    return x
def n_tensor_attr_to_buffer_name(x, m):
    m.register_buffer("running", torch.zeros(4))
    m.running = m.running + x.sum(0)
    return m.running


TABLE = [
    (m_children_count, lambda: (X, net())), (m_children_call, (X, SEQ)),
    (m_modules_count, lambda: (X, net())), (m_modules_types, (X, SEQ)),
    (m_modules_isinstance, lambda: (X, net())), (m_named_modules, lambda: (X, net())),
    (m_parameters_sum, lambda: (X, net())), (m_parameters_count, lambda: (X, net())),
    (m_named_parameters, lambda: (X, net())), (m_named_parameters_filter, lambda: (X, net())),
    (m_parameters_norecurse, lambda: (X, net())), (m_named_children, lambda: (X, net())),
    (m_named_children_call, lambda: (X, net())), (m_buffers, lambda: (X, net())),
    (m_named_buffers, lambda: (X, net())), (m_buffer_update, lambda: (X, net())),
    (m_buffer_in_block, lambda: (X, net())), (m_seq_len_index, (X, SEQ)),
    (m_seq_negative_index, (X, nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))),
    (m_seq_slice, (X, SEQ)), (m_seq_slice_len, (X, SEQ)), (m_seq_iter, (X, SEQ)), (m_seq_in, (X, SEQ)),
    (m_seq_enumerate, (X, SEQ)), (m_seq_reversed_types, (X, SEQ)), (m_mlist_len, (X, MLIST)),
    (m_mlist_index, (X, MLIST)), (m_mlist_slice, (X, MLIST)), (m_mlist_in, (X, MLIST)),
    (m_mlist_zip, (X, MLIST)), (m_mlist_enumerate, (X, MLIST)), (m_mdict_keys, (X, MDICT)),
    (m_mdict_items, (X, MDICT)), (m_mdict_in, (X, MDICT)), (m_mdict_len_values, (X, MDICT)),
    (m_mdict_missing_key, (X, MDICT)), (m_mlist_out_of_range, (X, MLIST)), (m_plist_sum, (X, PLIST)),
    (m_plist_len_index, (X, PLIST)), (m_plist_iter, (X, PLIST)), (m_pdict, (X, PDICT)),
    (m_nested_blocks, lambda: (X, net())), (m_nested_head, lambda: (X, net())),
    (m_nested_seq_index, lambda: (X, net())), (m_forward_full, lambda: (X, net())),
    (m_attr_str, lambda: (X, net())), (m_training_flag, lambda: (X, net())),
    (m_eval_inside, lambda: (X, net())), (m_set_attr, lambda: (X, net())),
    (m_counting_calls, lambda: (X, Counting())), (m_getattr_submodule, lambda: (X, net())),
    (m_hasattr_module, lambda: (X, net())), (m_get_submodule, lambda: (X, net())),
    (m_no_params, (X, NoParams())), (m_param_requires_grad, (X, SEQ)),
    (m_state_dict_keys, lambda: (X, net())), (m_param_data_inplace, lambda: (X, net())),
    (m_apply_param_list, lambda: (X, net())), (m_zero_grad_none, lambda: (X, net())),
    (m_module_in_list, lambda: (X, net())),
    (n_tied_parameters, (X, Tied())), (n_shared_modules, (X, Tied())),
    (n_named_modules_duplicates, (X, Tied())),
    (n_mlist_append, (X, MLIST)), (n_seq_append_call, (X, nn.Sequential(nn.Linear(4, 4)))),
    (n_mdict_update_del, (X, MDICT)), (n_add_module, lambda: (X, net())),
    (n_register_buffer_inside, lambda: (X, net())), (n_setattr_parameter, lambda: (X, net())),
    (n_requires_grad_toggle, lambda: (X, net())), (n_forward_pre_hook, (X,)),
    (n_forward_hook_modifies, (X, nn.Linear(4, 4))), (n_train_returns_self, lambda: (X, net())),
    (n_apply, (X, SEQ)), (n_module_repr, (X, SEQ)), (n_extra_repr, (X, nn.Linear(4, 2))),
    (n_isinstance_containers, lambda: (X, net())), (n_missing_module_attr, lambda: (X, net())),
    (n_getattr_default_module, lambda: (X, net())), (n_hasattr_param_buffer, lambda: (X, net())),
    (n_state_dict_values, lambda: (X, net())), (n_load_state_dict, lambda: (X, net())),
    (n_double_dtype, (X, nn.Linear(4, 3))), (n_zero_grad_after_backward, lambda: (X, net())),
    (n_backward_grads, lambda: (X, net())), (n_parameter_identity, lambda: (X, net())),
    (n_param_in_list, lambda: (X, net())), (n_plist_append, (X, PLIST)), (n_mlist_insert_extend, (X, MLIST)),
    (n_seq_getitem_slice_type, (X, SEQ)), (n_module_call_kwargs, (X,)),
    (n_module_dunder_call_counts, (X, Counting())), (n_children_generator_partly, (X, SEQ)),
    (n_modules_with_index, lambda: (X, net())), (n_sum_param_norms, lambda: (X, net())),
    (n_replace_submodule, lambda: (X, net())), (n_replace_parameter, lambda: (X, net())),
    (n_weight_data_fill, lambda: (X, net())), (n_weight_no_grad_copy, lambda: (X, net())),
    (n_bias_set_none, lambda: (X, net())), (n_delattr_submodule, lambda: (X, net())),
    (n_mlist_setitem, lambda: (X, net())), (n_seq_delitem, (X, SEQ)), (n_mdict_pop, lambda: (X, net())),
    (n_setattr_new_submodule_call, lambda: (X, net())), (n_seq_insert_call, (X, SEQ)),
    (n_plist_extend, (X, PLIST)), (n_train_eval_toggle_in_forward, lambda: (X, net())),
    # (two graphs: the second call recaptures, the attribute the first call made now exists)
    (n_tensor_attr_new, lambda: (X, net()), {"graphs": 2}), (n_tensor_attr_overwrite, lambda: (X, net())),
    (n_tensor_attr_on_submodule, lambda: (X, net()), {"graphs": 2}),
    (n_tensor_attr_to_parameter_name, lambda: (X, net())), (n_tensor_attr_to_buffer_name, lambda: (X, net())),
]

KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_modules(fn, args, options):
    run_program(fn, args, **options)
