"""What the prim tests share: a prim's meta rule checked against its reference, and meta-rule errors."""
import pytest
import torch

from kiln.graph import TensorMeta


def as_meta(v):
    """Tensors (also inside lists and tuples) replaced by their TensorMeta."""
    if isinstance(v, torch.Tensor):
        return TensorMeta.of(v)
    if isinstance(v, (list, tuple)):
        return type(v)(as_meta(x) for x in v)
    return v


def check_prim(p, *args):
    """The meta rule agrees with the reference on shape and dtype; the reference agrees with eager."""
    out = p(*args)
    meta = p.meta(*[as_meta(a) for a in args])
    outs = out if isinstance(out, tuple) else (out,)
    metas = meta if isinstance(meta, tuple) else (meta,)
    assert len(outs) == len(metas)
    for o, m in zip(outs, metas):
        assert tuple(m.shape) == tuple(o.shape), (p.name, m.shape, o.shape)
        assert m.dtype == o.dtype, (p.name, m.dtype, o.dtype)
    return out


def meta_raises(exc, p, *args, match=None):
    with pytest.raises(exc, match=match):
        p.meta(*[as_meta(a) for a in args])
