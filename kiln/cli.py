"""The `kiln` command.

Both `bench` and `explain` run the quick suite unless told otherwise (--suite, --models).

    kiln bench [--suite quick|full|hf] [--models NAMES] [--backends eager,torch.compile,kiln]
               [--mode inference|training] [--precision fp32|bf16|fp16|amp|bf16-weights|fp16-weights]
               [--batch N] [--out DIR] [--kiln-backend NAME] [--memory] [--memory-only] [--profile]
               [--profile-only]
    kiln bench --distributed N [--strategy ddp|fsdp|tp|pp] [--models NAMES] [--bucket-cap-mb MB]
    kiln bench --generate [--models NAMES] [--new-tokens N] [--repeat R] [--caches dynamic,static]
                          [--threads N]
    kiln explain [--models NAMES|all|hf-all] [--suite quick|full|hf] [--json PATH] [--against PATH] [--isolate]
                 [--batch N] [--threads N] [--check]
    kiln cache info|clear
    kiln --version
    kiln bisect [--workdir DIR] [--timeout S] SCRIPT [ARGS...]
    kiln report [--out DIR] SCRIPT [ARGS...]
"""
from __future__ import annotations

import argparse
import os
import sys


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def version_text() -> str:
    """kiln's version (the installed package's metadata, else kiln.__version__), torch's and Python's."""
    from importlib import metadata
    try:
        kiln_version = metadata.version("kiln")
    except metadata.PackageNotFoundError:
        from . import __version__ as kiln_version
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"kiln {kiln_version} (torch {torch_version}, Python {sys.version.split()[0]})"


def human_bytes(count: int) -> str:
    """`12.3 MiB` for 12_897_484 bytes (binary units; plain bytes below 1 KiB)."""
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


DEFAULT_SUITE = "quick"  # of both `kiln bench` and `kiln explain`
SUITES = ("quick", "full", "hf")
# kiln.bench.precision.PRECISIONS, named here so that `kiln --help` does not import torch
PRECISIONS = ("fp32", "bf16", "fp16", "amp", "bf16-weights", "fp16-weights")
SUITE_HELP = ("quick: a few tiny models (minutes); full: the hand-written zoo and five Hugging Face models; "
              "hf: the 21 Hugging Face models (default: quick)")


