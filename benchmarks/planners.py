"""Planner benchmark: padless strategies against TRL and seqpacker on the same lengths, in one run.

For each workload (1M, 10M and 16M lengths from the short-text lognormal distribution, median 60
capped at 2048, and as many uniform 10..500; or ``--lengths FILE`` for a real corpus) it plans rows of
``--max-length`` tokens with every padless strategy (not the deprecated ``first_fit_decreasing``, which plans as best
fit decreasing) and prints wall time (best of ``--repeats``)
with that run's user and sys CPU seconds, rows, efficiency and the gap to the lower bound
ceil(tokens / max_length); then times the peers on the same lengths (TRL only up to
``--trl-max-num`` lengths: it takes ~1 min at 1M) and prints ratios. A summary table at the end
puts every size side by side, with the machine's load average (``os.getloadavg()``) before and
after each workload: the machine may be shared, and timings are only comparable inside one run. Not a test: it asserts nothing, it reports.

    .venv/bin/python benchmarks/planners.py                     # the full run (~8 min, ~4.2 GiB)
    .venv/bin/python benchmarks/planners.py --num 100000 --no-trl
    .venv/bin/python benchmarks/planners.py --lengths lengths.npy --only-lengths --overlong truncate

Peers are measurement-only, never dependencies of padless, and imported only here:

* TRL: ``.venv/bin/pip install --no-deps trl==1.16.0``. ``pack_dataset(..., strategy="bfd")`` is
  timed twice: with its default (``datasets.map`` batches of 1,000 sequences, packed separately) and
  with ``map_kwargs={"batch_size": None}`` (the whole dataset at once). TRL packs token columns, so
  it is handed a dataset of 1-byte tokens of these lengths; building that is not timed.
* seqpacker 0.1.3 (Rust, ``obfd``) has no wheel for CPython on glibc x86_64 and its sdist needs
  crates that cannot be fetched here. ``--setup-peers`` loads its ``cp39-abi3-musllinux_1_2_x86_64``
  wheel for measurement; by hand that is::

      pip download --no-deps --only-binary=:all: --platform musllinux_1_2_x86_64 \\
          --python-version 3.11 -d /tmp/seqpacker seqpacker==0.1.3
      mkdir -p ~/.cache/padless/peers && cd ~/.cache/padless/peers && unzip -o /tmp/seqpacker/*.whl
      ln -sf "$(ldconfig -p | awk '/libc.so.6 .*x86-64/ {print $NF; exit}')" seqpacker.libs/libc.so

  (the extension needs musl's ``libc.so`` and searches ``seqpacker.libs`` first; naming glibc's
  ``libc.so.6`` so there lets it load).
  The benchmark adds ``~/.cache/padless/peers`` to ``sys.path`` when it exists; a peer that cannot be
  imported is skipped with a printed note.
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from padless.planning.lengths import load_lengths, synthetic_lengths
from padless.planning.plan import DEPRECATED_STRATEGIES, STRATEGIES, plan_packs

PEERS_DIR = Path.home() / ".cache" / "padless" / "peers"
PLANNERS = [s for s in STRATEGIES if s not in DEPRECATED_STRATEGIES]  # a deprecated name plans as another
SEQPACKER = "seqpacker==0.1.3"


def setup_peers() -> None:
    """Fetch seqpacker's musllinux wheel into PEERS_DIR and point its bundled libc at glibc."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "musllinux_1_2_x86_64",
                "--python-version",
                "3.11",
                "-d",
                tmp,
                SEQPACKER,
            ],
            check=True,
        )
        (wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
        PEERS_DIR.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(PEERS_DIR)
    # The extension asks for musl's "libc.so" and looks in seqpacker.libs first (its RUNPATH);
    # glibc's /lib/.../libc.so is a linker script, so give it glibc's real libc.so.6 there.
    glibc = _glibc_path()
    link = PEERS_DIR / "seqpacker.libs" / "libc.so"
    link.unlink(missing_ok=True)
    link.symlink_to(glibc)
    print(f"seqpacker unpacked under {PEERS_DIR}; {link} -> {glibc}")


def _glibc_path() -> str:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "libc.so.6" in line and "x86-64" in line:
            return line.rsplit("=>", 1)[1].strip()
    name = ctypes.util.find_library("c")
    raise SystemExit(f"cannot find glibc's libc.so.6 (ctypes says {name!r})")


CPU = {"user": 0.0, "sys": 0.0}  # user and system CPU seconds of the last best_time's best run


def best_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Best wall time of ``repeats`` runs (and the last result); the best run's CPU times go in CPU.

    On a shared machine wall time includes waiting for a core; user + sys CPU time does not, and sys
    time shows what page faults cost (fresh memory for large arrays).
    """
    best, result = float("inf"), None
    for _ in range(repeats):
        result = None  # free the previous result first: peak memory is one result, not two
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        result = fn()
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        if wall < best:
            best = wall
            CPU.update(user=after.ru_utime - before.ru_utime, sys=after.ru_stime - before.ru_stime)
    return best, result


def trl_peer(lengths: np.ndarray, max_length: int) -> list[tuple[str, Callable[[], int]]]:
    import datasets
    import pyarrow as pa
    from trl import pack_dataset

    datasets.disable_progress_bars()

    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(int(offsets[-1]), dtype=np.int8)))
    dataset = datasets.Dataset(pa.table({"input_ids": tokens}))
    return [
        (
            "trl bfd, whole dataset",
            lambda: len(pack_dataset(dataset, max_length, "bfd", map_kwargs={"batch_size": None})),
        ),
        ("trl bfd, default batches", lambda: len(pack_dataset(dataset, max_length, "bfd"))),
    ]


def seqpacker_peer(lengths: np.ndarray, max_length: int) -> list[tuple[str, Callable[[], int]]]:
    import seqpacker

    # Two entry points: bins as Python objects, and flat arrays (item order + bin boundaries) like
    # a PackPlan. Both take a numpy array.
    return [
        (
            "seqpacker obfd pack_sequences",
            lambda: seqpacker.pack_sequences(lengths, capacity=max_length, strategy="obfd").num_bins,
        ),
        ("seqpacker obfd pack_flat", lambda: len(seqpacker.Packer(max_length, "obfd").pack_flat(lengths)[1]) + 1),
    ]


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_workload(name: str, lengths: np.ndarray, args: argparse.Namespace) -> dict:
    """Time every padless strategy and the peers on ``lengths``; print a table; return a summary."""
    L = args.max_length
    placed = int(np.minimum(lengths, L).sum()) if args.overlong == "truncate" else int(lengths[lengths <= L].sum())
    bound = -(-placed // L)
    before = load()
    print(
        f"\n== {name}: {lengths.size:,} lengths, {int(lengths.sum()):,} tokens, max_length {L}, "
        f"lower bound {bound:,} rows ({before})"
    )
    header = f"{'planner':<32}{'time':>10}{'user':>8}{'sys':>8}{'rows':>12}{'gap':>9}{'gap %':>9}{'efficiency':>12}"
    print(header + "\n" + "-" * len(header))

    def line(label: str, seconds: float, rows: int, tokens: int) -> None:
        gap = rows - bound
        shown = f"{seconds:.3f} s" if seconds >= 0.1 else f"{1000 * seconds:.2f} ms"
        print(
            f"{label:<32}{shown:>10}{CPU['user']:>8.2f}{CPU['sys']:>8.2f}{rows:>12,}{gap:>9,}{100 * gap / bound:>8.3f}%{100 * tokens / (rows * L):>11.3f}%",
            flush=True,
        )

    ours: dict[str, tuple[float, int]] = {}
    for strategy in args.strategies:
        seconds, plan = best_time(
            lambda: plan_packs(lengths, L, strategy=strategy, overlong=args.overlong), args.repeats
        )
        stats = plan.stats  # type: ignore[attr-defined]
        ours[strategy] = (seconds, stats.num_rows)
        line(f"padless {strategy}", seconds, stats.num_rows, stats.real_tokens)
        del plan
    # the best packer that keeps sequences whole: fewest rows, then fastest (wrapped cuts sequences)
    whole = {k: v for k, v in ours.items() if k != "wrapped"} or ours
    best = min(whole, key=lambda k: (whole[k][1], whole[k][0]))
    fastest_best = min((k for k in whole if whole[k][1] == whole[best][1]), key=lambda k: whole[k][0])
    best_s, best_rows = whole[fastest_best]

    peers = []
    if not args.no_seqpacker:
        peers.append(("seqpacker", seqpacker_peer, args.repeats))
    if not args.no_trl and lengths.size <= args.trl_max_num:
        peers.append(("trl", trl_peer, args.trl_repeats))
    results = []
    for peer, make, repeats in peers:
        try:
            runs = make(lengths, L)
        except Exception as exc:  # a missing or broken peer is reported, not fatal
            print(f"{peer:<32}skipped: {type(exc).__name__}: {exc}".splitlines()[0])
            continue
        for label, fn in runs:
            seconds, rows = best_time(fn, repeats)
            line(label, seconds, int(rows), placed)  # type: ignore[arg-type]
            results.append((label, seconds, int(rows)))  # type: ignore[arg-type]
    after = load()
    print(
        f"padless best whole-sequence planner: {fastest_best} ({best_s:.3f} s, {best_rows:,} rows, "
        f"{100 * (best_rows - bound) / bound:.4f}% over the lower bound); {after}"
    )
    for label, seconds, rows in results:
        print(
            f"  vs {label:<30} padless is {seconds / best_s:6.2f}x as fast;  rows {best_rows:,} vs {rows:,} "
            f"({best_rows - rows:+,})"
        )
    return {
        "name": name,
        "n": lengths.size,
        "bound": bound,
        "ours": ours,
        "best": fastest_best,
        "peers": results,
        "load": (before, after),
    }


def summary(runs: list[dict]) -> None:
    """A Markdown table: one row per workload; every whole-sequence planner's best time and rows over
    the lower bound, and each peer's time as a multiple of padless' best time."""
    labels = list(dict.fromkeys(label for run in runs for label, _, _ in run["peers"]))
    strategies = [k for k in runs[0]["ours"] if k not in ("next_fit", "wrapped")] if runs else []
    print("\n== summary: best-of time, rows over the lower bound; peers also as (peer time / padless best time)")
    print(
        "| lengths | lower bound | "
        + " | ".join(f"padless `{k}`" for k in strategies)
        + " | "
        + " | ".join(labels)
        + " | load before -> after |"
    )
    print("|---" * (3 + len(strategies) + len(labels)) + "|")
    for run in runs:
        bound, ours = run["bound"], run["ours"]
        best_s = ours[run["best"]][0]
        cells = [f"{ours[k][0]:.3f} s, +{ours[k][1] - bound:,}" for k in strategies]
        peers = {label: (s, r) for label, s, r in run["peers"]}
        cells += [
            f"{peers[x][0]:.3f} s, +{peers[x][1] - bound:,} ({peers[x][0] / best_s:.1f}x)" if x in peers else "-"
            for x in labels
        ]
        print(
            f"| {run['name']}, {run['n']:,} | {bound:,} | "
            + " | ".join(cells)
            + f" | {run['load'][0][5:]} -> {run['load'][1][5:]} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--num",
        type=int,
        nargs="+",
        default=[1_000_000, 10_000_000, 16_000_000],
        help="lengths per synthetic workload (one workload per number and distribution)",
    )
    parser.add_argument("--dists", nargs="+", default=["lognormal", "uniform"], help="synthetic distributions")
    parser.add_argument("--lengths", metavar="FILE", help="also run on a real corpus's lengths (.npy/.txt/.json)")
    parser.add_argument("--only-lengths", action="store_true", help="skip the synthetic workloads")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--overlong", choices=["truncate", "drop"], default="truncate", help="for --lengths files")
    parser.add_argument("--strategies", nargs="+", choices=PLANNERS, default=PLANNERS)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs (padless, seqpacker)")
    parser.add_argument("--trl-repeats", type=int, default=1, help="TRL is slow: runs per TRL variant")
    parser.add_argument("--trl-max-num", type=int, default=1_000_000, help="time TRL only up to this many lengths")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--no-seqpacker", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setup-peers", action="store_true", help="fetch and unpack seqpacker, then exit")
    args = parser.parse_args()
    if args.setup_peers:
        setup_peers()
        return
    if PEERS_DIR.is_dir():
        sys.path.insert(0, str(PEERS_DIR))
    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} CPUs, {os.uname().machine}, "
        f"{load()}"
    )
    workloads: list[tuple[str, Callable[[], np.ndarray]]] = []
    if not args.only_lengths:
        for num in args.num:
            for dist in args.dists:
                workloads.append(
                    (f"{dist} (seed {args.seed})", lambda d=dist, n=num: synthetic_lengths(d, n, args.seed))
                )
    if args.lengths:
        workloads.append((f"file {args.lengths}", lambda: load_lengths(args.lengths)))
    runs = [run_workload(name, make(), args) for name, make in workloads]  # lengths made one at a time
    summary(runs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"peak RSS {peak:.2f} GiB; {load()}")


if __name__ == "__main__":
    main()
