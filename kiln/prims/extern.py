"""Extern prims: operations backends keep whole, as calls into a vendor library (BLAS, oneDNN, cuDNN, ...).

mm(a, b)                     [n, k] @ [k, m] -> [n, m]; one dtype
addmm(bias, a, b)            bias[m] + [n, k] @ [k, m] -> [n, m] in one library call (the bias added while the
                             product is written, one rounding: eager's half-precision Linear); one dtype
bmm(a, b)                    [B, n, k] @ [B, k, m] -> [B, n, m]
convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
                             N-d (N = w.ndim - 2) batched convolution, as torch.convolution; every list has
                             N entries; bias is None or 1-d
convolution_backward(g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                     groups, output_mask) -> the gradients output_mask selects (input, weight, bias)
sdpa(q, k, v, attn_mask, is_causal, scale, enable_gqa)
                             scaled dot product attention without dropout; q [*B, L, E], k [*B, S, E],
                             v [*B, S, Ev] with one batch shape (the head dim, -3, of k and v may divide q's
                             when enable_gqa); attn_mask None or [*B, L, S], bool or q's dtype
sdpa_backward(g, q, k, v, attn_mask, is_causal, scale, enable_gqa, mask_grad=False) -> (grad q, grad k,
    grad v[, grad attn_mask])
sdpa_flash(q, k, v, attn_mask, is_causal, scale) -> (out, logsumexp): sdpa by torch's CPU flash kernel
sdpa_flash_backward(g, q, k, v, out, logsumexp, attn_mask, is_causal, scale) -> (grad q, grad k, grad v)
sort(a, dim, descending, stable) -> (values, int64 indices)
topk(a, k, dim, largest, sorted) -> (values, int64 indices)
cumsum(a, dim), cumprod(a, dim), logcumsumexp(a, dim): inclusive scans in a's dtype
cummax(a, dim), cummin(a, dim) -> (values, int64 indices of the last extremum so far)
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..graph import TensorMeta
from ..graph.layout import convolution_channels_last, preserve_strides, strides_in_order
from .registry import check, is_tensor, meta_of, prim, shape_text, wrap_dim


def _tensor(name: str, what: str, v: Any) -> TensorMeta:
    check(is_tensor(v), lambda: f"prims.{name}: expected {what} to be a tensor, got {type(v).__name__}",
          TypeError)
    return meta_of(v)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- matrix products ------------------------------------------------------------------------------------

def _matmul_dtypes(name: str, am: TensorMeta, bm: TensorMeta) -> None:
    check(am.dtype == bm.dtype, lambda: f"{name}: expected m1 and m2 to have the same dtype, but got: "
          f"{_dtype_name(am.dtype)} != {_dtype_name(bm.dtype)}")
    check(am.dtype != torch.bool, lambda: f"{name}: not implemented for 'Bool'", NotImplementedError)
    check(am.device == bm.device, lambda: f"{name}: expected both operands on one device, got {am.device} "
          f"and {bm.device}")


def _mm_meta(a: Any, b: Any) -> TensorMeta:
    am, bm = _tensor("mm", "mat1", a), _tensor("mm", "mat2", b)
    check(am.ndim == 2, lambda: f"mm: self must be a matrix, got {shape_text(a)}")
    check(bm.ndim == 2, lambda: f"mm: mat2 must be a matrix, got {shape_text(b)}")
    check(am.shape[1] == bm.shape[0], lambda: f"mm: mat1 and mat2 shapes cannot be multiplied "
          f"({am.shape[0]}x{am.shape[1]} and {bm.shape[0]}x{bm.shape[1]})")
    _matmul_dtypes("mm", am, bm)
    return TensorMeta((am.shape[0], bm.shape[1]), am.dtype, am.device)


mm = prim("mm", _mm_meta, lambda a, b: torch.mm(a, b), tags=("extern",))


def _addmm_meta(bias: Any, a: Any, b: Any) -> TensorMeta:
    out = _mm_meta(a, b)
    bm = _tensor("addmm", "bias", bias)
    check(bm.ndim == 1 and bm.shape[0] == out.shape[1], lambda: f"addmm: expected a bias of size "
          f"[{out.shape[1]}] for the product {shape_text(a)} @ {shape_text(b)}, got {shape_text(bias)}")
    check(bm.dtype == out.dtype, lambda: f"addmm: expected the bias in the operands' dtype "
          f"{_dtype_name(out.dtype)}, got {_dtype_name(bm.dtype)}")
    return out


# eager's biased Linear (F.linear -> aten.addmm): BLAS/oneDNN adds the bias as it writes the product, so a
# half-precision result is rounded once from the float32 accumulator, and the gemm reads half-precision bytes
addmm = prim("addmm", _addmm_meta, lambda bias, a, b: torch.addmm(bias, a, b), tags=("extern",))


def _bmm_meta(a: Any, b: Any) -> TensorMeta:
    am, bm = _tensor("bmm", "batch1", a), _tensor("bmm", "batch2", b)
    check(am.ndim == 3, lambda: f"bmm: batch1 must be a 3D tensor, got {shape_text(a)}")
    check(bm.ndim == 3, lambda: f"bmm: batch2 must be a 3D tensor, got {shape_text(b)}")
    check(bm.shape[0] == am.shape[0] and bm.shape[1] == am.shape[2],
          lambda: f"bmm: Expected size for first two dimensions of batch2 tensor to be: "
                  f"[{am.shape[0]}, {am.shape[2]}] but got: [{bm.shape[0]}, {bm.shape[1]}] "
                  f"(batch1 {shape_text(a)}, batch2 {shape_text(b)})")
    _matmul_dtypes("bmm", am, bm)
    return TensorMeta((am.shape[0], am.shape[1], bm.shape[2]), am.dtype, am.device)


bmm = prim("bmm", _bmm_meta, lambda a, b: torch.bmm(a, b), tags=("extern",))


# ---- convolution ----------------------------------------------------------------------------------------

def _int_list(name: str, what: str, v: Any, n: int) -> tuple[int, ...]:
    check(isinstance(v, (list, tuple)) and len(v) == n,
          lambda: f"{name}: expected {what} to be a list of {n} values to match the convolution "
                  f"dimensions, but got {what}={v}")
    return tuple(v)


def conv_output_size(size: Any, kernel: Any, stride: int, padding: int, dilation: int,
                     transposed: bool, output_padding: int) -> Any:
    """One spatial output size of a convolution (the formula eager uses)."""
    if transposed:
        return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _check_groups(name: str, wm: TensorMeta, w: Any, groups: int) -> None:
    check(wm.shape[0] % groups == 0, lambda: f"{name}: Given groups={groups}, expected weight to be "
          f"divisible by {groups} at dimension 0, but got weight of size {shape_text(w)} instead")


def _convolution_meta(x: Any, w: Any, bias: Any, stride: Sequence[int], padding: Sequence[int],
                      dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                      groups: int) -> TensorMeta:
    name = "convolution"
    xm, wm = _tensor(name, "input", x), _tensor(name, "weight", w)
    n = wm.ndim - 2
    check(n >= 1, lambda: f"{name}: weight should have at least three dimensions, got {shape_text(w)}")
    check(xm.ndim == n + 2, lambda: f"{name}: expected a batched {n + 2}-d input for a {n}-d convolution "
          f"with weight {shape_text(w)}, got input of size: {shape_text(x)}")
    stride = _int_list(name, "stride", stride, n)
    padding = _int_list(name, "padding", padding, n)
    dilation = _int_list(name, "dilation", dilation, n)
    output_padding = _int_list(name, "output_padding", output_padding, n)
    check(all(s > 0 for s in stride), lambda: f"{name}: non-positive stride is not supported")
    check(all(p >= 0 for p in padding), lambda: f"{name}: negative padding is not supported")
    check(all(p >= 0 for p in output_padding), lambda: f"{name}: negative output_padding is not supported")
    check(all(d > 0 for d in dilation), lambda: f"{name}: non-positive dilation is not supported")
    check(isinstance(groups, int) and groups > 0, lambda: f"{name}: non-positive groups is not supported")
    check(xm.dtype == wm.dtype, lambda: f"{name}: Input type ({xm.dtype}) and weight type ({wm.dtype}) "
          f"should be the same (input {shape_text(x)}, weight {shape_text(w)})")
    check(xm.dtype != torch.bool, lambda: f"{name}: not implemented for 'Bool'", NotImplementedError)
    in_channels = xm.shape[1]
    if transposed:
        check(in_channels == wm.shape[0], lambda: f"{name}: Given transposed=1, weight of size "
              f"{shape_text(w)}, expected input{shape_text(x)} to have {wm.shape[0]} channels, but got "
              f"{in_channels} channels instead")
        _check_groups(name, wm, w, groups)
        out_channels = wm.shape[1] * groups
        for i in range(n):
            check(output_padding[i] < stride[i] or output_padding[i] < dilation[i],
                  lambda: f"{name}: output padding must be smaller than either stride or dilation, but got "
                          f"output_padding={list(output_padding)}, stride={list(stride)}, "
                          f"dilation={list(dilation)}")
    else:
        _check_groups(name, wm, w, groups)
        check(in_channels == wm.shape[1] * groups, lambda: f"{name}: Given groups={groups}, weight of size "
              f"{shape_text(w)}, expected input{shape_text(x)} to have {wm.shape[1] * groups} channels, but "
              f"got {in_channels} channels instead")
        out_channels = wm.shape[0]
    if bias is not None:
        bm = _tensor(name, "bias", bias)
        check(bm.ndim == 1 and bm.shape[0] == out_channels,
              lambda: f"{name}: Given {'transposed=1, ' if transposed else ''}weight of size "
                      f"{shape_text(w)}, expected bias to be 1-dimensional with {out_channels} elements, but "
                      f"got bias of size {shape_text(bias)} instead")
        check(bm.dtype == xm.dtype, lambda: f"{name}: Input type ({_dtype_name(xm.dtype)}) and bias type "
              f"({_dtype_name(bm.dtype)}) should be the same")
    spatial = []
    sizes = xm.shape[2:]
    kernels = wm.shape[2:]
    if not transposed:
        padded = [sizes[i] + 2 * padding[i] for i in range(n)]
        dilated = [dilation[i] * (kernels[i] - 1) + 1 for i in range(n)]
        check(all(p >= k for p, k in zip(padded, dilated)),
              lambda: f"{name}: Calculated padded input size per channel: ({' x '.join(map(str, padded))}). "
                      f"Kernel size: ({' x '.join(map(str, dilated))}). Kernel size can't be greater than "
                      "actual input size")
    for i in range(n):
        spatial.append(conv_output_size(sizes[i], kernels[i], stride[i], padding[i], dilation[i], transposed,
                                        output_padding[i]))
    check(all(s > 0 for s in spatial), lambda: f"{name}: Given input size per channel: "
          f"({' x '.join(map(str, sizes))}). Calculated output size per channel: "
          f"({' x '.join(map(str, spatial))}). Output size is too small")
    shape = (xm.shape[0], out_channels, *spatial)
    if convolution_channels_last(xm.shape, xm.strides, wm.shape, wm.strides, xm.dtype, stride, dilation, groups):
        # eager's CPU convolutions run channels-last when the input or the weight is, and return so
        order = (1,) + tuple(range(n + 1, 1, -1)) + (0,)  # C, the spatial dims from the last, N
        return TensorMeta(shape, xm.dtype, xm.device, strides_in_order(shape, order))
    return TensorMeta(shape, xm.dtype, xm.device)


def _convolution_ref(x: torch.Tensor, w: torch.Tensor, bias: Any, stride: Sequence[int],
                     padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                     output_padding: Sequence[int], groups: int) -> torch.Tensor:
    return torch.convolution(x, w, bias, list(stride), list(padding), list(dilation), transposed,
                             list(output_padding), groups)


convolution = prim("convolution", _convolution_meta, _convolution_ref, tags=("extern",))


def _convolution_backward_meta(g: Any, x: Any, w: Any, bias_sizes: Sequence[int] | None,
                               stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                               transposed: bool, output_padding: Sequence[int], groups: int,
                               output_mask: Sequence[bool]) -> tuple:
    name = "convolution_backward"
    gm, xm, wm = _tensor(name, "grad_output", g), _tensor(name, "input", x), _tensor(name, "weight", w)
    check(isinstance(output_mask, (list, tuple)) and len(output_mask) == 3 and any(output_mask),
          lambda: f"prims.{name}: output_mask must be three bools, at least one true, got {output_mask!r}")
    check(not output_mask[2] or bias_sizes is not None,
          lambda: f"prims.{name}: the bias gradient needs bias_sizes")
    forward = _convolution_meta(x, w, None, stride, padding, dilation, transposed, output_padding, groups)
    check(tuple(gm.shape) == tuple(forward.shape) and gm.dtype == xm.dtype,
          lambda: f"prims.{name}: grad_output {shape_text(g)} ({gm.dtype}) must match the convolution's "
                  f"output [{', '.join(map(str, forward.shape))}] ({xm.dtype})")
    metas = (TensorMeta(xm.shape, xm.dtype, xm.device), TensorMeta(wm.shape, wm.dtype, wm.device),
             TensorMeta(tuple(bias_sizes or ()), xm.dtype, xm.device))
    return tuple(meta for meta, wanted in zip(metas, output_mask) if wanted)


def _convolution_backward_ref(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                              bias_sizes: Sequence[int] | None, stride: Sequence[int], padding: Sequence[int],
                              dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                              groups: int, output_mask: Sequence[bool]) -> tuple:
    results = torch.ops.aten.convolution_backward(
        g, x, w, list(bias_sizes) if bias_sizes is not None else None, list(stride), list(padding),
        list(dilation), transposed, list(output_padding), groups, [bool(b) for b in output_mask])
    return tuple(r.contiguous() for r, wanted in zip(results, output_mask) if wanted)


convolution_backward = prim(
    "convolution_backward", _convolution_backward_meta, _convolution_backward_ref, tags=("extern",),
    doc="convolution_backward(g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, "
        "groups, output_mask): the gradients of convolution's input, weight and bias selected by the three "
        "bools of output_mask, in that order (eager's aten.convolution_backward); contiguous")


# ---- attention ------------------------------------------------------------------------------------------

def _sdpa_meta(q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
               scale: float | None = None, enable_gqa: bool = False) -> TensorMeta:
    name = "scaled_dot_product_attention"
    qm, km, vm = _tensor(name, "query", q), _tensor(name, "key", k), _tensor(name, "value", v)
    check(qm.ndim >= 2 and km.ndim == qm.ndim and vm.ndim == qm.ndim,
          lambda: f"prims.sdpa: query, key and value must have one rank of at least 2, got "
                  f"{shape_text(q)}, {shape_text(k)}, {shape_text(v)}")
    check(qm.dtype == km.dtype == vm.dtype,
          lambda: f"{name}: Expected query, key, and value to have the same dtype, but got query.dtype: "
                  f"{qm.dtype} key.dtype: {km.dtype} and value.dtype: {vm.dtype} instead.")
    check(qm.dtype.is_floating_point, lambda: f"{name}: expected a floating point query, got {qm.dtype}")
    check(km.shape[:-1] == vm.shape[:-1], lambda: f"{name}: key {shape_text(k)} and value {shape_text(v)} "
          "must agree on every dim but the last")
    check(qm.shape[-1] == km.shape[-1], lambda: f"{name}: query {shape_text(q)} and key {shape_text(k)} "
          "must have the same embedding size")
    batch_q, batch_k = list(qm.shape[:-2]), list(km.shape[:-2])
    if enable_gqa and qm.ndim >= 3:
        hq, hk = batch_q[-1], batch_k[-1]
        check(hk != 0 and hq % hk == 0, lambda: f"{name}: Number of heads in key and value must divide the "
              f"number of heads in query (query {shape_text(q)}, key {shape_text(k)})")
        batch_q, batch_k = batch_q[:-1], batch_k[:-1]
    check(batch_q == batch_k, lambda: f"prims.sdpa: query {shape_text(q)}, key {shape_text(k)} and value "
          f"{shape_text(v)} must have one batch shape (prims do not broadcast)")
    out_shape = (*qm.shape[:-1], vm.shape[-1])
    if attn_mask is not None:
        check(not is_causal, lambda: "_scaled_dot_product_attention: Explicit attn_mask should not be set "
              "when is_causal=True")
        mm_ = _tensor(name, "attn_mask", attn_mask)
        check(mm_.dtype in (torch.bool, qm.dtype), lambda: f"{name}: Expected attn_mask dtype to be bool or "
              f"float or to match query dtype, but got attn_mask.dtype: {mm_.dtype} and query.dtype: "
              f"{qm.dtype} instead.")
        want = (*qm.shape[:-1], km.shape[-2])
        check(tuple(mm_.shape) == want, lambda: f"prims.sdpa: attn_mask of shape {shape_text(attn_mask)} "
              f"must have shape [{', '.join(map(str, want))}] (prims do not broadcast)")
    return TensorMeta(out_shape, qm.dtype, qm.device)


def _sdpa_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    kwargs = {"enable_gqa": True} if enable_gqa else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal,
                                          scale=scale, **kwargs)


sdpa = prim("sdpa", _sdpa_meta, _sdpa_ref, tags=("extern",))


def _sdpa_backward_meta(g: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                        scale: float | None = None, enable_gqa: bool = False, mask_grad: bool = False) -> tuple:
    out = _sdpa_meta(q, k, v, attn_mask, is_causal, scale, enable_gqa)
    gm = _tensor("sdpa_backward", "grad", g)
    check(tuple(gm.shape) == tuple(out.shape) and gm.dtype == out.dtype,
          lambda: f"prims.sdpa_backward: grad {shape_text(g)} ({gm.dtype}) must match the attention's output "
                  f"[{', '.join(map(str, out.shape))}] ({out.dtype})")
    check(not mask_grad or (is_tensor(attn_mask) and meta_of(attn_mask).dtype.is_floating_point),
          lambda: "prims.sdpa_backward: mask_grad needs a float attn_mask")
    wrt = (q, k, v, attn_mask) if mask_grad else (q, k, v)
    return tuple(TensorMeta(meta_of(t).shape, meta_of(t).dtype, meta_of(t).device) for t in wrt)


def _sdpa_backward_ref(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
                       enable_gqa: bool = False, mask_grad: bool = False) -> tuple:
    # eager's own backward: run the attention again on detached leaves and let autograd differentiate it
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    mask = attn_mask.detach() if isinstance(attn_mask, torch.Tensor) else attn_mask
    if mask_grad:  # a float mask computed from parameters (Swin's relative position bias)
        mask = mask.requires_grad_(True)
        leaves.append(mask)
    with torch.enable_grad():
        out = _sdpa_ref(*leaves[:3], mask, is_causal, scale, enable_gqa)
        grads = torch.autograd.grad(out, leaves, g)
    return tuple(t.contiguous() for t in grads)


sdpa_backward = prim(
    "sdpa_backward", _sdpa_backward_meta, _sdpa_backward_ref, tags=("extern",),
    doc="sdpa_backward(g, q, k, v, attn_mask, is_causal, scale, enable_gqa, mask_grad=False) -> (grad q, "
        "grad k, grad v[, grad attn_mask with mask_grad]): the gradients of sdpa as eager autograd computes "
        "them; contiguous")


def _bhld_strides(shape: Sequence[int]) -> tuple:
    """Strides of a [B, H, L, D] tensor laid out [B, L, H, D] (how torch's CPU flash attention lays out its
    logsumexp and gradients; for a [B, H, L] logsumexp, D = 1 dropped)."""
    if len(shape) == 3:
        b, h, length = shape
        return (length * h, 1, h)
    b, h, length, d = shape
    return (length * h * d, d, h * d, 1)


def _in_layout(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """t with exactly these strides (kernels read the buffer at the meta's strides): t itself when torch
    already gives them, else a copy into them."""
    if tuple(t.stride()) == strides:
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _flash_lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _sdpa_flash_meta(q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                     scale: float | None = None) -> tuple:
    qm = meta_of(q)
    check(qm.ndim == 4 and is_tensor(k) and meta_of(k).ndim == 4 and meta_of(k).shape[0] == qm.shape[0],
          lambda: f"prims.sdpa_flash: query, key and value must be [B, H, L, E] with one B, got "
                  f"{shape_text(q)}, {shape_text(k)}, {shape_text(v)}")
    grouped = meta_of(k).shape[1] != qm.shape[1]  # grouped-query heads: k and v have fewer
    out = _sdpa_meta(q, k, v, attn_mask, is_causal, scale, grouped)
    # the kernel writes into empty_like(q). A q sliced out of a fused qkv projection and transposed to
    # [B, H, L, E] gives an out laid out [B, L, H, E], so the usual `out.transpose(1, 2).reshape(B, L, H * E)`
    # after it is a view, as in eager
    if all(isinstance(d, int) for d in (*qm.shape, *qm.strides)):   # (symbolic: contiguous, as before)
        out = TensorMeta(out.shape, out.dtype, out.device, preserve_strides(qm.shape, qm.strides))
    lse_shape = tuple(qm.shape[:-1])
    return out, TensorMeta(lse_shape, _flash_lse_dtype(qm.dtype), qm.device, _bhld_strides(lse_shape))


def _sdpa_flash_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
                    is_causal: bool = False, scale: float | None = None) -> tuple:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[:2]
    # out has the meta's strides already (torch's empty_like(q)); the wrapper checks every extern's result
    return out, _in_layout(lse, _bhld_strides(tuple(lse.shape)))


sdpa_flash = prim(
    "sdpa_flash", _sdpa_flash_meta, _sdpa_flash_ref, tags=("extern",),
    doc="sdpa_flash(q, k, v, attn_mask, is_causal, scale) -> (out, logsumexp): sdpa by torch's CPU flash "
        "attention, the kernel eager's sdpa runs where it is eligible, keeping the row logsumexp its "
        "backward takes; q, k, v [B, H, L, E] (k and v may have fewer heads than q, dividing them)")


def _sdpa_flash_backward_meta(g: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, attn_mask: Any = None,
                              is_causal: bool = False, scale: float | None = None) -> tuple:
    om, lse_meta = _sdpa_flash_meta(q, k, v, attn_mask, is_causal, scale)
    check(tuple(meta_of(g).shape) == tuple(om.shape) and tuple(meta_of(lse).shape) == tuple(lse_meta.shape),
          lambda: f"prims.sdpa_flash_backward: grad {shape_text(g)} and logsumexp {shape_text(lse)} must match "
                  f"the attention's output and logsumexp")
    return tuple(TensorMeta(meta_of(t).shape, meta_of(t).dtype, meta_of(t).device,
                            _bhld_strides(tuple(meta_of(t).shape))) for t in (q, k, v))


def _sdpa_flash_backward_ref(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             out: torch.Tensor, lse: torch.Tensor, attn_mask: Any = None,
                             is_causal: bool = False, scale: float | None = None) -> tuple:
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        g, q, k, v, out, lse, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
    return tuple(_in_layout(t, _bhld_strides(tuple(t.shape))) for t in grads)


sdpa_flash_backward = prim(
    "sdpa_flash_backward", _sdpa_flash_backward_meta, _sdpa_flash_backward_ref, tags=("extern",),
    doc="sdpa_flash_backward(g, q, k, v, out, logsumexp, attn_mask, is_causal, scale) -> (grad q, grad k, "
        "grad v): torch's CPU flash attention backward (no gradient for the mask), each laid out [B, L, H, E]")


# ---- sorting and selection ------------------------------------------------------------------------------

def _sort_meta(a: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> tuple:
    m = _tensor("sort", "input", a)
    wrap_dim(dim, m.ndim, "sort")
    check(not m.dtype.is_complex, lambda: f"sort(): not supported for complex tensors ({m.dtype})")
    return TensorMeta(m.shape, m.dtype, m.device), TensorMeta(m.shape, torch.int64, m.device)


def _sort_ref(a: torch.Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> tuple:
    values, indices = torch.sort(a, dim=dim, descending=descending, stable=stable)
    return values, indices


sort = prim("sort", _sort_meta, _sort_ref, tags=("extern",))


def _topk_meta(a: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    m = _tensor("topk", "input", a)
    dim = wrap_dim(dim, m.ndim, "topk")
    size = m.shape[dim] if m.ndim > 0 else 1
    check(isinstance(k, int) and 0 <= k <= size, lambda: f"topk: selected index k out of range (k={k}, "
          f"input {shape_text(a)}, dim {dim})")
    check(not m.dtype.is_complex, lambda: f"topk: not supported for complex tensors ({m.dtype})")
    check(not (m.dtype == torch.bool and m.device.type == "cpu"),
          lambda: "topk does not support bool dtypes on CPU")
    shape = list(m.shape)
    if shape:
        shape[dim] = k
    return TensorMeta(shape, m.dtype, m.device), TensorMeta(shape, torch.int64, m.device)


def _topk_ref(a: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    values, indices = torch.topk(a, k, dim=dim, largest=largest, sorted=sorted)
    return values, indices


topk = prim("topk", _topk_meta, _topk_ref, tags=("extern",))


# ---- scans ----------------------------------------------------------------------------------------------

def _scan(name: str, ref: Any, allowed: Any, what: str, with_indices: bool = False) -> Any:
    def meta(a: Any, dim: int) -> Any:
        m = _tensor(name, "input", a)
        wrap_dim(dim, m.ndim, name)
        check(allowed(m.dtype), lambda: f"prims.{name}: not defined for {m.dtype} tensors ({what})",
              TypeError)
        values = TensorMeta(m.shape, m.dtype, m.device)
        if with_indices:
            return values, TensorMeta(m.shape, torch.int64, m.device)
        return values
    return prim(name, meta, ref, tags=("extern", "scan"))


def _cum_extremum_ref(fn: Any) -> Any:
    def ref(a: torch.Tensor, dim: int) -> tuple:
        values, indices = fn(a, dim)
        return values, indices
    return ref


cumsum = _scan("cumsum", lambda a, dim: torch.cumsum(a, dim, dtype=a.dtype), lambda d: d != torch.bool,
               "decompositions convert bool to int64")
cumprod = _scan("cumprod", lambda a, dim: torch.cumprod(a, dim, dtype=a.dtype), lambda d: d != torch.bool,
                "decompositions convert bool to int64")
cummax = _scan("cummax", _cum_extremum_ref(torch.cummax), lambda d: not d.is_complex, "not complex",
               with_indices=True)
cummin = _scan("cummin", _cum_extremum_ref(torch.cummin), lambda d: not d.is_complex, "not complex",
               with_indices=True)
logcumsumexp = _scan("logcumsumexp", lambda a, dim: torch.logcumsumexp(a, dim),
                     lambda d: d.is_floating_point or d.is_complex, "floating point only")
