"""The ``results.json`` of ``padless bench``: its schema, the figures derived from it, and validation.

A results file holds what was measured, step by step, for every strategy (step time, loss, real and
padded tokens, sequences), plus the run's configuration, the machine it ran on and the corpus
lengths. Everything else (median and p90 step time, tokens per second, padding fraction, speedups)
is *derived* here from the per-step arrays, never passed in, so a figure in the report can always be
recomputed from the raw data. The derived sections are written into the json for readers, and
recomputed (not trusted) when a file is loaded.

    results.json
      config          RunConfig        what was run (device and dtype resolved)
      environment     Environment      where it ran
      strategies      {name: StrategyRun + "figures": StrategyFigures}
      lengths         [int]            corpus token lengths, for the histogram
      summary         Summary          speedups over padding, ideal speedup, eval-loss deltas
      status          RunStatus        "complete", or "interrupted" and how far it got
      padless_version str
      schema_version  int
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from padless.bench.config import Mode, RunConfig
from padless.bench.schema import check, from_plain

SCHEMA_VERSION = 1
BASELINE = "padding"
"""The strategy every speedup is measured against."""
PADLESS = "packing"
"""The strategy that is padless itself (compared with the strongest of the others)."""
SYS_TIME_WARNING = 0.2
"""A strategy whose kernel (sys) time exceeds this fraction of its CPU time is flagged in the report."""

__all__ = ["Mode", "RunConfig"]  # re-exported: the results file's config is a RunConfig

REQUIRED_CONFIG = ("model", "data", "strategies", "steps", "batch_size", "max_length", "mode", "seed", "device",
                   "dtype", "grad_accumulation", "warmup_steps", "lr")
"""Config fields a results file must carry (every RunConfig field has a default for the command line,
but a figure cannot be read without these); the others were added later and may be absent."""

RunState = Literal["complete", "interrupted"]


@dataclass(frozen=True)
class Environment:
    """The machine and software a run measured (see ``padless.bench.measure.environment_snapshot``)."""

    python: str
    """Python version."""
    torch: str
    """torch version (with its build tag, e.g. ``2.13.0+cpu``)."""
    transformers: str
    """transformers version."""
    padless: str
    """padless version."""
    os: str
    """Operating system and kernel (``platform.platform()``)."""
    device: str
    """torch device the run used."""
    device_name: str
    """Accelerator name, or the CPU model on a CPU run."""
    cpu_model: str
    """CPU model name."""
    cpu_count: int
    """Logical CPUs of the machine."""
    cpu_available: int
    """Logical CPUs this process may run on (its affinity mask; containers often get fewer)."""
    torch_threads: int
    """``torch.get_num_threads()`` during the run."""
    date: str
    """When the snapshot was taken, ISO 8601 in UTC."""


@dataclass(frozen=True)
class CompileRecord:
    """torch.compile of a strategy's decoder layers (padless.compile_layers) over its training phase."""

    mode: str
    """``static`` (``dynamic=False``: a graph per row shape) or ``dynamic`` (``dynamic=True``)."""
    backend: str
    """torch.compile backend (``inductor``)."""
    frames: int
    """Dynamo frame compilations, first compiles and recompiles (padless.models.compile.CompileStats)."""
    recompiles: int
    """Of ``frames``, recompilations of a frame compiled before (a new shape failed its guards)."""
    backward_compiles: int
    """Backward graphs compiled at their first backward."""
    graphs: int
    """Graphs handed to the backend."""
    compile_s: float
    """Wall time spent compiling during training (also in ``step_time_s`` of the steps it fell in)."""


