"""Measuring primitives of the benchmark: step timer, peak memory over a phase, environment snapshot.

Step timing uses ``time.perf_counter``. Accelerators run asynchronously, so a timer must wait for
queued work before reading the clock; the wait is a hook (:func:`synchronizer`) derived from the
device of the inputs, so nothing here names a particular accelerator.

Peak memory, per strategy:

- accelerator: ``torch.accelerator.max_memory_allocated`` after ``reset_peak_memory_stats``
  (tensor memory the caching allocator handed out; what a strategy's batches cost).
- CPU, first choice ``vmhwm``: the kernel's own high-water mark of resident memory (``VmHWM`` in
  ``/proc/self/status``), reset at the start of each phase by writing ``5`` to
  ``/proc/self/clear_refs`` (Linux >= 4.0). It is exact (no sample can miss a short spike) and costs
  nothing while training, which matters on a machine with two cores where a sampling thread would
  compete with the step being timed. ``ru_maxrss`` cannot be used as is: it is the maximum over the
  process's lifetime, so every strategy after the first would inherit the largest earlier peak.
- CPU fallback ``statm-sampler``: where ``clear_refs`` is not writable, a daemon thread samples the
  current RSS from ``/proc/self/statm`` every few milliseconds (may miss spikes shorter than that).
- last resort ``ru_maxrss`` (no ``/proc``, e.g. macOS): the lifetime maximum, flagged as such by its
  method name so a reader knows the figures are not per strategy.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Literal

from padless.bench.results import CompileRecord, Environment, StrategyRun

if TYPE_CHECKING:
    import torch

    from padless.models.compile import CompileStats

MemoryMethod = Literal["accelerator-max-allocated", "vmhwm", "statm-sampler", "ru_maxrss"]
CPU_MEMORY_METHODS: tuple[MemoryMethod, ...] = ("vmhwm", "statm-sampler", "ru_maxrss")
"""CPU methods in order of preference (see the module docstring)."""


def _no_sync() -> None:
    return None


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """A function that waits until all work queued on ``device`` has finished (a no-op on CPU).

    Uses ``torch.accelerator.synchronize`` where torch has it, else the device module's own
    ``synchronize`` (``torch.<device type>.synchronize``)."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return _no_sync
    accel = getattr(torch, "accelerator", None)
    if accel is not None and hasattr(accel, "synchronize"):
        return lambda: accel.synchronize(device)
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "synchronize"):
        raise ValueError(f"device {str(device)!r}: torch has no synchronize() for {device.type!r}")
    return lambda: module.synchronize(device)


class StepTimer:
    """Times steps with ``perf_counter``, synchronising the device before and after each step.

        timer = StepTimer(sync=synchronizer(device))
        for batch in batches:
            with timer.step():
                train_step(batch)
        timer.times_s            # every completed step, warm-up included
        timer.measured(warmup)   # the steps after the warm-up

    A step that raises (e.g. Ctrl-C) is not recorded: its time would be a fragment.
    """

    def __init__(
        self, sync: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter
    ):
        self.sync = sync or _no_sync
        self.clock = clock
        self.times_s: list[float] = []

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time the body of the ``with`` block as one step."""
        self.sync()  # work queued before the step must not be billed to it
        start = self.clock()
        yield
        self.sync()
        self.times_s.append(self.clock() - start)

    def measured(self, warmup_steps: int) -> list[float]:
        """Step times after the first ``warmup_steps`` (fewer steps than that: an empty list)."""
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        return self.times_s[warmup_steps:]


# --- peak memory --------------------------------------------------------------------------------

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes() -> int | None:
    """Resident memory of this process now (``/proc/self/statm``), ``None`` without ``/proc``."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except OSError:
        return None


def _vmhwm_bytes() -> int:
    with open("/proc/self/status") as f:
        match = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.MULTILINE)
    if match is None:
        raise OSError("no VmHWM line in /proc/self/status")
    return int(match.group(1)) * 1024


