"""Compile every Triton kernel kiln generates for a sweep of programs for a CUDA GPU, without a GPU.

    TRITON_INTERPRET=1 python -m kiln.testing.tritoncheck [--fuzz-seeds 0:300] [--opinfo float32,int64,bool]
                                                           [--arch 90] [-j 2]

The programs (tensor-fuzz seeds, OpInfo first samples) run through the triton backend on Triton's
interpreter (checked against eager as usual); every distinct kernel they produce is then compiled for
compute capability `--arch` in fresh processes without the interpreter (Triton's frontend, LLVM and ptxas:
`kiln.runtime.tritonlib.compile_check`), at the tiles a GPU would launch. Prints the kernel count and
each compile error. The interpreter accepts Python the compiler refuses; this finds it.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import sys
import warnings


def gather(fuzz_seeds: range, opinfo_dtypes: list[str]) -> list[dict]:
    """Compile-check jobs for the distinct kernels the programs produce (run under the interpreter)."""
    import kiln.backends.triton as backend
    import kiln.ops  # noqa: F401  (registers the decompositions)
    from kiln.testing import opinfo, tensorfuzz
    seen: dict[str, dict] = {}
    original = backend.segment_source

    def recording(*args, **kwargs):
        seg = original(*args, **kwargs)
        path = backend.load_module(seg.source).__file__
        for k in seg.kernels:
            body = k.source.split("\n", 2)[2]  # without the name line
            if body not in seen:
                cfg = backend.launch_config(k, "device")
                seen[body] = {"path": path, "kernel": k.name, "signature": k.signature,
                              "constants": {"XBLOCK": cfg["XBLOCK"], "RBLOCK": cfg["RBLOCK"]}}
        return seg
    backend.segment_source = recording
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for seed in fuzz_seeds:
                tensorfuzz.check_seed(seed, backends=("triton",), calls=1)
            for op in opinfo.op_database():
                for dtype in opinfo_dtypes:
                    if opinfo.DTYPES[dtype] in op.supported_dtypes("cpu"):
                        opinfo.run_op(op, dtype, first_sample=True, backend="triton")
    finally:
        backend.segment_source = original
    return list(seen.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.tritoncheck", description=__doc__.split("\n")[0])
    parser.add_argument("--fuzz-seeds", default="0:300", help="START:STOP")
    parser.add_argument("--opinfo", default="float32,int64,bool", help="dtypes (empty: none)")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("-j", type=int, default=2, help="compiling processes")
    args = parser.parse_args(argv)
    from kiln.backends import triton as backend
    if not backend.interpreting():
        print("run with TRITON_INTERPRET=1 (the programs run on the interpreter)", file=sys.stderr)
        return 2
    start, stop = (int(v) for v in args.fuzz_seeds.split(":"))
    jobs = gather(range(start, stop), [d for d in args.opinfo.split(",") if d])
    print(f"{len(jobs)} distinct kernels; compiling for sm_{args.arch} in {args.j} processes", flush=True)
    parts = [jobs[i::args.j] for i in range(args.j)]
    with concurrent.futures.ThreadPoolExecutor(args.j) as pool:
        errors = [e for part in pool.map(lambda p: backend.compile_check_in_subprocess(p, args.arch, 7200), parts)
                  for e in part]
    for e in errors:
        print(e)
    print(f"{len(jobs) - len(errors)} of {len(jobs)} kernels compiled for sm_{args.arch}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
