"""``padless verify``: per backend, packed logits against each sequence alone and packed gradients
against padded ones (:func:`padless.verify_isolation`)."""

from __future__ import annotations

import argparse
import json

from padless.verify import DEFAULT_BACKENDS, TOLERANCES, _random_sequences, verify_isolation


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-gpt2",
                        help="tiny-<gpt2|llama|qwen2|mistral>, a GPT-2 size, smollm2-135m, or a transformers name/path")  # fmt: skip
    parser.add_argument("--backends", default=",".join(DEFAULT_BACKENDS), help="comma-separated attention backends")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCES))
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--lengths", default=None, help="comma-separated sequence lengths (default: a built-in mix)")
    parser.add_argument("--max-length", type=int, default=32, help="packed row length (0: one row for all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run_verify(args: argparse.Namespace) -> int:
    import torch

    from padless.models import build_model, resolve_device

    device = resolve_device(args.device)
    model = build_model(args.model, dtype=getattr(torch, args.dtype)).to(device)
    sequences = None
    if args.lengths:
        lengths = [int(x) for x in args.lengths.split(",")]
        sequences = [f["input_ids"] for f in _random_sequences(lengths, model.config.vocab_size, args.seed)]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    report = verify_isolation(model, sequences, backends=backends, max_length=args.max_length or None, seed=args.seed)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(f"model {report.model} | {report.dtype} | {report.device} | lengths {report.lengths} | rows of {report.max_length}")
        print(f"{'backend':<18} {'status':<12} {'max |dlogit|':>13} {'tolerance':>10} {'grad rel diff':>14} {'tolerance':>10}")
        for r in report.results:
            fmt = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
            print(f"{r.backend:<18} {r.status:<12} {fmt(r.max_logit_diff):>13} {fmt(r.logit_tolerance):>10} "
                  f"{fmt(r.grad_rel_diff):>14} {fmt(r.grad_tolerance):>10}  {r.detail}")  # fmt: skip
        print("PASS: packed rows are isolated on every backend that ran" if report.passed else "FAIL")
    return 0 if report.passed else 1
