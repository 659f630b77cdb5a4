"""The C++ backend's Target (kiln.lower.target): what its kernels compute, call out and lay out."""
from __future__ import annotations

from ..lower.target import ALL_DTYPES, LIBRARY_PRIMS, Target
from ..runtime.build import wide_int_to_float_simd

# The C++ backend's target: every dtype below computed by its own C++ type; matmul, convolution and
# attention call torch (BLAS, oneDNN); OpenMP over the outer loops from 32768 elements (below that,
# starting the threads costs more than it saves), over the inner loops when there are fewer than 4 outer
# iterations; registers and per-thread scratch rows for buffers that never leave their kernel; AVX-512
# (64-byte vectors, the alignment of stack tiles); NHWC values around 2-D convolutions (oneDNN's faster
# layout); concatenations computed in place by their inputs; loads through indices read from tensors;
# one-row products as kernels.
CPP_TARGET = Target("cpp", compute_dtypes=ALL_DTYPES, extern_prims=LIBRARY_PRIMS, parallel_threshold=32768,
                    min_parallel_outer=4, local_kinds=frozenset({"scalar", "array"}), vector_bytes=64,
                    channels_last_convs=True, concat_in_place=True,
                    wide_int_to_float_simd=wide_int_to_float_simd(), indirect_indexing=True,
                    matvec_kernels=True)
