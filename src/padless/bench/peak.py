"""The machine's peak FLOP/s for a model: timed GEMMs of the model's own shapes on the run's device
and dtype, the denominator of the benchmark's MFU (:func:`measure_peak_flops`).

One GEMM per clock read measures the launch and the sync as much as the GEMM (on a GPU a small GEMM
takes microseconds, a launch and a host sync about as long), which makes the peak low and MFU high.
So the GEMMs run back to back in batches that grow until a batch lasts a tenth of the time budget,
timed on the device with CUDA events where there are any (:func:`gemm_timer`), else with
``perf_counter`` between two syncs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from padless.bench.timing import synchronizer

if TYPE_CHECKING:
    from padless.bench.flops import ModelShape

Timer = Callable[[Callable[[], object], int], float]
"""``(work, repeats) -> seconds`` that ``repeats`` back-to-back calls of ``work`` took."""


def gemm_shapes(shape: ModelShape, rows: int) -> list[tuple[int, int, int]]:
    """The model's GEMMs ``(M, K, N)`` for ``rows`` tokens: the attention projection, the MLP up and
    down projections and the LM head."""
    q = shape.heads * shape.head_dim
    return [
        (rows, shape.hidden, q),
        (rows, shape.hidden, shape.intermediate),
        (rows, shape.intermediate, shape.hidden),
        (rows, shape.hidden, shape.vocab),
    ]


def gemm_timer(device: torch.device | str) -> Timer:
    """How :func:`measure_peak_flops` times a batch of GEMMs on ``device``: CUDA events recorded around
    the batch on a CUDA device (no host sync inside the batch), else the wall clock between two
    device syncs."""
    device = torch.device(device)
    if device.type == "cuda":

        def on_device(work: Callable[[], object], repeats: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                work()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0  # milliseconds -> seconds

        return on_device
    sync = synchronizer(device)

    def wall(work: Callable[[], object], repeats: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            work()
        sync()
        return time.perf_counter() - start

    return wall


def measure_peak_flops(
    shapes: list[tuple[int, int, int]],
    device: torch.device | str,
    dtype: torch.dtype,
    min_time_s: float = 0.3,
    *,
    timer: Timer | None = None,
) -> tuple[float, str]:
    """The machine's peak for this model: the best FLOP/s of timed GEMMs ``[M, K] @ [K, N]`` of the
    given shapes (the model's projections, MLP and head), on ``device`` in ``dtype`` (16-bit dtypes
    are timed as autocast runs them). Each shape runs for at least ``min_time_s`` in batches of
    back-to-back GEMMs (doubled until a batch lasts ``min_time_s / 10``); the fastest batch, per GEMM,
    counts. ``timer`` defaults to :func:`gemm_timer` of ``device``. Returns ``(FLOP/s, "M x K x N dtype")``."""
    from padless.devices import dtype_name

    device = torch.device(device)
    timer = timer or gemm_timer(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    best, where = 0.0, ""
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(k, n, generator=gen).to(device=device, dtype=dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)
        work = functools.partial(torch.mm, a, b, out=c)  # no allocation inside the timed batch
        timer(work, 1)  # warm-up: kernel selection, first touch of the output
        fastest, spent, repeats = float("inf"), 0.0, 1
        while spent < min_time_s:
            took = timer(work, repeats)
            fastest, spent = min(fastest, took / repeats), spent + took
            if took < min_time_s / 10:
                repeats *= 2
        rate = 2.0 * m * k * n / fastest
        if rate > best:
            best, where = rate, f"{m} x {k} x {n} {dtype_name(dtype)}"
        del a, b, c
    return best, where