@dataclass(frozen=True)
class StrategyRun:
    """What was measured for one strategy; arrays hold one entry per optimiser step done."""

    step_time_s: tuple[float, ...]
    """Wall time of each optimiser step (all its micro-batches), warm-up steps included."""
    loss: tuple[float, ...]
    """Training loss of each step (token-normalised over the whole step)."""
    real_tokens: tuple[int, ...]
    """Non-padding tokens fed in each step."""
    padded_tokens: tuple[int, ...]
    """All tokens fed in each step, padding included."""
    sequences: tuple[int, ...]
    """Sequences (examples) trained in each step."""
    peak_memory_bytes: int | None
    """Peak memory over this strategy's training: process RSS on CPU, max allocated on an
    accelerator; ``None`` if it could not be measured."""
    memory_method: str
    """How the peak was measured (``padless.bench.measure.MemoryMethod``)."""
    eval_loss_start: float | None
    """Held-out loss before training (same examples for every strategy); ``None`` if not reached."""
    eval_loss_end: float | None
    """Held-out loss after training; ``None`` if not reached (an interrupted run)."""
    trained_tokens: tuple[int, ...] = ()
    """Trained (target) tokens of each step (absent in files written before it existed)."""
    model_flops: tuple[float, ...] = ()
    """Model FLOPs each step needed: body over real tokens, attention within each document, LM head
    over trained tokens, x3 for the backward (padless/bench/flops.py)."""
    executed_flops: tuple[float, ...] = ()
    """FLOPs of each step as it was fed: padding included, attention over the blocks computed."""
    cpu_user_s: float | None = None
    """User CPU time of the process over the training phase (all threads)."""
    cpu_sys_s: float | None = None
    """Kernel CPU time of the process over the training phase (page faults, zeroing, mmap)."""
    max_rss_bytes: int | None = None
    """Peak RSS of the strategy's own process over its life (``ru_maxrss``); ``None`` in-process."""
    allocator: str | None = None
    """Memory allocator the strategy's process ran with (padless/bench/isolate.py), ``None`` in-process."""
    compiled: CompileRecord | None = None
    """How its decoder layers were compiled and what compiling cost (``None``: eager, or a file from
    before ``--compile`` existed)."""
    step_compile_s: tuple[float, ...] = ()
    """Seconds torch spent compiling within each step (compiled runs only; 0.0: nothing compiled)."""


@dataclass(frozen=True)
class StrategyFigures:
    """Figures derived from a :class:`StrategyRun`; timing figures leave out the warm-up steps."""

    steps_done: int
    """Optimiser steps recorded."""
    measured_steps: int
    """Steps after the warm-up, the ones the timing figures use."""
    step_time_median_s: float | None
    """Median step time over measured steps; ``None`` when there are none."""
    step_time_p90_s: float | None
    """90th percentile step time (linear interpolation) over measured steps."""
    real_tokens_per_s: float | None
    """Non-padding tokens over the measured steps divided by their total time."""
    padded_tokens_per_s: float | None
    """All tokens fed (padding included) over the measured steps divided by their total time."""
    sequences_per_s: float | None
    """Sequences over the measured steps divided by their total time."""
    padding_fraction: float | None
    """Padding tokens / all tokens fed, over every step recorded."""
    eval_loss_delta: float | None
    """``eval_loss_end - eval_loss_start`` (negative: the model learned)."""
    model_flops_per_s: float | None = None
    """Model FLOPs (needed work) over the measured steps divided by their total time."""
    mfu: float | None = None
    """Model FLOPs utilisation: ``model_flops_per_s`` over the machine's measured peak."""
    flops_per_real_token: float | None = None
    """Model FLOPs per real token, over every step recorded."""
    flops_per_trained_token: float | None = None
    """Model FLOPs per trained token, over every step recorded."""
    executed_over_model_flops: float | None = None
    """FLOPs executed / FLOPs needed, over every step (1.0: no work spent on padding)."""
    cpu_sys_fraction: float | None = None
    """Kernel time / CPU time (user + sys) of the training phase."""
    compile_steps: int | None = None
    """Steps (warm-up included) during which torch compiled something; ``None``: not compiled."""
    steady_real_tokens_per_s: float | None = None
    """Compiled runs: real tokens/s over the measured steps during which nothing compiled (the
    steady state; compile time reported apart, in ``compiled.compile_s``). ``real_tokens_per_s``
    keeps every measured step, compilations included."""


