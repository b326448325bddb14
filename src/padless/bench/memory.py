"""Peak memory of this process over a phase (one strategy's training): :class:`PeakMemory`.

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

import os
import re
import sys
import threading
import typing
from typing import Literal

import torch

MemoryMethod = Literal["accelerator-max-allocated", "vmhwm", "statm-sampler", "ru_maxrss"]
CPU_MEMORY_METHODS: tuple[MemoryMethod, ...] = ("vmhwm", "statm-sampler", "ru_maxrss")
"""CPU methods in order of preference (see the module docstring)."""


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
    else the first of :data:`CPU_MEMORY_METHODS` that works here (or the method passed in).
    """

    def __init__(
        self, device: torch.device | str = "cpu", method: MemoryMethod | None = None, interval_s: float = 0.005
    ):
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


def max_rss_bytes() -> int | None:
    """This process's lifetime peak RSS (``ru_maxrss``); ``None`` where ``resource`` is missing."""
    try:
        return _ru_maxrss_bytes()
    except ImportError:
        return None
