"""The ``results.json`` of ``padless bench``: its schema, saving and loading, and validation.

A results file holds what was measured, step by step, for every strategy (step time, loss, real and
padded tokens, sequences), plus the run's configuration, the machine it ran on and the corpus
lengths. Everything else (step-time and tokens/s medians with their spread, padding fraction,
speedups, warnings) is *derived* (:mod:`padless.bench.figures`) from the per-step arrays, never passed in, so a figure in the report can always be
recomputed from the raw data. The derived sections are written into the json for readers, and
recomputed (not trusted) when a file is loaded.

    results.json
      config          RunConfig        what was run (device and dtype resolved)
      environment     Environment      where it ran
      strategies      {name: StrategyRun + "figures": StrategyFigures}
      lengths         [int]            corpus token lengths, for the histogram
      summary         Summary          speedups, the ideal speedup, eval-loss deltas, warnings
      status          RunStatus        "complete", or "interrupted" and how far it got
      padless_version str
      schema_version  int
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from padless.bench.config import Mode, RunConfig
from padless.bench.figures import StrategyFigures, Summary, strategy_figures, summarize
from padless.bench.schema import check, from_plain

SCHEMA_VERSION = 1
# re-exported: the results file's config is a RunConfig, its derived sections StrategyFigures and Summary
__all__ = ["Mode", "RunConfig", "StrategyFigures", "Summary"]

REQUIRED_CONFIG = (
    "model",
    "data",
    "strategies",
    "steps",
    "batch_size",
    "max_length",
    "mode",
    "seed",
    "device",
    "dtype",
    "grad_accumulation",
    "warmup_steps",
    "lr",
)
"""Config fields a results file must carry (every RunConfig field has a default for the command line,
but a figure cannot be read without these); the others may be absent, and readers must not
require them."""

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
    """How the peak was measured (``padless.bench.memory.MemoryMethod``)."""
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
    device and dtype, at the start of the run (padless.bench.peak.measure_peak_flops)."""
    peak_gemm: str | None = None
    """The GEMM shape that reached ``peak_flops_per_s`` (``M x K x N dtype``)."""

    def figures(self) -> dict[str, StrategyFigures]:
        """Derived figures per strategy."""
        return {
            n: strategy_figures(r, self.config.warmup_steps, self.peak_flops_per_s) for n, r in self.strategies.items()
        }

    def summary(self) -> Summary:
        """Speedups, eval-loss comparisons and warnings, derived from the per-step data."""
        return summarize(
            self.strategies,
            self.config.warmup_steps,
            peak_flops_per_s=self.peak_flops_per_s,
            same_examples=self.config.mode == "same-examples",
        )

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