@dataclass(frozen=True)
class Summary:
    """Comparisons across strategies, derived from their figures."""

    baseline: str
    """The strategy speedups are measured against (``padding``)."""
    speedup: dict[str, float | None]
    """Real tokens/s of each strategy over the baseline's; ``None`` if either is missing."""
    ideal_speedup: float | None
    """Padded tokens / real tokens of the baseline: the speedup if no padding were computed."""
    eval_loss_delta: dict[str, float | None]
    """Each strategy's ``eval_loss_end - eval_loss_start``."""
    eval_loss_end_vs_baseline: dict[str, float | None]
    """Each strategy's final eval loss minus the baseline's (near 0: same learning)."""
    strongest_baseline: str | None = None
    """The fastest strategy other than packing (real tokens/s)."""
    speedup_over_strongest: float | None = None
    """Packing's real tokens/s over the strongest baseline's: the headline figure."""
    ideal_speedup_flops: float | None = None
    """The baseline's executed FLOPs / the FLOPs its steps needed: the speedup if padded work were free."""
    fraction_of_ideal: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Each strategy's speedup over the baseline divided by ``ideal_speedup_flops``."""


@dataclass(frozen=True)
class RunStatus:
    """Whether the run finished; an interrupted run (Ctrl-C) still writes what it measured."""

    state: RunState
    """``complete`` or ``interrupted``."""
    strategies_done: tuple[str, ...]
    """Strategies that ran all their steps and their final evaluation."""
    interrupted_strategy: str | None = None
    """The strategy running when the run was interrupted; ``None`` if complete."""
    interrupted_at_step: int | None = None
    """Optimiser steps that strategy had completed when interrupted."""


@dataclass(frozen=True)
class BenchResults:
    """One ``padless bench`` run: what is saved as ``results.json``."""

    config: RunConfig
    """What was run."""
    environment: Environment
    """Where it ran."""
    strategies: dict[str, StrategyRun]
    """Measurements per strategy, in the order they ran (a strategy never started is absent)."""
    lengths: tuple[int, ...]
    """Token lengths of the corpus examples used (after truncation to ``max_length``)."""
    status: RunStatus
    """Complete or interrupted."""
    padless_version: str
    """padless version that wrote the file."""
    schema_version: int = SCHEMA_VERSION
    """Version of this schema."""
    peak_flops_per_s: float | None = None
    """The machine's measured peak: the fastest of timed GEMMs of the model's shapes on the run's
    device and dtype, at the start of the run (padless.bench.measure.measure_peak_flops)."""
    peak_gemm: str | None = None
    """The GEMM shape that reached ``peak_flops_per_s`` (``M x K x N dtype``)."""

    def figures(self) -> dict[str, StrategyFigures]:
        """Derived figures per strategy."""
        return {n: strategy_figures(r, self.config.warmup_steps, self.peak_flops_per_s)
                for n, r in self.strategies.items()}  # fmt: skip

    def summary(self) -> Summary:
        """Speedups and eval-loss comparisons, derived from the per-step data."""
        return summarize(self.strategies, self.config.warmup_steps)

    def to_dict(self) -> dict[str, Any]:
        """A json-ready dict: the measured data plus the derived ``figures`` and ``summary``."""
        out = dataclasses.asdict(self)  # tuples stay tuples: json writes them as lists
        for name, figures in self.figures().items():
            out["strategies"][name]["figures"] = dataclasses.asdict(figures)
        out["summary"] = dataclasses.asdict(self.summary())
        return out

    def to_json(self) -> str:
        """The results as json text (NaN losses are written as ``NaN``, which Python reads back)."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResults:
        """Build from a decoded results.json; ``ValueError`` lists every problem found."""
        problems = validate(data)
        if problems:
            shown = "; ".join(problems[:8])
            if len(problems) > 8:
                shown += f"; and {len(problems) - 8} more"
            raise ValueError(f"not a valid padless results file: {shown}")
        return from_plain(cls, data)

    @classmethod
    def from_json(cls, text: str) -> BenchResults:
        """Parse json text written by :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        if not isinstance(data, dict):
            kind = type(data).__name__
            raise ValueError(f"not a padless results file: the top level is a {kind}, not an object")
        return cls.from_dict(data)


# --- derived figures ----------------------------------------------------------------------------