ENVIRONMENT_HELP = """environment (every KILN_* variable: kiln.config.describe()):
  KILN_TRACE_DIR=dir   write a compile report of the process, dir/kiln_report_<pid>.html, at exit:
                       captures, graphs with their source lines, graph breaks with reasons and hints,
                       recompiles and guards, passes with their times, kernels with their user lines
                       (`kiln report SCRIPT` sets it; kiln.report(path) writes one from Python)
  KILN_LOGS=help       list the log channels (KILN_LOGS=graph,+fusion prints them on stderr)
  KILN_DEBUG_DIR=dir   dump every compiled graph's IR after each pass and its generated code"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description="kiln: a compiler for unmodified PyTorch "
                                                              "programs", epilog=ENVIRONMENT_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench", help="benchmark the model zoo: eager, torch.compile and kiln side by side",
        description="Per model and compiler: accuracy (fp64 reference), speedup over eager, compile time "
                    "cold and warm, peak memory. Writes a table, results.json, results.md and plots.")
    bench.add_argument("--suite", choices=SUITES, default=DEFAULT_SUITE, help=SUITE_HELP)
    bench.add_argument("--models", type=_names, default=None,
                       help="comma-separated zoo names (overrides --suite); --list shows them")
    bench.add_argument("--backends", type=_names, default=["eager", "torch.compile", "kiln"],
                       help="comma-separated compilers: eager, torch.compile, kiln, kiln:BACKEND "
                            "(default: eager,torch.compile,kiln)")
    bench.add_argument("--mode", choices=("inference", "training"), default="inference",
                       help="training runs forward + backward + an SGD step (default: inference)")
    bench.add_argument("--precision", choices=PRECISIONS, default="fp32",
                       help="bf16/fp16: every compiler under torch.autocast('cpu', dtype); amp: fp16 autocast "
                            "with a GradScaler in training; bf16-weights/fp16-weights: model.to(dtype); "
                            "accuracy at the dtype's tolerance (default: fp32)")
    bench.add_argument("--batch", type=int, default=None, help="batch size (default: each model's own)")
    bench.add_argument("--out", default="bench_out", help="output directory (default: bench_out)")
    bench.add_argument("--kiln-backend", default="auto", help="kiln backend for the kiln column "
                                                              "(default: auto)")
    bench.add_argument("--timeout", type=float, default=600.0,
                       help="seconds per worker process before the row is a timeout (default: 600)")
    bench.add_argument("--budget", type=float, default=2.0,
                       help="seconds of timed calls per model and compiler (default: 2)")
    bench.add_argument("--threads", type=int, default=1,
                       help="torch threads per run (default: 1, steady ratios on a shared machine; 0: "
                            "torch's own)")
    bench.add_argument("--no-warm", action="store_true", help="skip the warm compile measurement")
    bench.add_argument("--memory", action="store_true",
                       help="also measure peak and steady RSS of eager and each compiler, each in a fresh "
                            "process, and print them side by side")
    bench.add_argument("--memory-only", action="store_true",
                       help="only the memory measurement (no timing, accuracy or compile-time runs)")
    bench.add_argument("--profile", action="store_true",
                       help="after the rows, run kiln.profile on each model (inference, a fresh process "
                            "each): per-kernel table, JSON and roofline PNG in OUT/profile/")
    bench.add_argument("--profile-only", action="store_true",
                       help="only the kiln.profile runs (no eager/torch.compile/kiln rows)")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--list", action="store_true", help="list the model zoo and exit")
    bench.add_argument("--distributed", type=int, default=None, metavar="N",
                       help="DDP training step time on N gloo ranks: eager DDP, kiln.compile(DDP), "
                       "DDP(kiln.compile) and the torch.compile baseline wrapping DDP "
                       "(models: --models, default nanogpt)")
    bench.add_argument("--dynamic", action="store_true",
                       help="dynamic shapes: a decoder block at 30 shapes, HF GPT-2/LLaMA at 8 lengths, "
                            "greedy decoding with a growing KV cache; kiln beside torch.compile "
                            "(bench/bench_dynamic.py; table, OUT/dynamic.json)")
    bench.add_argument("--strategy", choices=("ddp", "fsdp", "tp", "pp"), default="ddp",
                       help="with --distributed: ddp (DistributedDataParallel, the default), fsdp (FSDP2: "
                            "fully_shard on each block and the model; eager, kiln, torch.compile), tp (tensor "
                            "parallel: parallelize_module with ColwiseParallel/RowwiseParallel; eager TP, "
                            "kiln, torch.compile; models mlp, llama) or pp (pipeline parallel: one stage "
                            "per rank under PipelineStage, GPipe and 1F1B schedules; eager, kiln and "
                            "torch.compile stage modules; models nanogpt, llama)")
    bench.add_argument("--generate", action="store_true",
                       help="greedy generation at batch 1: prefill ms, decode ms/token and tokens/s for "
                            "eager, torch.compile and kiln, with the bandwidth floor (--models from "
                            "llama_120m, llama_hf_tiny, llama, nanogpt; default llama_120m,llama,nanogpt)")
    bench.add_argument("--new-tokens", type=int, default=128, help="--generate: new tokens (default 128)")
    bench.add_argument("--repeat", type=int, default=3,
                       help="--generate: timed runs per compiler (default 3)")
    bench.add_argument("--caches", type=_names, default=["dynamic", "static"],
                       help="--generate: Hugging Face caches (default dynamic,static)")
    bench.add_argument("--bucket-cap-mb", type=float, default=None,
                       help="with --distributed: DDP's bucket_cap_mb for every variant (default DDP's)")

    explain = commands.add_parser(
        "explain", help="graph-break census: kiln.explain on zoo models, breaks grouped by reason",
        description="Per model: graphs, graph breaks, frames run natively, capture time (the explain call "
                    "minus an eager call); then each model's breaks grouped by reason, with counts, where "
                    "they happen and a hint. A model that fails is an error row; the census goes on.")
    explain.add_argument("--models", type=_names, default=None,
                         help="comma-separated zoo names, 'all' for the whole zoo, 'hf-all' for every "
                              "transformers model type (hf:<type>, built from a small config; implies --check; "
                              "use with --isolate and --json) (default: --suite)")
    explain.add_argument("--suite", choices=SUITES, default=DEFAULT_SUITE,
                         help="the zoo suite to explain when --models is not given; " + SUITE_HELP)
    explain.add_argument("--check", action="store_true",
                         help="also compile each model with the default backend: first-call time, the result "
                              "judged against eager (correct/wrong/crash), and TorchDynamo's graphs and breaks "
                              "(always on for hf: entries)")
    explain.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON to PATH")
    explain.add_argument("--against", default=None, metavar="PATH",
                         help="compare graphs, breaks, frames run natively, ops and fallbacks per model with a "
                              "census written by --json (another Python or torch); exit 1 when they differ")
    explain.add_argument("--batch", type=int, default=None, help="batch size (default: each model's own)")
    explain.add_argument("--isolate", action="store_true",
                         help="one fresh process per model (a crash or hang is a row; slower)")
    explain.add_argument("--timeout", type=float, default=600.0,
                         help="seconds per model with --isolate (default: 600)")
    explain.add_argument("--threads", type=int, default=1,
                         help="torch threads (default: 1, steadier eager times on a busy machine; 0: "
                              "torch's own)")

    bisect = commands.add_parser(
        "bisect", help="find the first fusion or rewrite that makes a script's result wrong",
        description="Runs SCRIPT (which must exit nonzero when kiln's result differs from eager's, e.g. "
                    "by an assert_close that raises) in fresh processes with KILN_FUEL=n, binary-searching "
                    "n, and prints the first optimization decision that makes it fail, with the IR before "
                    "and after it (kiln.testing.bisect).")
    bisect.add_argument("script", help="the Python script to run")
    bisect.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    bisect.add_argument("--workdir", default=None,
                        help="where the runs' IR dumps and fuel reports go (default: a new temporary dir)")
    bisect.add_argument("--timeout", type=float, default=600.0,
                        help="seconds per run before it counts as failing (default: 600)")

    report = commands.add_parser(
        "report", help="run a script with the compile report on and say where its HTML page went",
        description="Runs SCRIPT with KILN_TRACE_DIR=OUT: at exit each process that used kiln writes one "
                    "static HTML page, OUT/kiln_report_<pid>.html (captures, graphs with their source "
                    "lines, graph breaks with reasons and hints, recompiles and guards, each compile's "
                    "passes with their times, kernels with the user lines fused into each, kiln.profile "
                    "reports). Open it in a browser; no server needed. Exits with the script's status.")
    report.add_argument("--out", default="kiln_trace",
                        help="the directory of the pages (default: kiln_trace)")
    report.add_argument("script", help="the Python script to run")
    report.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")

    cache = commands.add_parser(
        "cache", help="the kernel cache: show it (info) or empty it (clear)",
        description="The on-disk cache of compiled kernels (KILN_CACHE_DIR/cpp, default ~/.cache/kiln/cpp): "
                    "`info` shows its directory, entries, bytes, size cap (KILN_CACHE_MAX_BYTES) and whether "
                    "kiln uses it; `clear` removes every entry, and kiln.profile's cached machine roofs.")
    cache.add_argument("action", choices=("info", "clear"), help="info: show the cache; clear: empty it")
    return parser


def bisect_main(args: argparse.Namespace) -> int:
    from .testing import bisect

    if not os.path.isfile(args.script):
        print(f"kiln bisect: no such script: {args.script}", file=sys.stderr)
        return 2
    found = bisect.bisect(args.script, args.args, workdir=args.workdir, timeout_s=args.timeout,
                          progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(bisect.report(found, runs=False))
    return 0 if found.decision is not None else 1


def report_main(args: argparse.Namespace) -> int:
    import subprocess
    from . import config

    if not os.path.isfile(args.script):
        print(f"kiln report: no such script: {args.script}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    before = set(os.listdir(out))
    env = config.child_environment()
    env["KILN_TRACE_DIR"] = out
    child = subprocess.Popen([sys.executable, args.script, *args.args], env=env)
    status = child.wait()
    written = sorted(name for name in set(os.listdir(out)) - before if name.endswith(".html"))
    own = f"kiln_report_{child.pid}.html"
    if own in written:  # the script's own page first, then its child processes'
        written.remove(own)
        written.insert(0, own)
    for name in written:
        print(f"kiln report: wrote {os.path.join(out, name)}")
    if not written:
        print(f"kiln report: {args.script} wrote no report (it did not import kiln's API, or it was killed)",
              file=sys.stderr)
    return status if status >= 0 else 128 - status


def bench_main(args: argparse.Namespace) -> int:
    from .bench import plots, report, runner
    from .testing import models as zoo

    if args.dynamic:
        import os
        import subprocess
        from .bench.adapters import BASELINES_FILE
        script = BASELINES_FILE.parent / "bench_dynamic.py"
        if not script.is_file():
            print(f"kiln bench --dynamic: {script} not found (run from a source checkout)", file=sys.stderr)
            return 2
        os.makedirs(args.out, exist_ok=True)
        return subprocess.call([sys.executable, str(script), "--threads", str(args.threads or 1), "--json",
                                os.path.join(args.out, "dynamic.json")])
    if args.distributed and args.strategy == "tp":
        from .bench import distributed_tp
        return distributed_tp.main(args.distributed, args.models, timeout_s=args.timeout * 2)
    if args.distributed and args.strategy == "pp":
        from .bench import distributed_pp
        return distributed_pp.main(args.distributed, args.models, timeout_s=args.timeout * 2)
    if args.generate:
        return generate_main(args)
    if args.distributed:
        from .bench import distributed
        return distributed.main(args.distributed, args.models, timeout_s=args.timeout * 2,
                                bucket_cap_mb=args.bucket_cap_mb, strategy=args.strategy)
    if args.list:
        for name, spec in zoo.ZOO.items():
            extra = "" if spec.available() else f"  (needs {', '.join(spec.requires)})"
            print(f"{name:16s} batch {spec.batch:3d}  {'/'.join(spec.suites):10s}  {spec.description}{extra}")
        return 0
    try:
        options = runner.Options(suite=args.suite, models=args.models, backends=tuple(args.backends),
                                 mode=args.mode, precision=args.precision, batch=args.batch, out=args.out,
                                 kiln_backend=args.kiln_backend,
                                 timeout_s=args.timeout, budget_s=args.budget, threads=args.threads or None,
                                 warm=not args.no_warm, memory=args.memory or args.memory_only,
                                 memory_only=args.memory_only,
                                 plots=not args.no_plots, profile=args.profile,
                                 profile_only=args.profile_only)
        runner.select_models(options)
    except (KeyError, ValueError) as e:
        print(f"kiln bench: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    results = runner.run(options)
    if results["rows"]:
        print(report.table(results["rows"], results["meta"]))
        print()
    for entry in results.get("profiles", ()):
        print(entry.get("table") or f"kiln.profile {entry['model']}: {entry['status']}: {entry.get('error')}")
        print()
    if args.no_plots or plots.available():
        print("wrote " + ", ".join(results["files"]))
    else:
        print("wrote " + ", ".join(results["files"]) + "  (no plots: pip install matplotlib)")
    if results["meta"]["interrupted"]:
        print("interrupted: the finished rows are written", file=sys.stderr)
        return 130
    return 0


def generate_main(args: argparse.Namespace) -> int:
    from .bench import generate
    compilers = tuple("kiln" if name.startswith("kiln") else name for name in args.backends)
    options = generate.Options(models=tuple(args.models or generate.DEFAULT_MODELS), compilers=compilers,
                               caches=tuple(args.caches), new_tokens=args.new_tokens, repeat=args.repeat,
                               threads=args.threads or None, out=args.out, kiln_backend=args.kiln_backend,
                               progress=lambda text: print(text, file=sys.stderr, flush=True))
    try:
        results = generate.run(options)
    except ValueError as e:
        print(f"kiln bench --generate: {e}", file=sys.stderr)
        return 2
    print(generate.table(results["rows"], results["meta"]))
    if results["files"]:
        print("wrote " + ", ".join(results["files"]))
    return 0 if all(row["status"] == "pass" for row in results["rows"]) else 1


def explain_main(args: argparse.Namespace) -> int:
    from .bench import census

    try:
        names = census.select(args.models, args.suite)
    except (KeyError, ValueError) as e:
        print(f"kiln explain: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    def save(rows: list[dict]) -> None:
        if args.json:
            census.write_json(rows, args.json)
    rows = census.run(names, batch=args.batch, isolate=args.isolate, timeout_s=args.timeout,
                      threads=args.threads or None, progress=lambda label: print(label, file=sys.stderr, flush=True),
                      check=args.check or None, on_row=save)
    print(census.table(rows))
    if args.json:
        census.write_json(rows, args.json)
        print(f"\nwrote {args.json}")
    if args.against:
        differences = census.compare(rows, args.against)
        for line in differences:
            print(f"differs: {line}")
        print(f"\n{len(differences)} difference(s) from {args.against}")
        return 1 if differences else 0
    return 0


def cache_main(args: argparse.Namespace) -> int:
    from .runtime import cache

    if args.action == "clear":
        from .bench import machine
        removed, size = cache.clear()
        print(f"removed {removed} entries ({human_bytes(size)}) from {cache.configured_directory()}")
        if machine.clear_peaks():   # kiln.profile's roofs: measured again on the next profile
            print(f"removed the machine roofs {machine.peaks_path()}")
        return 0
    info = cache.info()
    cap = info["max_bytes"]
    print(f"directory: {info['directory']}\nentries: {info['entries']}\n"
          f"size: {human_bytes(info['bytes'])} ({info['bytes']} bytes)\n"
          f"max size: {f'{human_bytes(cap)} ({cap} bytes)' if cap >= 0 else 'no cap'}\n"
          f"status: {info['status']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `kiln` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return bench_main(args)
    if args.command == "explain":
        return explain_main(args)
    if args.command == "bisect":
        return bisect_main(args)
    if args.command == "report":
        return report_main(args)
    if args.command == "cache":
        return cache_main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
