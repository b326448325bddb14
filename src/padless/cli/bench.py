"""``padless bench``: one flag per field of :class:`padless.bench.config.RunConfig` (generated, with
the field's docstring as help), then :func:`padless.bench.run.run_benchmark`."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing

from padless.bench.config import PRESETS, RESULT_ONLY_FIELDS, RunConfig, field_docs
from padless.bench.run import run_benchmark
from padless.cli._shared import as_flags, plain, report_lines


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _flag_kwargs(tp: typing.Any) -> dict[str, typing.Any]:
    """argparse keywords for a field type: choices for a Literal, a switch for a bool, a comma list
    for a tuple, the scalar type (of ``X | None``) otherwise."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is typing.Literal:
        return {"choices": typing.get_args(tp)}
    if tp is bool:
        return {"action": "store_true"}
    if typing.get_origin(tp) is tuple:
        return {"type": _comma_list, "metavar": "A,B,..."}
    return {"type": tp}


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS),
                        help="a named configuration; the flags below override it")  # fmt: skip
    docs, hints = field_docs(RunConfig), typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name not in RESULT_ONLY_FIELDS:  # default None: "not given", the preset's value stands
            parser.add_argument("--" + f.name.replace("_", "-"), default=None, help=plain(docs.get(f.name)),
                                **_flag_kwargs(hints[f.name]))  # fmt: skip
    parser.add_argument("--out", default="runs/bench", help="output folder for results.json, the plots and report.html")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The preset, with every flag given on the command line overriding its field."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)
             if f.name not in RESULT_ONLY_FIELDS and getattr(args, f.name) is not None}  # fmt: skip
    return dataclasses.replace(PRESETS[args.preset], **given)


def run_bench(args: argparse.Namespace) -> int:
    import sys

    import torch.distributed as dist

    from padless.bench.results import load_results

    try:
        config = config_from_args(args)
    except ValueError as exc:  # the config names its fields; say them as flags
        raise ValueError(as_flags(str(exc), [f.name for f in dataclasses.fields(RunConfig)])) from None
    try:
        path = run_benchmark(config, args.out, progress=not args.no_progress)
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return 0  # rank 0 wrote and reports for every rank
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    results = load_results(path)
    if results.status.state == "interrupted":
        print("\ninterrupted: wrote what was measured so far", file=sys.stderr)
    print("\n".join(report_lines(results, path.parent / "report.html", [f"results: {path}"])))
    return 0