def percentile(values: typing.Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default); ``ValueError`` on an empty sequence."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def strategy_figures(run: StrategyRun, warmup_steps: int, peak_flops_per_s: float | None = None) -> StrategyFigures:
    """Median/p90 step time and rates over the steps after ``warmup_steps``; padding fraction over
    all steps. Rates are totals over totals (not a mean of per-step rates), so a slow step weighs
    what it cost. MFU needs the measured ``peak_flops_per_s``."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    times = list(run.step_time_s[warmup_steps:])
    total_time = sum(times)
    padded_all = sum(run.padded_tokens)
    delta = None
    if run.eval_loss_start is not None and run.eval_loss_end is not None:
        delta = run.eval_loss_end - run.eval_loss_start
    return StrategyFigures(
        steps_done=len(run.step_time_s),
        measured_steps=len(times),
        step_time_median_s=percentile(times, 50) if times else None,
        step_time_p90_s=percentile(times, 90) if times else None,
        real_tokens_per_s=_ratio(sum(run.real_tokens[warmup_steps:]), total_time),
        padded_tokens_per_s=_ratio(sum(run.padded_tokens[warmup_steps:]), total_time),
        sequences_per_s=_ratio(sum(run.sequences[warmup_steps:]), total_time),
        padding_fraction=1 - sum(run.real_tokens) / padded_all if padded_all > 0 else None,
        eval_loss_delta=delta,
        **_flop_figures(run, warmup_steps, total_time, peak_flops_per_s),
        **_compile_figures(run, warmup_steps),
    )


def _compile_figures(run: StrategyRun, warmup_steps: int) -> dict[str, Any]:
    if run.compiled is None or len(run.step_compile_s) != len(run.step_time_s):
        return {}
    quiet = [i for i in range(warmup_steps, len(run.step_time_s)) if run.step_compile_s[i] == 0.0]
    return {
        "compile_steps": sum(1 for s in run.step_compile_s if s > 0.0),
        "steady_real_tokens_per_s": _ratio(sum(run.real_tokens[i] for i in quiet),
                                           sum(run.step_time_s[i] for i in quiet)),
    }


def _flop_figures(run: StrategyRun, warmup_steps: int, total_time: float, peak: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if run.cpu_user_s is not None and run.cpu_sys_s is not None:
        out["cpu_sys_fraction"] = _ratio(run.cpu_sys_s, run.cpu_user_s + run.cpu_sys_s)
    if len(run.model_flops) != len(run.step_time_s):  # an older file: no FLOP counts
        return out
    rate = _ratio(sum(run.model_flops[warmup_steps:]), total_time)
    out.update(
        model_flops_per_s=rate,
        mfu=rate / peak if rate is not None and peak else None,
        flops_per_real_token=_ratio(sum(run.model_flops), sum(run.real_tokens)),
        flops_per_trained_token=_ratio(sum(run.model_flops), sum(run.trained_tokens)),
        executed_over_model_flops=_ratio(sum(run.executed_flops), sum(run.model_flops)),
    )
    return out


def summarize(strategies: dict[str, StrategyRun], warmup_steps: int, baseline: str = BASELINE) -> Summary:
    """Speedup of each strategy over ``baseline`` (real tokens/s ratio), the ideal speedup (the
    baseline's padded / real tokens) and eval-loss deltas. Figures needing the baseline are
    ``None`` when it is absent or has no measured steps."""
    figs = {n: strategy_figures(r, warmup_steps) for n, r in strategies.items()}
    base = figs.get(baseline)
    base_tps = base.real_tokens_per_s if base else None
    ideal = None
    if baseline in strategies:
        ideal = _ratio(sum(strategies[baseline].padded_tokens), sum(strategies[baseline].real_tokens))
    base_end = strategies[baseline].eval_loss_end if baseline in strategies else None
    speedup: dict[str, float | None] = {}
    vs_base: dict[str, float | None] = {}
    for name, f in figs.items():
        ok = f.real_tokens_per_s is not None and base_tps is not None
        speedup[name] = f.real_tokens_per_s / base_tps if ok else None
        end = strategies[name].eval_loss_end
        vs_base[name] = end - base_end if end is not None and base_end is not None else None
    others = {n: f.real_tokens_per_s for n, f in figs.items() if n != PADLESS and f.real_tokens_per_s is not None}
    strongest = max(others, key=lambda n: others[n]) if others else None
    ours = figs[PADLESS].real_tokens_per_s if PADLESS in figs else None
    ideal_flops = None
    if baseline in strategies and len(strategies[baseline].executed_flops) == len(strategies[baseline].step_time_s):
        ideal_flops = _ratio(sum(strategies[baseline].executed_flops), sum(strategies[baseline].model_flops))
    return Summary(
        baseline=baseline,
        speedup=speedup,
        ideal_speedup=ideal,
        eval_loss_delta={n: f.eval_loss_delta for n, f in figs.items()},
        eval_loss_end_vs_baseline=vs_base,
        strongest_baseline=strongest,
        speedup_over_strongest=ours / others[strongest] if ours is not None and strongest is not None else None,
        ideal_speedup_flops=ideal_flops,
        fraction_of_ideal={n: s / ideal_flops if s is not None and ideal_flops else None for n, s in speedup.items()},
    )


# --- saving and loading -------------------------------------------------------------------------


def save_results(results: BenchResults, path: str | os.PathLike[str]) -> Path:
    """Write ``results`` as json atomically (:mod:`padless.atomic`), so a Ctrl-C during the write
    never leaves a truncated file."""
    from padless.atomic import atomic_write_text

    return atomic_write_text(path, results.to_json() + "\n")


def load_results(path: str | os.PathLike[str]) -> BenchResults:
    """Read a results.json; ``ValueError`` naming the file if it is missing, not json or invalid."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such results file" + (" (it is a directory)" if path.is_dir() else ""))
    try:
        return BenchResults.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


