"""``padless bench``: flags from the run configuration's fields, then :func:`padless.bench.run.run_benchmark`."""

from __future__ import annotations

import argparse
import dataclasses

from padless.bench.config import PRESETS, Preset, RunConfig, field_docs
from padless.bench.run import run_benchmark
from padless.bench.strategies import STRATEGIES, parse_strategies
from padless.cli import as_flags, plain


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS),
                        help="a named configuration; the flags below override it")  # fmt: skip
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset, e.g. packing,padding")
    docs = field_docs(Preset)
    for f in dataclasses.fields(Preset):
        kind = {"int": int, "float": float, "int | None": int}.get(str(f.type), str)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None, help=plain(docs.get(f.name)))
    parser.add_argument("--mode", default="same-examples", choices=["same-examples", "token-budget"])
    parser.add_argument("--token-budget", type=int, default=None, help="tokens per step in token-budget mode (default batch size x max length)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer name or path (default: the model's)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on a GPU, float32 on a CPU), float32, bfloat16, float16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", default="runs/bench", help="output folder for results.json, the plots and report.html")
    parser.add_argument("--full-logits", action="store_true",
                        help="compute logits at every position (default: only where a token is trained, for every strategy)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    preset = PRESETS[args.preset]
    values = {f.name: getattr(args, f.name) if getattr(args, f.name) is not None else getattr(preset, f.name)
              for f in dataclasses.fields(Preset)}  # fmt: skip
    return RunConfig(
        **values, strategies=tuple(parse_strategies(args.strategies)), mode=args.mode,
        token_budget=args.token_budget, seed=args.seed, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer,
        trained_logits_only=not args.full_logits,
    )  # fmt: skip


def run_bench(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import torch.distributed as dist

    try:
        config = config_from_args(args)
    except ValueError as exc:  # the config names its fields; say them as flags
        raise ValueError(as_flags(str(exc), [f.name for f in dataclasses.fields(RunConfig)])) from None
    try:
        run_benchmark(config, args.out, progress=not args.no_progress)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0
