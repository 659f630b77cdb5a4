"""A `Target`: what one backend's hardware and code emitter can do, passed to lower, schedule and codegen.

The stages below capture are shared by every backend; what differs between C++ on a CPU and Triton on a GPU
(which dtypes kernels compute in, which prims run as library calls, when a kernel runs in parallel and how,
what may stay inside a kernel instead of in memory, the vector width) is data here,
never a constant of a stage. A backend declares its Target next to its code emitter (the C++ one is
`kiln.codegen.cpp.CPP_TARGET`).
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    # dtypes its kernels compute in; a value of any other dtype runs as a fallback (torch)
    compute_dtypes: frozenset[torch.dtype]
    # prims run as whole-tensor library calls (BLAS, convolution, attention) instead of being lowered
    extern_prims: frozenset[str]
    # a kernel over fewer elements than this runs on one thread (starting threads costs more)
    parallel_threshold: int
    # a kernel with fewer outer iterations than this splits its inner loops across threads instead
    min_parallel_outer: int
    # what a buffer written and read only inside one kernel may become: "scalar" (a register holding the
    # current outer iteration's value), "array" (a per-thread scratch row), "recompute" (a pointwise row
    # buffer computed again from its body where it is read); empty: everything in memory
    local_kinds: frozenset[str]
    # bytes of one SIMD register (the inner loop's vector width is this over the element size)
    vector_bytes: int
    # lay out the values around 2-D convolutions channels-last (NHWC) where nothing outside sees them
    # (kiln.lower.conv_layout: oneDNN's NHWC convolutions are faster on CPUs)
    channels_last_convs: bool = False
    # lower a concatenation as a buffer its inputs are computed (or copied) into, a cat of a run of another
    # one's inputs as a window of that one's (kiln.lower.concat); else each reader selects the input
    concat_in_place: bool = False
    # whether an inner loop converting a 64-bit integer to a float still vectorizes (x86 needs AVX-512DQ;
    # without it g++ leaves the whole loop scalar, exp calls included)
    wide_int_to_float_simd: bool = True
    # whether kernels may load through an index read from a tensor (`h.indirect`: embedding lookups,
    # gather, advanced indexing), checking it and reporting one outside its dim to the wrapper
    indirect_indexing: bool = False
    # a one-row matrix product (a linear at batch 1) as a kernel rather than the library's gemv
    # (kiln.lower.matvec: the CPU's BLAS reads its weight at half the copy bandwidth)
    matvec_kernels: bool = False

    def computes(self, dtype: torch.dtype) -> bool:
        return dtype in self.compute_dtypes


ALL_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64, torch.int32,
                        torch.int16, torch.int8, torch.uint8, torch.bool})
# the library kernels (BLAS, oneDNN, torch's attention) kiln calls by design: externs, not fallbacks; the
# backward ones too (a convolution's backward is oneDNN's, as its forward is; under autocast the zoo's
# convolutions stay externs, not gather + mm, so a training step reaches convolution_backward)
LIBRARY_PRIMS = frozenset({"mm", "addmm", "bmm", "convolution", "sdpa", "sdpa_flash", "convolution_backward",
                           "sdpa_backward", "sdpa_flash_backward", "all_reduce"})
