"""Streaming packing against the offline planner: efficiency and time, side by side on the same lengths.

For each length distribution (synthetic lognormal and uniform, and the built-in corpora's real lengths
via ``padless.data.corpus_lengths``) and each buffer size, prints the streaming rows' efficiency next to
offline best-fit decreasing's (``plan_packs``), the gap in points, and the time of each, measured in
the same process one after the other (the ratio is the figure; absolute times depend on the machine)::

    .venv/bin/python benchmarks/stream.py                       # 1M synthetic + corpora, rows of 2048
    .venv/bin/python benchmarks/stream.py --sequences 200000 --no-corpora --json stream.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from padless.planning.buffered import stream_plan
from padless.planning.plan import plan_packs


def synthetic(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "lognormal(median 200, sigma 1.0)": np.maximum(1, rng.lognormal(np.log(200), 1.0, n).round()).astype(np.int64),
        "uniform(10..500)": rng.integers(10, 501, n),
    }


def corpora(names: list[str]) -> dict[str, np.ndarray]:
    try:
        from padless.data import corpus_lengths
    except ImportError as err:  # padless.data not installed in this tree
        print(f"(corpora skipped: {err})")
        return {}
    out = {}
    for name in names:
        try:
            out[f"corpus {name}"] = np.asarray(corpus_lengths(name, "gpt2", progress=False), dtype=np.int64)
        except (ValueError, OSError) as err:  # a missing offline asset
            print(f"(corpus {name} skipped: {err})")
    return out


def measure(lengths: np.ndarray, max_length: int, buffer_size: int, overlong: str) -> dict[str, float]:
    t0 = time.perf_counter()
    streamed = stream_plan(lengths, max_length, buffer_size=buffer_size, overlong=overlong)
    t1 = time.perf_counter()
    offline = plan_packs(lengths, max_length, strategy="best_fit_decreasing", overlong=overlong)
    t2 = time.perf_counter()
    streamed.check(lengths)
    s, o = streamed.stats, offline.stats
    return {
        "buffer_size": buffer_size,
        "stream_rows": s.num_rows,
        "offline_rows": o.num_rows,
        "lower_bound": o.lower_bound,
        "stream_efficiency": s.efficiency,
        "offline_efficiency": o.efficiency,
        "gap_points": 100 * (o.efficiency - s.efficiency),
        "stream_s": t1 - t0,
        "offline_s": t2 - t1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=1_000_000, help="synthetic sequences per distribution")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--buffers", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--corpora", nargs="+", default=["tweets:all", "dialogues", "toolcalls", "agentic-rag"])
    parser.add_argument("--no-corpora", action="store_true")
    parser.add_argument("--overlong", default="truncate", help="policy for both packers (same tokens placed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    data = synthetic(args.sequences, args.seed)
    if not args.no_corpora:
        data.update(corpora(args.corpora))
    print(
        f"rows of {args.max_length} tokens, overlong={args.overlong}; {platform.processor() or platform.machine()}, "
        f"{platform.python_version()}"
    )
    header = (
        f"{'lengths':34s} {'n':>9s} {'buffer':>7s} {'stream eff':>10s} {'offline eff':>11s} {'gap pt':>7s} "
        f"{'rows s/o':>17s} {'time s/o':>9s}"
    )
    print(header)
    results = []
    for name, lengths in data.items():
        for buffer_size in args.buffers:
            r = measure(lengths, args.max_length, buffer_size, args.overlong)
            results.append({"lengths": name, "n": int(lengths.size), "mean": float(lengths.mean()), **r})
            print(
                f"{name:34s} {lengths.size:9d} {buffer_size:7d} {r['stream_efficiency']:10.4f} "
                f"{r['offline_efficiency']:11.4f} {r['gap_points']:7.3f} "
                f"{r['stream_rows']:>8d}/{r['offline_rows']:<8d} {r['stream_s'] / r['offline_s']:8.1f}x"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"max_length": args.max_length, "overlong": args.overlong, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
