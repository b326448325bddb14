"""``padless verify``: per backend, packed logits against each sequence alone and packed gradients
against padded ones (padless.verify_isolation). Progress goes to stderr as it runs (the model, the
rule's verdicts, what is sampled, each check); the report to stdout."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from padless.cli._shared import HelpFormatter
from padless.isolation.compare import NOISE_FACTOR
from padless.isolation.verify import (
    DEFAULT_BACKENDS,
    DEFAULT_MAX_LENGTH,
    VerifyReport,
    random_sequences,
    verify_isolation,
)

SAMPLED_BACKENDS = ("sdpa", "padless")
"""The backends the sampled default checks: transformers' default and padless' own (each backend is a
forward and backward over the row; eager, FlexAttention and flash-attn are one ``--backends`` away)."""

EXIT_PASS, EXIT_CONTAMINATED, EXIT_NOTHING_RAN = 0, 1, 3
"""Exit statuses of ``padless verify`` (2 is a bad input, as for every subcommand)."""

DTYPES = {
    "float32": ("float32", None),
    "bfloat16": ("bfloat16", None),
    "float16": ("float16", None),
    "autocast-bf16": ("float32", "bfloat16"),
    "autocast-fp16": ("float32", "float16"),
}
"""``--dtype`` choice -> (weights' dtype, autocast dtype or None)."""

EPILOG = f"""judgment: per backend and dtype, the same documents right-padded into one batch give padding's own
  difference from each document run alone (exact in mathematics, not in floating point); packed rows
  pass when their logit and gradient differences stay within --factor (default {NOISE_FACTOR:g}) times that
  noise, or under the dtype's absolute floor (padless.isolation.verify.TOLERANCES).

columns: alone = each document run by itself (the reference); packed = the documents packed into
  rows of --max-length; padded = the same documents right-padded, one per row (padding's own noise).

sampled (default) vs --thorough: the default checks one row of --max-length tokens (seeded document
  lengths), pads only its longest document for the noise, runs the documents alone once (on the first
  backend that runs) and compares the gradients of the last block and the layers after it; --thorough
  checks two rows, pads every document, runs them alone on each backend and compares every
  parameter's gradient (several times longer). Both check every document's logits on every backend
  they run: by default sdpa and padless; with --thorough every backend padless knows.

exit status:
  0  PASS: every backend that ran kept packed documents isolated and trained like padding
  1  FAIL: a backend ran and was contaminated (or its gradients differ from padding)
  2  bad input (a message says which)
  3  NOTHING RAN: every backend was refused or unavailable (the reasons are printed)"""


class _Help(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every default shown, and the epilog's layout kept."""


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = _Help
    parser.add_argument(
        "--model",
        default="tiny-gpt2",
        help="tiny-<gpt2|llama|qwen2|mistral> (512-token test vocabulary), a GPT-2 size, smollm2-135m, or a local model folder",
    )
    parser.add_argument(
        "--backends",
        default=None,
        help=f"comma-separated attention backends (default: {','.join(SAMPLED_BACKENDS)}, "
        f"transformers' default and padless' own; with --thorough: {','.join(DEFAULT_BACKENDS)})",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=list(DTYPES),
        help="weights' dtype; autocast-bf16/-fp16: float32 weights under torch.autocast, as Trainer(bf16=True)",
    )
    parser.add_argument(
        "--oracle",
        choices=["float64"],
        default=None,
        help="also run the check with the model in float64, where float noise is ~1e-14 and any systematic difference shows",
    )
    parser.add_argument(
        "--factor", type=float, default=NOISE_FACTOR, help="how many times padding's own noise packed rows may differ"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--lengths",
        default=None,
        help="comma-separated sequence lengths (default: seeded lengths that fill one row of --max-length)",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=DEFAULT_MAX_LENGTH,
        help="packed row length, capped at the model's positions (0: one row for all)",
    )
    parser.add_argument(
        "--thorough",
        action="store_true",
        help="every document padded and run alone per backend, two rows, every parameter's gradient",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled document lengths and token ids")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lengths must be comma-separated integers, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise ValueError(f"--lengths must be positive integers, got {text!r}")
    return lengths


def run_verify(args: argparse.Namespace) -> int:
    from padless.cli import as_flags
    from padless.devices import resolve_device
    from padless.models.factory import check_model_name

    check_model_name(args.model)  # an unknown name fails here, before torch loads
    if args.max_length < 0:
        raise ValueError(f"--max-length must be >= 1 (or 0 for one row holding every sequence), got {args.max_length}")
    lengths = _lengths(args.lengths) if args.lengths is not None else None
    if args.backends is None:
        args.backends = ",".join(DEFAULT_BACKENDS if args.thorough else SAMPLED_BACKENDS)
    if not [b for b in args.backends.split(",") if b.strip()]:
        raise ValueError(f"--backends names no backend; choose from {','.join(DEFAULT_BACKENDS)}")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        raise ValueError(as_flags(str(exc), ["device"])) from None
    if args.factor < 1:
        raise ValueError(
            f"--factor must be >= 1 (packed rows cannot be held below padding's own noise), got {args.factor}"
        )
    weights, autocast = DTYPES[args.dtype]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    reports = [_run(args, device, lengths, backends, weights, autocast)]
    if args.oracle:
        reports.append(_run(args, device, lengths, backends, args.oracle, None))
    passed = all(r.passed for r in reports)
    failed = any(r.status == "fail" for report in reports for r in report.results)
    status = EXIT_CONTAMINATED if failed else EXIT_PASS if passed else EXIT_NOTHING_RAN
    if args.json:
        out = reports[0].as_dict()
        if args.oracle:
            out["oracle"] = reports[1].as_dict()
            out["passed"] = passed
        print(json.dumps(out, indent=2))
        return status
    for report in reports:
        _print_report(report)
    if status == EXIT_PASS:
        print("PASS: packed rows are isolated on every backend that ran")
    elif status == EXIT_CONTAMINATED:
        bad = sorted(
            {f"{r.backend} ({report.dtype})" for report in reports for r in report.results if r.status == "fail"}
        )
        print(f"FAIL: packed rows are contaminated or train differently on {', '.join(bad)}")
    else:
        print("NOTHING RAN: every backend was refused or unavailable (reasons above); nothing was verified")
    return status


def _run(
    args: argparse.Namespace,
    device: Any,
    lengths: list[int] | None,
    backends: list[str],
    weights: str,
    autocast: str | None,
) -> VerifyReport:
    """Build the model in ``weights`` and verify it (under autocast when given)."""
    import torch

    from padless.cli import as_flags
    from padless.models.factory import build_model

    start = time.perf_counter()
    # eager attention builds for every model (some have no SDPA); each backend is switched on in turn
    model = build_model(args.model, dtype=getattr(torch, weights), attn_implementation="eager").to(device)
    sequences = None
    if lengths:
        sequences = [f["input_ids"] for f in random_sequences(lengths, model.config.vocab_size, args.seed)]
    loaded = [f"; loaded in {time.perf_counter() - start:.1f} s"]  # told with the first line: errors stay one line
    checked = f"attention checked: {', '.join(backends)} (built {{0}}, each switched on in turn)"

    def progress(line: str) -> None:
        if loaded:  # the model line names the implementation it was built with, not the ones checked
            line = re.sub(r"attention '([^']*)'", lambda m: checked.format(m.group(1)), line, count=1) + loaded.pop()
        print(line, file=sys.stderr, flush=True)

    try:
        return verify_isolation(
            model,
            sequences,
            backends=backends,
            max_length=args.max_length or None,
            check="thorough" if args.thorough else "sampled",
            seed=args.seed,
            autocast=None if autocast is None else getattr(torch, autocast),
            factor=args.factor,
            progress=progress,
        )
    except ValueError as exc:
        raise ValueError(as_flags(str(exc), ["max_length"])) from None


def _print_report(report: VerifyReport) -> None:
    fmt = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
    check = f" | {report.coverage.check} check" if report.coverage is not None else ""
    print(
        f"model {report.model} | {report.dtype} | {report.device}{check} | lengths {report.lengths} | rows of "
        f"{report.max_length} | limit: max({report.factor:g} x padded, dtype floor)"
    )
    if report.coverage is not None:
        for line in report.coverage.describe():
            print(line)
    print(report.legend())
    print(
        f"{'backend':<24} {'status':<12} {'logit packed':>12} {'padded':>9} {'limit':>9} "
        f"{'grad packed':>12} {'padded':>9} {'limit':>9} {'seconds':>8}"
    )
    for r in report.results:
        seconds = "-" if r.seconds is None else f"{r.seconds:.1f}"
        print(
            f"{r.backend:<24} {r.status:<12} {fmt(r.max_logit_diff):>12} {fmt(r.logit_noise):>9} {fmt(r.logit_tolerance):>9} "
            f"{fmt(r.grad_rel_diff):>12} {fmt(r.grad_noise):>9} {fmt(r.grad_tolerance):>9} {seconds:>8}  {r.detail}"
        )
        for line in r.evidence:
            print(f"    {line}")
