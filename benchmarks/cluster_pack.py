"""``padless pack`` on the local engine and on Ray, its serial parts, and ``pack_dataset`` against TRL
(a benchmark, not a test; output in docs/bench/cluster-pack.txt).

    python benchmarks/cluster_pack.py                           # every part
    python benchmarks/cluster_pack.py --part engines --sequences 5000000
    python benchmarks/cluster_pack.py --part serial --part dataset

Parts:

* ``engines``: the same input packed by ``padless pack`` (one subprocess per run, so each driver's peak
  memory and Ray's startup are its own) on the local engine and on Ray with 1 and 2 workers: a
  synthetic input (lognormal lengths, median 60, rows of 1024, ``--overlong split``) and a text
  corpus where tokenizing dominates (the built-in ``tweets`` texts repeated, GPT-2 tokenizer, rows of
  2048). Rows, seconds, sequences/s, scaling efficiency (sequences/s over the 1-worker Ray run's, per
  worker), the driver's peak RSS, the time of each stage, and whether every run wrote the same bytes.
* ``serial``: what the driver does alone, at cluster scale: merging the shards' histograms and
  planning from the merged one, for 100M and 1B lengths (a histogram scaled from 1M lognormal
  lengths: the plan's cost depends on the distinct lengths, not on their number), and Ray's startup.
* ``dataset``: ``padless.pack_dataset`` against ``trl.pack_dataset`` on tokenized rows with labels
  (uniform 10..500 and a bimodal mix, 80% of 10..200 and 20% of 1000..2048 tokens; rows of 2048),
  and against a pyarrow ``take`` of the same rows in the packed order (the cost of moving the tokens).

Timings are only comparable within one run of this script; the machine and its load are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def machine() -> str:
    return (
        f"machine: {os.cpu_count()} CPUs, {platform.platform()}, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )


def pack_run(args: list[str], out: Path) -> dict[str, Any]:
    """One ``padless pack`` in its own process; its summary and wall time (startup included)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "padless", "pack", *args, "--out", str(out), "--no-progress"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t
    summary = json.loads((out / "summary.json").read_text())
    return {**summary, "process_s": wall}


def engines(tmp: Path, sequences: int, texts: int) -> list[str]:
    lines = []
    corpus = tmp / "tweets.jsonl"
    from padless.data.corpora import split_corpus_name

    recipe, selector = split_corpus_name("tweets")  # type: ignore[misc]
    records = list(recipe.build(selector, 0, recipe.tool_schema))
    with open(corpus, "w") as f:
        for i in range(texts):
            f.write(json.dumps({"text": records[i % len(records)]["text"]}) + "\n")
    inputs = {
        f"synthetic lognormal:{sequences}, rows of 1024": ["--synthetic", f"lognormal:{sequences}", "--max-length",
                                                          "1024", "--overlong", "split"],
        f"text: tweets x {texts // len(records)} ({texts} texts), rows of 2048": [str(corpus), "--max-length", "2048",
                                                                                  "--shard-rows", "16384"],
    }  # fmt: skip
    runs = {"local": [], "ray 1 worker": ["--engine", "ray", "--num-workers", "1"],
            "ray 2 workers": ["--engine", "ray", "--num-workers", "2"]}  # fmt: skip
    header = (
        f"{'run':<14} {'rows':>9} {'seconds':>8} {'seq/s':>9} {'scaling':>8} {'driver MiB':>10}  "
        "stages (s): startup map plan place write"
    )
    for title, args in inputs.items():
        lines += ["", title, header]
        results, digests = {}, {}
        for name, extra in runs.items():
            out = tmp / "out"
            shutil.rmtree(out, ignore_errors=True)
            r = pack_run([*args, *extra], out)
            digests[name] = [s["blake2b"] for s in r["shards"]]
            results[name] = r
            n, secs = r["stats"]["num_sequences"], r["process_s"]
            base = results.get("ray 1 worker")
            workers = r["this_run"]["workers"]
            scaling = (
                (n / secs) / (base["stats"]["num_sequences"] / base["process_s"]) / workers
                if base and name.startswith("ray")
                else float("nan")
            )
            st = r["this_run"]["stage_s"]
            lines.append(
                f"{name:<14} {r['stats']['num_rows']:>9} {secs:>8.1f} {n / secs:>9.0f} {scaling:>8.2f} "
                f"{r['this_run']['peak_rss_mib']:>10.0f}  {st['startup']:.1f} {st['map']:.1f} {st['plan']:.2f} "
                f"{st['place']:.1f} {st['write']:.1f}"
            )
        s = results["local"]["stats"]
        same = len({json.dumps(d) for d in digests.values()}) == 1
        lines.append(
            f"same shards (bytes) on every run: {same}; efficiency {s['efficiency']:.5f}, "
            f"{s['relative_gap']:.4%} over the lower bound; tokens accounted: "
            f"{all(r['tokens_accounted'] for r in results.values())}"
        )
        shutil.rmtree(tmp / "out", ignore_errors=True)
    return lines


