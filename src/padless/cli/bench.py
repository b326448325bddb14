"""``padless bench``: one flag per field of :class:`padless.bench.config.RunConfig` (generated, with
the field's docstring and its default as help), then :func:`padless.bench.run.run_benchmark`. Before the
run it prints what will run and the tokenizer; after it, the summary table with its warnings."""

from __future__ import annotations

import argparse
import dataclasses
import os
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


def _shown(value: typing.Any) -> str:
    """A field's value as its flag takes it: ``padding,packing``, ``on``/``off``, ``unset``."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unset" if value is None else str(value)


def _preset_help() -> str:
    """Each preset as the flags it changes from the ``default`` preset."""
    base = PRESETS["default"]
    parts = []
    for name, cfg in sorted(PRESETS.items()):
        changed = [
            f"--{f.name.replace('_', '-')} {_shown(getattr(cfg, f.name))}"
            for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) != getattr(base, f.name)
        ]
        parts.append(f"{name}" + (f" ({', '.join(changed)})" if changed else " (the defaults below)"))
    return "a named configuration; the flags below override it (default: default). Presets: " + "; ".join(parts)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS), help=_preset_help())
    docs, hints = field_docs(RunConfig), typing.get_type_hints(RunConfig)
    defaults = PRESETS["default"]
    for f in dataclasses.fields(RunConfig):
        if f.name not in RESULT_ONLY_FIELDS:  # default None: "not given", the preset's value stands
            doc, value = plain(docs.get(f.name)) or "", getattr(defaults, f.name)
            if value is not None or "default" not in doc:  # an unset field's doc says what unset means
                doc += f" (default: {_shown(value)})"
            parser.add_argument("--" + f.name.replace("_", "-"), default=None, help=doc, **_flag_kwargs(hints[f.name]))
    parser.add_argument(
        "--out",
        default="runs/bench",
        help="output folder for results.json, the plots and report.html (default: runs/bench)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (default: off)")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The preset, with every flag given on the command line overriding its field."""
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(RunConfig)
        if f.name not in RESULT_ONLY_FIELDS and getattr(args, f.name) is not None
    }
    return dataclasses.replace(PRESETS[args.preset], **given)


def _before_the_run(cfg: RunConfig) -> list[str]:
    """What is about to run, the tokenizer (``tokenizer: NAME (vocab N)``) and, when the run would time
    too few steps for a speedup, a warning now rather than after the run."""
    from padless.bench.figures import MIN_TIMED_STEPS
    from padless.data import load_tokenizer
    from padless.models.factory import tokenizer_name_for

    if cfg.processor is not None:  # images and text through the model's processor (its own tokenizer)
        from padless.data.shards import cached_processor

        said = f"processor: {cfg.processor} (vocab {len(cached_processor(cfg.processor).tokenizer):,}; images travel with their documents)"
    else:
        name = cfg.tokenizer or tokenizer_name_for(cfg.model)
        source = "--tokenizer" if cfg.tokenizer else f"the model's, {cfg.model}"
        said = f"tokenizer: {name} (vocab {len(load_tokenizer(name)):,}; {source})"
    lines = [f"bench: {cfg.model} on {cfg.data}, {', '.join(cfg.strategies)}; {cfg.steps} steps each "
             f"({cfg.warmup_steps} warm-up, not timed), {cfg.batch_size} examples x {cfg.grad_accumulation} "
             f"micro-batch(es) a step, max length {cfg.max_length}, {cfg.mode}", said]  # fmt: skip
    timed = cfg.steps - cfg.warmup_steps
    if timed < MIN_TIMED_STEPS:
        lines.append(
            f"WARNING: {timed} timed step(s) per strategy (--steps {cfg.steps}, --warmup-steps "
            f"{cfg.warmup_steps}): a speedup needs at least {MIN_TIMED_STEPS}; try --steps "
            f"{cfg.warmup_steps + 2 * MIN_TIMED_STEPS}"
        )
    return lines


def run_bench(args: argparse.Namespace) -> int:
    import sys

    import torch.distributed as dist

    from padless.bench.results import load_results

    try:
        config = config_from_args(args)
    except ValueError as exc:  # the config names its fields; say them as flags
        raise ValueError(as_flags(str(exc), [f.name for f in dataclasses.fields(RunConfig)])) from None
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for every rank
        print("\n".join(_before_the_run(config)), flush=True)
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
