"""How much a batch of these lengths would waste: the library behind ``padless stats`` and ``padless plan``.

Three ways to batch the same sequences, compared on lengths alone (no tokens are touched):

* pad to longest: consecutive batches of ``batch_size``, each padded to its longest sequence;
* bucketed: a length-grouped sampler (shuffle, sort by length inside chunks of many batches, cut
  into batches), as Hugging Face's ``group_by_length`` does, then pad to longest;
* packed: rows of ``max_length`` from :func:`padless.plan.plan_packs`.

The padding baselines truncate at ``max_length``, as a padding collator with that limit would.
Lengths come from a file (``--lengths``), a built-in synthetic distribution (``--dist``) or a real
corpus (``--data``, via ``padless.data.corpus_lengths``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from padless._optional import require
from padless.plan import OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs, validate_lengths


def _lognormal(num: int, rng: np.random.Generator) -> np.ndarray:
    # Short texts (tweets, chat turns, instructions): median 60 tokens, a long right tail, capped.
    return np.clip(np.round(np.exp(rng.normal(np.log(60.0), 1.0, num))), 1, 2048).astype(np.int64)


def _uniform(num: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(10, 501, num).astype(np.int64)


# name -> (sampler(num, rng), description)
DISTRIBUTIONS: dict[str, tuple[Callable[[int, np.random.Generator], np.ndarray], str]] = {
    "lognormal": (_lognormal, "lognormal, median 60 tokens, sigma 1, capped at 2048"),
    "uniform": (_uniform, "uniform integers 10..500"),
}


def synthetic_lengths(name: str = "lognormal", num: int = 100_000, seed: int = 0) -> np.ndarray:
    """int64 ``[num]`` lengths drawn from a built-in distribution (``DISTRIBUTIONS``)."""
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {name!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[name][0](num, np.random.default_rng(seed))


@dataclass(frozen=True)
class LengthSummary:
    """The shape of a length distribution, in tokens."""

    count: int
    """Number of sequences."""
    total: int
    """Sum of lengths."""
    min: int
    median: float
    mean: float
    p90: float
    """90th percentile."""
    p99: float
    """99th percentile."""
    max: int

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


def summarize_lengths(lengths: Sequence[int] | np.ndarray) -> LengthSummary:
    """Count, total and order statistics of ``lengths`` (raises on an empty list)."""
    arr = validate_lengths(lengths)
    if arr.size == 0:
        raise ValueError("no lengths to summarize")
    median, p90, p99 = np.percentile(arr, [50, 90, 99]).tolist()
    return LengthSummary(
        count=int(arr.size), total=int(arr.sum()), min=int(arr.min()), median=median,
        mean=float(arr.mean()), p90=p90, p99=p99, max=int(arr.max()),
    )  # fmt: skip


def _check_batch(batch_size: int, pad_to_multiple_of: int | None) -> None:
    for name, value in (("batch_size", batch_size), ("pad_to_multiple_of", pad_to_multiple_of)):
        if value is None and name == "pad_to_multiple_of":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def padded_tokens(lengths: np.ndarray, batch_size: int, pad_to_multiple_of: int | None = None) -> int:
    """Tokens computed when consecutive batches of ``lengths`` are each padded to their longest."""
    n = lengths.size
    if n == 0:
        return 0
    starts = np.arange(0, n, batch_size)
    longest = np.maximum.reduceat(lengths, starts)
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    sizes = np.diff(np.append(starts, n))  # the last batch may be smaller
    return int((longest * sizes).sum())


def padding_fraction_pad_to_longest(
    lengths: Sequence[int] | np.ndarray, batch_size: int, *, pad_to_multiple_of: int | None = None
) -> float:
    """Share of computed tokens that are padding when consecutive batches pad to their longest."""
    arr = validate_lengths(lengths)
    _check_batch(batch_size, pad_to_multiple_of)
    computed = padded_tokens(arr, batch_size, pad_to_multiple_of)
    return 1.0 - int(arr.sum()) / computed if computed else 0.0


def bucketed_order(lengths: np.ndarray, batch_size: int, seed: int = 0, mega_batch_mult: int | None = None) -> np.ndarray:
    """A length-grouped sampling order: shuffle, then sort by length (longest first) inside chunks of
    ``mega_batch_mult * batch_size``; by default ``min(n // (4 * batch_size), 50)`` batches per chunk,
    at least 1, as in Hugging Face's ``LengthGroupedSampler``."""
    n = lengths.size
    mult = mega_batch_mult or max(min(n // (4 * batch_size), 50), 1)
    chunk = mult * batch_size
    perm = np.random.default_rng(seed).permutation(n)
    chunk_id = np.arange(n) // chunk
    # sort by (chunk, -length), keeping the shuffled order between equal lengths
    return perm[np.lexsort((-lengths[perm], chunk_id))]


def padding_fraction_bucketed(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    seed: int = 0,
    *,
    mega_batch_mult: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> float:
    """Share of computed tokens that are padding under :func:`bucketed_order` with pad to longest."""
    arr = validate_lengths(lengths)
    _check_batch(batch_size, pad_to_multiple_of)
    computed = padded_tokens(arr[bucketed_order(arr, batch_size, seed, mega_batch_mult)], batch_size, pad_to_multiple_of)
    return 1.0 - int(arr.sum()) / computed if computed else 0.0


def compare_batching(
    lengths: np.ndarray, plan: PackPlan, batch_size: int, seed: int = 0, pad_to_multiple_of: int | None = None
) -> dict[str, dict[str, float | int]]:
    """Padding fraction and tokens computed for pad-to-longest, bucketed and the packed ``plan``."""
    clipped = np.minimum(validate_lengths(lengths), plan.max_length)
    real = int(clipped.sum())
    computed = {
        "pad_to_longest": padded_tokens(clipped, batch_size, pad_to_multiple_of),
        "bucketed": padded_tokens(clipped[bucketed_order(clipped, batch_size, seed)], batch_size, pad_to_multiple_of),
    }
    out: dict[str, dict[str, float | int]] = {
        name: {"padding_fraction": 1.0 - real / tokens if tokens else 0.0, "tokens_computed": tokens}
        for name, tokens in computed.items()
    }
    out["packed"] = {"padding_fraction": plan.stats.padding_fraction, "tokens_computed": plan.stats.capacity_tokens}
    return out


# ------------------------------------------------------------------------------------------ CLI


def load_lengths(path: str | Path) -> np.ndarray:
    """Lengths from ``.npy``, ``.txt`` (one per line; blank lines skipped) or ``.json`` (a list)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--lengths: no such file: {path}")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return validate_lengths(np.load(path, allow_pickle=False))
    if suffix == ".txt":
        values = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    values.append(int(line))
                except ValueError:
                    raise ValueError(f"--lengths {path}: line {number}: {line.strip()!r} is not an integer") from None
        return validate_lengths(np.asarray(values, dtype=np.int64))
    if suffix == ".json":
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise ValueError(f"--lengths {path}: expected a JSON list of lengths, got {type(data).__name__}")
        return validate_lengths(np.asarray(data))
    raise ValueError(f"--lengths {path}: unsupported file type {suffix!r}; use .npy, .txt or .json")


def _input_lengths(args: argparse.Namespace) -> tuple[np.ndarray, str]:
    """The lengths the flags ask for, and a short description of where they came from."""
    if args.lengths:
        return load_lengths(args.lengths), f"file {Path(args.lengths).name}"
    if args.data:
        try:
            from padless.data import corpus_lengths
        except ImportError as exc:
            raise ValueError(f"--data needs padless.data.corpus_lengths, which is not available: {exc}") from None
        return validate_lengths(corpus_lengths(args.data)), f"corpus {args.data}"
    if args.num < 1:
        raise ValueError(f"--num must be >= 1, got {args.num}")
    return synthetic_lengths(args.dist, args.num, args.seed), f"{DISTRIBUTIONS[args.dist][1]}, seed {args.seed}"


def _add_common(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--lengths", metavar="FILE", help="lengths file: .npy, .txt (one per line) or .json list")
    src.add_argument("--dist", choices=list(DISTRIBUTIONS), default="lognormal",
                     help="synthetic distribution (default: lognormal)")  # fmt: skip
    src.add_argument("--data", metavar="CORPUS", help="a real corpus, via padless.data.corpus_lengths")
    parser.add_argument("--num", type=int, default=100_000, help="draws from --dist (default: 100000)")
    parser.add_argument("--seed", type=int, default=0, help="seed for --dist, bucketing and histogram_best_fit")
    parser.add_argument("--max-length", type=int, default=2048, help="row capacity in tokens (default: 2048)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="best_fit_decreasing", help="packing strategy")
    parser.add_argument("--overlong", choices=OVERLONG_POLICIES, default="error", help="sequences over --max-length")
    parser.add_argument("--max-per-row", type=int, default=None, help="cap on documents per row")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")


def _plan(args: argparse.Namespace, lengths: np.ndarray) -> PackPlan:
    for flag in ("max_length", "max_per_row"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    return plan_packs(
        lengths, args.max_length, strategy=args.strategy, overlong=args.overlong,
        max_per_row=args.max_per_row, seed=args.seed,
    )  # fmt: skip


def _describe(source: str, summary: LengthSummary, plan: PackPlan, args: argparse.Namespace) -> list[str]:
    s = plan.stats
    return [
        f"lengths: {source}",
        f"  {summary.count:,} sequences, {summary.total:,} tokens; min {summary.min}, median {summary.median:g}, "
        f"mean {summary.mean:.1f}, p90 {summary.p90:g}, p99 {summary.p99:g}, max {summary.max}",
        f"plan: {args.strategy}, max_length {plan.max_length}, overlong {args.overlong}"
        + (f", max {args.max_per_row} per row" if args.max_per_row else ""),
        f"  {s.num_rows:,} rows (lower bound {s.lower_bound:,}, gap {s.gap_to_lower_bound:,} = {100 * s.relative_gap:.3f}%), "
        f"efficiency {100 * s.efficiency:.3f}%, documents per row {s.mean_per_row:.1f} mean / {s.max_per_row} max",
        f"  truncated {s.truncated_sequences:,} ({s.truncated_tokens:,} tokens), split {s.split_sequences:,}, "
        f"dropped {s.dropped_sequences:,} ({s.dropped_tokens:,} tokens)",
    ]


def _histogram(lengths: np.ndarray, max_length: int, path: str, title: str) -> None:
    Figure = require("matplotlib.figure", "a lengths histogram").Figure  # no pyplot: renders with Agg, no global state

    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    lo, hi = int(lengths.min()), int(lengths.max())
    width = -(-(hi - lo + 1) // 100)  # whole tokens per bin, so no bin holds more integers than another
    ax.hist(lengths, bins=np.arange(lo, hi + width + 1, width) - 0.5, color="#4c72b0")
    ax.axvline(max_length, color="#c44e52", linestyle="--", label=f"max_length {max_length}")
    ax.axvline(float(np.median(lengths)), color="#55a868", label=f"median {np.median(lengths):g}")
    ax.set(xlabel="tokens per sequence", ylabel="sequences")
    ax.set_title(f"{lengths.size:,} sequences: {title}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_stats_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    parser.add_argument("--batch-size", type=int, default=8, help="batch size of the padding baselines (default: 8)")
    parser.add_argument("--pad-to-multiple-of", type=int, default=None, help="round padded batches up to a multiple")
    parser.add_argument("--hist", metavar="PNG", help="also draw a length histogram to this file")


def run_stats(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.pad_to_multiple_of is not None and args.pad_to_multiple_of < 1:
        raise ValueError(f"--pad-to-multiple-of must be >= 1, got {args.pad_to_multiple_of}")
    lengths, source = _input_lengths(args)
    summary = summarize_lengths(lengths)
    plan = _plan(args, lengths)
    batching = compare_batching(lengths, plan, args.batch_size, args.seed, args.pad_to_multiple_of)
    if args.hist:
        _histogram(lengths, args.max_length, args.hist, source)
    if args.json:
        doc: dict[str, Any] = {
            "source": source, "batch_size": args.batch_size, "lengths": summary.as_dict(),
            "plan": {"strategy": args.strategy, "max_length": args.max_length, **plan.stats.as_dict()},
            "batching": batching,
        }  # fmt: skip
        print(json.dumps(doc, indent=2))
        return 0
    lines = _describe(source, summary, plan, args)
    packed = batching["packed"]["tokens_computed"]
    lines.append(f"batching at batch size {args.batch_size} (padding baselines truncate at {args.max_length}):")
    lines.append(f"  {'':<30}{'padding':>9}{'tokens computed':>18}{'vs packed':>11}")
    for name, label in (("pad_to_longest", "pad to longest"), ("bucketed", "bucketed (length-grouped)"),
                        ("packed", f"packed ({args.strategy})")):  # fmt: skip
        row = batching[name]
        ratio = f"{row['tokens_computed'] / packed:.2f}x" if packed else "-"
        lines.append(f"  {label:<30}{100 * row['padding_fraction']:>8.2f}%{row['tokens_computed']:>18,}{ratio:>11}")
    if args.hist:
        lines.append(f"histogram: {args.hist}")
    print("\n".join(lines))
    return 0


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    parser.add_argument("--out", metavar="FILE.npz", required=True, help="where to write the plan's arrays")


def run_plan(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix != ".npz":
        raise ValueError(f"--out must end in .npz, got {out}")
    lengths, source = _input_lengths(args)
    plan = _plan(args, lengths)
    out.parent.mkdir(parents=True, exist_ok=True)
    plan.save(str(out))
    if args.json:
        print(json.dumps({"source": source, "out": str(out), "strategy": args.strategy, **plan.stats.as_dict()}, indent=2))
    else:
        print("\n".join([*_describe(source, summarize_lengths(lengths), plan, args), f"wrote {out}"]))
    return 0