# --- validation against the dataclasses above ---------------------------------------------------


def validate(data: Any) -> list[str]:
    """Problems with a decoded results.json: every missing or ill-typed field (with its path, e.g.
    ``strategies.packing.loss[3]``), the derived ``figures`` and ``summary`` sections, and per-step
    arrays of unequal length. An empty list means the file is complete and well-typed."""
    problems: list[str] = []
    check(data, BenchResults, "", problems)
    if not isinstance(data, dict):
        return problems
    if isinstance(data.get("config"), dict):
        problems += [f"config.{k}: missing" for k in REQUIRED_CONFIG if k not in data["config"]]
    if "summary" not in data:
        problems.append("summary: missing")
    else:
        check(data["summary"], Summary, "summary", problems)
    strategies = data.get("strategies")
    if isinstance(strategies, dict):
        for name, run in strategies.items():
            if not isinstance(run, dict):
                continue
            if "figures" not in run:
                problems.append(f"strategies.{name}.figures: missing")
            else:
                check(run["figures"], StrategyFigures, f"strategies.{name}.figures", problems)
            arrays = ("step_time_s", "loss", "real_tokens", "padded_tokens", "sequences")
            sizes = {a: len(run[a]) for a in arrays if isinstance(run.get(a), list)}
            # optional, but whole when present
            for a in ("trained_tokens", "model_flops", "executed_flops", "step_compile_s"):
                if isinstance(run.get(a), list) and run[a]:
                    sizes[a] = len(run[a])
            if len(set(sizes.values())) > 1:
                problems.append(f"strategies.{name}: per-step arrays differ in length {sizes}")
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        problems.append(f"schema_version: {version} is newer than this padless reads ({SCHEMA_VERSION})")
    problems += _check_complete(data)
    return problems


def _check_complete(data: dict[str, Any]) -> list[str]:
    """A run marked complete must hold every configured strategy with every step."""
    status, config, strategies = data.get("status"), data.get("config"), data.get("strategies")
    if not (isinstance(status, dict) and isinstance(config, dict) and isinstance(strategies, dict)):
        return []
    if status.get("state") != "complete" or not isinstance(config.get("strategies"), list):
        return []
    problems = []
    for name in config["strategies"]:
        run = strategies.get(name)
        if not isinstance(run, dict):
            problems.append(f"strategies.{name}: missing, but status is complete")
        elif isinstance(run.get("step_time_s"), list) and len(run["step_time_s"]) != config.get("steps"):
            problems.append(
                f"strategies.{name}: {len(run['step_time_s'])} steps recorded, config.steps is "
                f"{config.get('steps')}, but status is complete"
            )
    return problems
