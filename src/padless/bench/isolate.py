"""Each strategy of ``padless bench`` in its own process, with a chosen memory allocator.

One process per strategy keeps the strategies from measuring each other: an allocator that keeps
freed memory (as a tuned one should) would otherwise hand the next strategy a warm heap and a peak
RSS that is the largest so far, not its own. The parent (:func:`padless.bench.run.run_benchmark`)
starts ``python -m padless.bench.child CONFIG.json STRATEGY OUT.json ALLOCATOR`` per strategy, waits, and
reads back the child's :class:`~padless.bench.results.StrategyRun` (peak RSS from the child's own
``ru_maxrss``, user and sys CPU time of its training phase, the allocator it ran with).

Allocators (:data:`ALLOCATORS`). glibc's malloc serves large blocks with ``mmap`` and gives them
back on ``free``, so a training step that allocates and frees the same large tensors pays page
faults and zeroing again every step (measured: most of a run's time in the kernel on 2 cores).
``glibc-tuned`` raises the mmap and trim thresholds so freed blocks stay in the heap for the next
step; jemalloc and tcmalloc keep freed memory by design (``LD_PRELOAD``, where the library is
installed; a missing one falls back to ``glibc-tuned`` and says so). ``auto`` is ``glibc-tuned``,
chosen by numbers: 16 steps of padding and packing, gpt2-2layer, 8 x 1024 tokens (``--preset quick
--steps 16 --batch-size 8 --max-length 1024 --limit 300 --allocator A``), kernel time as a share of
the training phase's CPU time (both strategies' user + sys in brackets): glibc 23-24% (83.5 s),
jemalloc 19-24% (86.4 s; its default decay hands pages back), glibc-tuned 2-5% (73.1 s), tcmalloc
1-2% (67.0 s). tcmalloc's 8% less CPU time, measured on a machine shared with other jobs, is not a
strong enough case for a Debian package (libtcmalloc-minimal4) that CI and ``scripts/setup.sh``
cannot count on; glibc-tuned needs nothing. ``--allocator tcmalloc`` is there to re-measure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from padless.bench.config import RunConfig
    from padless.bench.results import StrategyRun

GLIBC_TUNED = {
    "MALLOC_MMAP_THRESHOLD_": str(16 * 2**30),  # blocks up to 16 GiB come from the heap, not mmap
    "MALLOC_TRIM_THRESHOLD_": str(16 * 2**30),  # freed memory is not handed back to the kernel
    "MALLOC_TOP_PAD_": str(2**30),  # grow the heap in 1 GiB steps
}
"""glibc malloc tunables (``mallopt(3)`` environment variables) of ``glibc-tuned``."""

PRELOADS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so"),
}
"""Allocator -> shared-library names tried for ``LD_PRELOAD`` (Debian: libjemalloc2, libtcmalloc-minimal4)."""

ALLOCATORS = ("glibc", "glibc-tuned", "jemalloc", "tcmalloc")
DEFAULT_ALLOCATOR = "glibc-tuned"
"""What ``auto`` means."""

_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def find_library(names: tuple[str, ...]) -> str | None:
    """The first of ``names`` found in the usual library folders, as a full path."""
    for folder in _LIB_DIRS:
        for name in names:
            path = Path(folder) / name
            if path.is_file():
                return str(path)
    return None


def allocator_env(name: str) -> tuple[str, dict[str, str]]:
    """``(description of what is used, environment variables to add)`` for allocator ``name``."""
    if name == "auto":
        name = DEFAULT_ALLOCATOR
    if name not in ALLOCATORS:
        raise ValueError(f"allocator {name!r}: choose one of auto, {', '.join(ALLOCATORS)}")
    if name == "glibc":
        return "glibc", {}
    if name == "glibc-tuned":
        return "glibc-tuned", dict(GLIBC_TUNED)
    path = find_library(PRELOADS[name])
    if path is None:
        return f"glibc-tuned ({name} not installed)", dict(GLIBC_TUNED)
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD"), path) if p)
    return name, {"LD_PRELOAD": preload}


def _child_env(cfg: RunConfig) -> tuple[str, dict[str, str]]:
    """The allocator used and the child's environment (the same padless as the parent's)."""
    used, extra = allocator_env(cfg.allocator)
    env = {**os.environ, **extra}
    if "padless" in sys.modules:  # the child imports the same padless as the parent
        src = str(Path(sys.modules["padless"].__file__).parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return used, env


def _read_result(name: str, out: Path, code: int | None) -> tuple[StrategyRun, int | None, tuple[int, ...]]:
    from padless.bench.results import StrategyRun
    from padless.bench.schema import from_plain

    if not out.is_file():
        raise RuntimeError(f"the {name} process exited with status {code} without writing its results")
    data = json.loads(out.read_text(encoding="utf-8"))
    return from_plain(StrategyRun, data["run"]), data["interrupted_at"], tuple(data["lengths"])


def run_in_child(
    cfg: RunConfig, name: str, *, progress: bool = True
) -> tuple[StrategyRun, int | None, tuple[int, ...]]:
    """Run strategy ``name`` of ``cfg`` in a fresh Python process; returns its measurements, the step
    it was interrupted at (``None``: finished) and the training lengths. Ctrl-C reaches the child
    too (same process group); the parent then waits for it to write what it measured."""
    import dataclasses

    used, env = _child_env(cfg)
    with tempfile.TemporaryDirectory(prefix="padless-bench-") as tmp:
        spec, out = Path(tmp) / "config.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps(dataclasses.asdict(cfg)), encoding="utf-8")
        cmd = [sys.executable, "-m", "padless.bench.child", str(spec), name, str(out), used]
        if not progress:
            cmd.append("--no-progress")
        proc = subprocess.Popen(cmd, env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            code = proc.wait()  # the child got the Ctrl-C too and is writing what it measured
        return _read_result(name, out, code)


def run_interleaved(
    cfg: RunConfig, names: tuple[str, ...], *, progress: bool = True, on_round: Callable[[int], None] | None = None
) -> dict[str, tuple[StrategyRun, int | None, tuple[int, ...]]]:
    """Run every strategy of ``names`` in its own process, all started together and stepped in turn:
    step 1 of each strategy, then step 2 of each, ... (one strategy's step runs at a time). Load on the
    machine that comes and goes then falls on every strategy alike, and step ``i`` of two strategies
    (the same examples in same-examples mode) is timed a few seconds apart. Returns what
    :func:`run_in_child` returns, per strategy. The processes load the model and data and run their
    first evaluation side by side, before the first step; each one's final evaluation runs while the
    others wait. ``on_round(i)`` is called before round ``i`` (0-based; step ``i`` of every strategy),
    e.g. to start a load halfway through a run."""
    import dataclasses

    from tqdm.auto import tqdm

    used, env = _child_env(cfg)
    with tempfile.TemporaryDirectory(prefix="padless-bench-") as tmp:
        spec = Path(tmp) / "config.json"
        spec.write_text(json.dumps(dataclasses.asdict(cfg)), encoding="utf-8")
        procs: dict[str, tuple[subprocess.Popen[bytes], int, int, Path]] = {}
        try:
            for name in names:
                go_r, go_w = os.pipe()
                ready_r, ready_w = os.pipe()
                out = Path(tmp) / f"{name}.json"
                cmd = [sys.executable, "-m", "padless.bench.child", str(spec), name, str(out), used,
                       "--no-progress", "--turns", str(go_r), str(ready_w)]  # fmt: skip
                proc = subprocess.Popen(cmd, env=env, pass_fds=(go_r, ready_w))
                os.close(go_r)
                os.close(ready_w)
                procs[name] = (proc, go_w, ready_r, out)
            live = [n for n in names if os.read(procs[n][2], 1) == b"r"]  # every one set up and waiting
            bar = tqdm(total=cfg.steps, desc="interleaved", unit="round", disable=not progress, leave=False)
            rounds = 0
            while live:
                if on_round is not None:
                    on_round(rounds)
                rounds += 1
                for name in list(live):
                    _, go_w, ready_r, _ = procs[name]
                    os.write(go_w, b"g")
                    if os.read(ready_r, 1) != b"r":  # end of file: its last step is done, the process ended
                        live.remove(name)
                bar.update(1)
            bar.close()
        except (KeyboardInterrupt, BrokenPipeError):
            pass  # the children got the Ctrl-C too (or one died): each writes what it measured
        finally:
            for _, go_w, ready_r, _ in procs.values():
                os.close(go_w)  # a child still waiting for its turn reads end of file and stops
                os.close(ready_r)
        results = {}
        for name, (proc, _, _, out) in procs.items():
            try:
                code = proc.wait()
            except KeyboardInterrupt:
                code = proc.wait()
            results[name] = _read_result(name, out, code)
        return results
