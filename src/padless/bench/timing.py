"""Timing a training step: :class:`StepTimer` (wall time between device syncs) and :class:`CpuTimes`
(user and kernel CPU time of the process over a phase).

Step timing uses ``time.perf_counter``. Accelerators run asynchronously, so a timer must wait for
queued work before reading the clock; the wait is a hook (:func:`synchronizer`) derived from the
device of the inputs, so nothing here names a particular accelerator.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch


def _no_sync() -> None:
    return None


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """A function that waits until all work queued on ``device`` has finished (a no-op on CPU).

    Uses ``torch.accelerator.synchronize`` where torch has it, else the device module's own
    ``synchronize`` (``torch.<device type>.synchronize``)."""
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

    def __init__(self, sync: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter):
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
