"""Recording what a strategy's training measured: :class:`StrategyRecorder` (step by step, frozen into
a :class:`~padless.bench.results.StrategyRun`) and :func:`environment_snapshot` (where the figures
came from). The primitives it records live beside it: :mod:`padless.bench.timing` (step timer, CPU
times), :mod:`padless.bench.memory` (peak memory), :mod:`padless.bench.peak` (the machine's peak).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import torch

from padless.bench.results import CompileRecord, Environment, StrategyRun

if TYPE_CHECKING:
    from padless.bench.timing import CpuTimes
    from padless.models.compile import CompileStats


@dataclass
class StrategyRecorder:
    """Collects one strategy's per-step measurements as training goes; :meth:`result` freezes them
    into a :class:`~padless.bench.results.StrategyRun` (also mid-run, when interrupted)."""

    step_time_s: list[float] = field(default_factory=list)
    """Wall time of each optimiser step."""
    loss: list[float] = field(default_factory=list)
    """Training loss of each step."""
    real_tokens: list[int] = field(default_factory=list)
    """Non-padding tokens of each step."""
    padded_tokens: list[int] = field(default_factory=list)
    """All tokens fed in each step, padding included."""
    sequences: list[int] = field(default_factory=list)
    """Sequences of each step."""
    eval_loss_start: float | None = None
    """Held-out loss before training."""
    eval_loss_end: float | None = None
    """Held-out loss after training."""
    trained_tokens: list[int] = field(default_factory=list)
    """Trained tokens of each step (when recorded)."""
    model_flops: list[float] = field(default_factory=list)
    """Model FLOPs each step needed (when recorded)."""
    executed_flops: list[float] = field(default_factory=list)
    """FLOPs each step executed, padding included (when recorded)."""
    cpu_times: CpuTimes | None = None
    """User and sys CPU time of the training phase (:class:`CpuTimes`)."""
    step_compile_s: list[float] = field(default_factory=list)
    """Seconds torch spent compiling within each step (compiled runs)."""
    compile_stats: CompileStats | None = None
    """The latest :class:`padless.models.compile.CompileStats` (compiled runs)."""
    compile_mode: tuple[str, str] | None = None
    """``(mode, backend)`` of a compiled run."""

    def record_step(
        self,
        *,
        step_time_s: float,
        loss: float,
        real_tokens: int,
        padded_tokens: int,
        sequences: int,
        trained_tokens: int | None = None,
        model_flops: float | None = None,
        executed_flops: float | None = None,
        compile_stats: CompileStats | None = None,
    ) -> None:
        """Append one optimiser step; ``ValueError`` on an impossible combination."""
        step = len(self.step_time_s)
        if step_time_s < 0:
            raise ValueError(f"step {step}: step_time_s is negative ({step_time_s})")
        if not 0 <= real_tokens <= padded_tokens:
            raise ValueError(f"step {step}: real_tokens={real_tokens} must be in [0, padded_tokens={padded_tokens}]")
        if sequences < 0:
            raise ValueError(f"step {step}: sequences is negative ({sequences})")
        self.step_time_s.append(float(step_time_s))
        self.loss.append(float(loss))
        self.real_tokens.append(int(real_tokens))
        self.padded_tokens.append(int(padded_tokens))
        self.sequences.append(int(sequences))
        for name, value in (
            ("trained_tokens", trained_tokens),
            ("model_flops", model_flops),
            ("executed_flops", executed_flops),
        ):
            if value is not None:
                getattr(self, name).append(value)
        if compile_stats is not None:  # seconds compiled during this step: the counter's growth
            before = self.compile_stats.compile_s if self.compile_stats is not None else 0.0
            self.step_compile_s.append(compile_stats.compile_s - before)
            self.compile_stats = compile_stats

    def result(
        self,
        peak_memory_bytes: int | None,
        memory_method: str,
        *,
        max_rss_bytes: int | None = None,
        allocator: str | None = None,
    ) -> StrategyRun:
        """The measurements so far, frozen."""
        user, sys_ = self.cpu_times.elapsed() if self.cpu_times is not None else (None, None)
        return StrategyRun(
            step_time_s=tuple(self.step_time_s),
            loss=tuple(self.loss),
            real_tokens=tuple(self.real_tokens),
            padded_tokens=tuple(self.padded_tokens),
            sequences=tuple(self.sequences),
            peak_memory_bytes=peak_memory_bytes,
            memory_method=memory_method,
            eval_loss_start=self.eval_loss_start,
            eval_loss_end=self.eval_loss_end,
            trained_tokens=tuple(int(n) for n in self.trained_tokens),
            model_flops=tuple(float(x) for x in self.model_flops),
            executed_flops=tuple(float(x) for x in self.executed_flops),
            cpu_user_s=user,
            cpu_sys_s=sys_,
            max_rss_bytes=max_rss_bytes,
            allocator=allocator,
            compiled=self._compile_record(),
            step_compile_s=tuple(self.step_compile_s),
        )

    def _compile_record(self) -> CompileRecord | None:
        if self.compile_mode is None:
            return None
        s = self.compile_stats
        counts = (
            (0, 0, 0, 0, 0.0) if s is None else (s.frames, s.recompiles, s.backward_compiles, s.graphs, s.compile_s)
        )
        return CompileRecord(*self.compile_mode, *counts)


# --- environment --------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment_snapshot(device: torch.device | str = "cpu") -> Environment:
    """Versions, device, CPU and thread count, OS and date: where a run's figures came from."""
    from padless._version import __version__

    device = torch.device(device)
    device_name = cpu_model()
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        get_name = getattr(module, "get_device_name", None)
        device_name = get_name(device) if get_name is not None else device.type
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return Environment(
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=_version("transformers"),
        padless=__version__,
        os=platform.platform(),
        device=str(device),
        device_name=device_name,
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 1,
        cpu_available=available,
        torch_threads=torch.get_num_threads(),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