def _reset_vmhwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # 5: reset the peak RSS to the current RSS (proc(5), Linux >= 4.0)


def _ru_maxrss_bytes() -> int:
    import resource  # POSIX only

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def cpu_method_works(method: MemoryMethod) -> bool:
    """Whether CPU memory method ``method`` can be used in this process (``vmhwm`` is tried)."""
    try:
        if method == "vmhwm":
            _reset_vmhwm()
            _vmhwm_bytes()
        elif method == "statm-sampler":
            return current_rss_bytes() is not None
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory of this process over a phase (one strategy's training), reset by :meth:`start`.

        mem = PeakMemory(device)
        mem.start()
        ...                # train
        peak = mem.stop()  # bytes, or None where nothing could be measured

    ``method`` is chosen at construction: the accelerator's allocator statistics on an accelerator,
    else the first of :data:`CPU_MEMORY_METHODS` that works here (or the one passed in).
    """

    def __init__(self, device: torch.device | str = "cpu", method: MemoryMethod | None = None,
                 interval_s: float = 0.005):
        import torch

        self.device = torch.device(device)
        if method is None:
            if self.device.type != "cpu":
                method = "accelerator-max-allocated"
            else:
                method = next(m for m in CPU_MEMORY_METHODS if cpu_method_works(m))
        elif method not in typing.get_args(MemoryMethod):
            raise ValueError(f"memory method {method!r} is not one of {typing.get_args(MemoryMethod)}")
        elif method != "accelerator-max-allocated" and not cpu_method_works(method):
            raise ValueError(f"memory method {method!r} does not work on this machine")
        self.method: MemoryMethod = method
        self.interval_s = interval_s
        self._sampled_peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _accel(self):  # torch.accelerator where it exists, else torch.<device type>
        import torch

        accel = getattr(torch, "accelerator", None)
        if accel is not None and hasattr(accel, "max_memory_allocated"):
            return accel
        return getattr(torch, self.device.type)

    def sample(self) -> None:
        """Fold the current RSS into the peak (``statm-sampler``; the thread calls this)."""
        rss = current_rss_bytes()
        if rss is not None:
            self._sampled_peak = max(self._sampled_peak, rss)

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        """Begin a phase: forget earlier peaks (where the method allows it)."""
        self.stop()
        if self.method == "accelerator-max-allocated":
            self._accel().reset_peak_memory_stats(self.device)
        elif self.method == "vmhwm":
            _reset_vmhwm()
        elif self.method == "statm-sampler":
            self._sampled_peak = 0
            self.sample()
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample_loop, name="padless-rss", daemon=True)
            self._thread.start()

    def peak_bytes(self) -> int | None:
        """Peak since :meth:`start` (lifetime peak for ``ru_maxrss``)."""
        if self.method == "accelerator-max-allocated":
            return int(self._accel().max_memory_allocated(self.device))
        if self.method == "vmhwm":
            return _vmhwm_bytes()
        if self.method == "statm-sampler":
            self.sample()
            return self._sampled_peak or None
        return _ru_maxrss_bytes()

    def stop(self) -> int | None:
        """End the phase (stops the sampling thread) and return its peak."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return self.peak_bytes()


# --- per-strategy recording ---------------------------------------------------------------------


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

    def record_step(self, *, step_time_s: float, loss: float, real_tokens: int, padded_tokens: int,
                    sequences: int, trained_tokens: int | None = None, model_flops: float | None = None,
                    executed_flops: float | None = None, compile_stats: CompileStats | None = None) -> None:
        """Append one optimiser step; ``ValueError`` on an impossible combination."""
        step = len(self.step_time_s)
        if step_time_s < 0:
            raise ValueError(f"step {step}: step_time_s is negative ({step_time_s})")
        if not 0 <= real_tokens <= padded_tokens:
            raise ValueError(
                f"step {step}: real_tokens={real_tokens} must be in [0, padded_tokens={padded_tokens}]"
            )
        if sequences < 0:
            raise ValueError(f"step {step}: sequences is negative ({sequences})")
        self.step_time_s.append(float(step_time_s))
        self.loss.append(float(loss))
        self.real_tokens.append(int(real_tokens))
        self.padded_tokens.append(int(padded_tokens))
        self.sequences.append(int(sequences))
        for name, value in (("trained_tokens", trained_tokens), ("model_flops", model_flops),
                            ("executed_flops", executed_flops)):  # fmt: skip
            if value is not None:
                getattr(self, name).append(value)
        if compile_stats is not None:  # seconds compiled during this step: the counter's growth
            before = self.compile_stats.compile_s if self.compile_stats is not None else 0.0
            self.step_compile_s.append(compile_stats.compile_s - before)
            self.compile_stats = compile_stats

    def result(self, peak_memory_bytes: int | None, memory_method: str, *, max_rss_bytes: int | None = None,
               allocator: str | None = None) -> StrategyRun:
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
        counts = (0, 0, 0, 0, 0.0) if s is None else (s.frames, s.recompiles, s.backward_compiles, s.graphs,
                                                       s.compile_s)
        return CompileRecord(*self.compile_mode, *counts)


class CpuTimes:
    """User and kernel CPU time of this process (all threads) since :meth:`start`, until :meth:`stop`
    (``resource.getrusage``; on a system without it, ``elapsed`` gives ``(None, None)``)."""

    def __init__(self) -> None:
        self._start: tuple[float, float] | None = None
        self._stop: tuple[float, float] | None = None

    @staticmethod
    def _now() -> tuple[float, float] | None:
        try:
            import resource
        except ImportError:  # not POSIX
            return None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime, usage.ru_stime

    def start(self) -> None:
        self._start, self._stop = self._now(), None

    def stop(self) -> None:
        self._stop = self._now()

    def elapsed(self) -> tuple[float | None, float | None]:
        """``(user_s, sys_s)`` from start to stop (to now, while running)."""
        end = self._stop or self._now()
        if self._start is None or end is None:
            return None, None
        return end[0] - self._start[0], end[1] - self._start[1]


def max_rss_bytes() -> int | None:
    """This process's lifetime peak RSS (``ru_maxrss``); ``None`` where ``resource`` is missing."""
    try:
        return _ru_maxrss_bytes()
    except ImportError:
        return None


def measure_peak_flops(shapes: list[tuple[int, int, int]], device: torch.device | str, dtype: torch.dtype,
                       min_time_s: float = 0.3) -> tuple[float, str]:
    """The machine's peak for this model: the best FLOP/s of timed GEMMs ``[M, K] @ [K, N]`` of the
    given shapes (the model's projections, MLP and head), on ``device`` in ``dtype`` (16-bit dtypes
    are timed as autocast runs them). Each shape is repeated for at least ``min_time_s``; the fastest
    repetition counts. Returns ``(FLOP/s, "M x K x N dtype")``."""
    import torch

    device = torch.device(device)
    sync = synchronizer(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    best, where = 0.0, ""
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(k, n, generator=gen).to(device=device, dtype=dtype)
        torch.mm(a, b)  # warm-up: kernel selection, first-touch of the output
        sync()
        fastest, spent = float("inf"), 0.0
        while spent < min_time_s:
            start = time.perf_counter()
            torch.mm(a, b)
            sync()
            took = time.perf_counter() - start
            fastest, spent = min(fastest, took), spent + took
        rate = 2.0 * m * k * n / fastest
        if rate > best:
            best, where = rate, f"{m} x {k} x {n} {str(dtype).removeprefix('torch.')}"
        del a, b
    return best, where


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
    import torch

    import padless

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
        padless=padless.__version__,
        os=platform.platform(),
        device=str(device),
        device_name=device_name,
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 1,
        cpu_available=available,
        torch_threads=torch.get_num_threads(),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