def serial(tmp: Path) -> list[str]:
    from padless.export.stages import prefix_histograms
    from padless.planning.lengths import draw_lengths
    from padless.planning.slots import plan_histogram

    lines = [
        "",
        "serial parts on the driver (histogram of 1M lognormal lengths, median 60, scaled; rows of 1024;",
        "the driver's own code: shard histograms in a memory-mapped file, prefix sums, plan, hash)",
    ]
    base = np.bincount(
        np.minimum(draw_lengths("lognormal", 1_000_000, np.random.default_rng(0), ()), 1024), minlength=1025
    ).astype(np.int64)
    for total, shards in ((100_000_000, 1_526), (1_000_000_000, 15_259)):  # shards of 65,536 sequences
        hists = np.lib.format.open_memmap(tmp / "hist.npy", mode="w+", dtype=np.int64, shape=(shards, 1025))
        hists[:] = base * (total // 1_000_000) // shards
        t = time.perf_counter()
        merged = prefix_histograms(tmp, hists)
        merge_s = time.perf_counter() - t
        del hists
        t = time.perf_counter()
        plan = plan_histogram(merged, 1024)
        plan_s = time.perf_counter() - t
        t = time.perf_counter()
        plan.digest()
        digest_s = time.perf_counter() - t
        lines.append(
            f"{int(merged.sum()):>13,} lengths in {shards:>6} shards: merge {merge_s:.3f} s, plan {plan_s:.3f} s "
            f"({plan.num_rows:,} rows, {plan.stats().relative_gap:.5%} over the bound, {plan.band_size.size} "
            f"bands), hash {digest_s:.4f} s; driver peak RSS so far "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
        )
    import ray

    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.get(ray.remote(lambda: 1).remote())
    start_s = time.perf_counter() - t
    ray.shutdown()
    lines.append(f"Ray startup (ray.init with 2 CPUs + first task): {start_s:.1f} s")
    return lines


def dataset(rows: int, repeats: int) -> list[str]:
    import datasets
    import pyarrow as pa
    import trl
    from datasets import Dataset
    from datasets.table import InMemoryTable

    import padless

    datasets.disable_progress_bars()

    lines = ["", f"pack_dataset vs trl.pack_dataset vs pyarrow take, {rows:,} rows with labels, rows of 2048",
             "wall seconds (best of --repeats), and in brackets CPU seconds of this process (less sensitive to the",
             "load of a shared machine); ratios: trl / padless and padless / take",
             f"{'lengths':<10} {'padless s':>14} {'trl s':>14} {'take s':>14} {'vs trl':>14} {'vs take':>14} "
             f"{'rows padless':>12} {'rows trl':>9} {'bound':>8}"]  # fmt: skip
    rng = np.random.default_rng(0)
    mixes = {
        "uniform": rng.integers(10, 501, rows),
        "bimodal": np.where(rng.random(rows) < 0.8, rng.integers(10, 201, rows), rng.integers(1000, 2049, rows)),
    }
    for name, lengths in mixes.items():
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        values = pa.array(rng.integers(0, 50257, int(offsets[-1]), dtype=np.int32))
        ids = (
            pa.LargeListArray.from_arrays(pa.array(offsets), values)
            if offsets[-1] >= 2**31
            else pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
        )
        ds = Dataset(InMemoryTable(pa.table({"input_ids": ids, "labels": ids})))
        best: dict[str, float] = {}
        cpu: dict[str, float] = {}

        def timed(name: str, fn: Any) -> Any:
            t, c = time.perf_counter(), time.process_time()
            out = fn()
            best[name] = min(best.get(name, 1e9), time.perf_counter() - t)
            cpu[name] = min(cpu.get(name, 1e9), time.process_time() - c)
            return out

        for _ in range(repeats):  # side by side, `repeats` times; the best of each (wall and CPU apart)
            ours = timed("padless", lambda: padless.pack_dataset(ds, 2048))
            plan = padless.integrations.datasets.plan_lengths(lengths, 2048)
            taken = timed("take", lambda: ds.data.table.take(pa.array(plan.index)))
            theirs = timed("trl", lambda: trl.pack_dataset(ds, 2048))
        bound = -(-int(lengths.sum()) // 2048)
        assert taken.num_rows == rows

        def pair(a: float, b: float, fmt: str) -> str:
            return f"{a:{fmt}} [{b:{fmt}}]"

        lines.append(
            f"{name:<10} {pair(best['padless'], cpu['padless'], '.2f'):>14} {pair(best['trl'], cpu['trl'], '.2f'):>14} "
            f"{pair(best['take'], cpu['take'], '.2f'):>14} "
            f"{pair(best['trl'] / best['padless'], cpu['trl'] / cpu['padless'], '.1f'):>14} "
            f"{pair(best['padless'] / best['take'], cpu['padless'] / cpu['take'], '.2f'):>14} "
            f"{ours.num_rows:>12} {theirs.num_rows:>9} {bound:>8}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=("engines", "serial", "dataset"))
    parser.add_argument("--sequences", type=int, default=1_000_000, help="synthetic sequences (engines)")
    parser.add_argument("--texts", type=int, default=210_000, help="texts of the text corpus (engines)")
    parser.add_argument("--rows", type=int, default=300_000, help="dataset rows (dataset)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per tool, best kept (dataset)")
    args = parser.parse_args()
    parts = args.part or ["engines", "serial", "dataset"]
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory(prefix="padless-cluster-") as tmp:
        for part in parts:
            lines = {
                "engines": lambda: engines(Path(tmp), args.sequences, args.texts),
                "serial": lambda: serial(Path(tmp)),
                "dataset": lambda: dataset(args.rows, args.repeats),
            }[part]()
            print("\n".join(lines), flush=True)
    print(machine())


if __name__ == "__main__":
    main()
