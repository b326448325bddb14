"""Benchmark: torch.compile (inductor, CPU) of the decoder layers against eager, per batching strategy.

One run trains each strategy three ways, each in its own process (``padless bench``'s machinery:
:func:`padless.bench.run.run_benchmark`, one call per strategy and way, back to back):

- ``eager``: no compile, rows as long as they need to be (the strongest eager baseline);
- ``static``: ``--compile static`` (``dynamic=False``), every strategy's rows rounded up to a
  multiple of ``--multiple`` tokens (``--pad-to-multiple-of``), so they take a few shapes;
- ``dynamic``: ``--compile dynamic`` (``dynamic=True``: symbolic shapes), rows not rounded.

Compile is applied to every strategy the same way (:func:`padless.compile_layers`: the decoder
layers; the LM head over trained tokens and the loss stay eager for all). Inductor's caches are
switched off and every (strategy, way) is its own run with an empty ``TORCHINDUCTOR_CACHE_DIR``
(the compiled C++ kernels live there too), so every process compiles cold and none inherits
another's kernels.

Printed per strategy and way: real tokens/s over the steps after the warm-up (compilations in
them included), the steady-state real tokens/s (steps that compiled left out), each as a ratio over
eager on the same steps (every way trains the same examples at each step), the median per-step
speedup over eager, dynamo frames compiled (recompiles among them), backward graphs and seconds
compiling.
Run: ``PYTHONPATH=src .venv/bin/python benchmarks/compile.py --out docs/bench/compile.txt``
(about 6-8 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WAYS = {"eager": ("off", None), "static": ("static", "multiple"), "dynamic": ("dynamic", None)}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True
        ).stdout.strip()
        return out.stdout.strip() + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _rate(run: Any, steps: list[int]) -> float | None:
    """Real tokens / seconds over the given steps."""
    seconds = sum(run.step_time_s[i] for i in steps)
    return sum(run.real_tokens[i] for i in steps) / seconds if steps and seconds > 0 else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategies", default="packing,bucketing,padding", help="comma-separated strategies")
    parser.add_argument("--ways", default="eager,static,dynamic", help=f"comma-separated, of {', '.join(WAYS)}")
    parser.add_argument("--model", default="gpt2-2layer")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--multiple", type=int, default=128, help="row-length multiple of the static way")
    parser.add_argument("--out", type=Path, help="also write what is printed to this file, the command on top")
    args = parser.parse_args(argv)

    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"  # cold compiles in every strategy process
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
    import torch

    from padless.bench.config import PRESETS
    from padless.bench.report import text_table
    from padless.bench.results import StrategyRun, load_results
    from padless.bench.run import run_benchmark

    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    command = "PYTHONPATH=src .venv/bin/python benchmarks/compile.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    say(f"# {command.strip()}")
    say(
        f"# commit {_commit()}; torch {torch.__version__}; python {platform.python_version()}; "
        f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        parser.error(f"unknown way {unknown[0]!r}; choose from {', '.join(WAYS)}")
    base = dataclasses.replace(
        PRESETS["quick"],
        model=args.model,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        batch_size=args.batch_size,
        max_length=args.max_length,
        limit=args.limit,
        strategies=strategies,
    )
    say(
        f"# {args.model}, {base.data}, {args.steps} steps ({args.warmup_steps} warm-up), batch {args.batch_size}, "
        f"max_length {args.max_length}, limit {args.limit}; static rounds rows to {args.multiple}; "
        "an empty inductor cache per run (cold compiles)"
    )
    runs: dict[tuple[str, str], StrategyRun] = {}
    with tempfile.TemporaryDirectory(prefix="padless-compile-bench-") as tmp:
        for name in strategies:  # the ways of a strategy back to back; each run gets an empty inductor cache
            for way in ways:
                mode, rounding = WAYS[way]
                cfg = dataclasses.replace(
                    base, strategies=(name,), compile=mode, pad_to_multiple_of=args.multiple if rounding else None
                )
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / f"inductor-{way}-{name}")
                started = time.perf_counter()
                path = run_benchmark(cfg, Path(tmp) / f"{way}-{name}", progress=False)
                say(f"# {way} {name}: {time.perf_counter() - started:.0f} s wall")
                runs[way, name] = load_results(path).strategies[name]
    say()
    header = ("strategy", "way", "real tok/s", "x eager", "steady tok/s", "x eager", "step x eager", "padding",
              "frames", "recompiles", "bwd graphs", "compile s")  # fmt: skip
    rows = [header]
    warm = args.warmup_steps
    for name in strategies:
        eager = runs.get(("eager", name))
        for way in ways:
            run = runs[way, name]
            c = run.compiled
            measured = list(range(warm, len(run.step_time_s)))
            quiet = [i for i in measured if c is None or run.step_compile_s[i] == 0.0]  # steps that compiled nothing
            ratio = lambda x, y: "n/a" if x is None or not y else f"x{x / y:.2f}"  # noqa: E731
            step_ratio = "n/a"
            if eager is not None and quiet:  # the same examples per step in every way: compare step by step
                step_ratio = f"x{statistics.median(eager.step_time_s[i] / run.step_time_s[i] for i in quiet):.2f}"
            (all_rate, all_eager), (quiet_rate, quiet_eager) = (
                (_rate(run, steps), eager and _rate(eager, steps)) for steps in (measured, quiet)
            )
            rows.append(
                (
                    name,
                    way,
                    _fmt(all_rate),
                    ratio(all_rate, all_eager),
                    _fmt(quiet_rate),
                    ratio(quiet_rate, quiet_eager),
                    step_ratio,
                    f"{100 * (1 - sum(run.real_tokens) / sum(run.padded_tokens)):.1f}%",
                    *(
                        ("-",) * 4
                        if c is None
                        else (str(c.frames), str(c.recompiles), str(c.backward_compiles), f"{c.compile_s:.1f}")
                    ),
                )
            )
    for line in text_table(rows, left_columns=2):
        say(line)
    say()
    say(
        "real tok/s: real (non-padding) tokens / time over the steps after the warm-up, compilations in them "
        "included; steady tok/s: the same over the steps after the warm-up during which torch compiled nothing; "
        "x eager: over eager's real tokens / time on the same steps (every way trains the same examples at each "
        "step); step x eager: median over those steps of eager's step time / this way's; frames: dynamo frame "
        "compilations (the graph break around padless attention adds frames), recompiles among them; bwd graphs: "
        "backward graphs compiled lazily; compile s: seconds compiling during training (cold: an empty inductor "
        "cache per process)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
