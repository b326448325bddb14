"""How much a batch of these lengths would waste: the library behind ``padless stats`` and ``padless plan``.

Three ways to batch the same sequences, compared on lengths alone (no tokens are touched):

* pad to longest: the sequences shuffled (as a trainer's sampler feeds them), cut into batches of
  ``batch_size``, each padded to its longest sequence;
* bucketed: a length-grouped sampler (the same shuffle, then sorted by length inside chunks of many
  batches, cut into batches), as Hugging Face's ``group_by_length`` does, then pad to longest;
* packed: rows of ``max_length`` from :func:`padless.planning.plan.plan_packs`, fed ``batch_size``
  rows at a time, each batch as wide as its longest row (as :class:`padless.PackingCollator` feeds them).

Every way places the same tokens: the overlong policy of the plan applies to all three
(:func:`padless.planning.padding.placed_lengths`), and padding is measured by the one definition
:func:`padless.planning.padding.padding_fraction` that ``padless bench`` shares.
Lengths come from a file (:func:`load_lengths`), a built-in synthetic distribution
(:func:`synthetic_lengths`) or a real corpus (``padless.data.corpus_lengths``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from padless.planning.checks import check_choice, check_int
from padless.planning.padding import padded_tokens, padding_fraction, placed_lengths
from padless.planning.plan import PackPlan, validate_lengths

LENGTH_PARAMETERS: dict[str, dict[str, float]] = {
    "lognormal": {"median": 60.0, "sigma": 1.0, "cap": 2048.0},
    "uniform": {"low": 10.0, "high": 500.0},
}
"""The one set of synthetic length distributions: name -> its parameters, in order, with their defaults.

``lognormal``: short texts (tweets, chat turns, instructions): ``round(exp(N(log median, sigma)))``
clipped to ``[1, cap]``; median 60 tokens, mean ~99, a long right tail. ``uniform``: integers
``low..high``. These defaults stand behind the planner figures of the README and ``benchmarks/
planners.py``; ``padless pack --synthetic`` (:class:`padless.data.synthetic.SyntheticTokens`) draws
from the same generator, so a distribution name means the same lengths everywhere."""


def draw_lengths(name: str, num: int, rng: np.random.Generator, params: Sequence[float] = ()) -> np.ndarray:
    """The one generator of synthetic lengths: int64 ``[num]`` from distribution ``name``
    (:data:`LENGTH_PARAMETERS`), ``params`` replacing its defaults in order; every length ``>= 1``."""
    check_choice(name, LENGTH_PARAMETERS, "distribution")
    defaults = tuple(LENGTH_PARAMETERS[name].values())
    if len(params) > len(defaults):
        raise ValueError(
            f"{name} takes at most {len(defaults)} parameters ({', '.join(LENGTH_PARAMETERS[name])}), got {len(params)}"
        )
    p = (*params, *defaults[len(params) :])
    if name == "lognormal":
        median, sigma, cap = p
        if median <= 0 or sigma < 0 or cap < 1:
            raise ValueError(f"lognormal needs median > 0, sigma >= 0 and cap >= 1, got {median}, {sigma}, {cap}")
        return np.clip(np.round(np.exp(rng.normal(np.log(median), sigma, num))), 1, cap).astype(np.int64)
    low, high = p
    if low != int(low) or high != int(high) or not 1 <= low <= high:
        raise ValueError(f"uniform needs integers 1 <= low <= high, got {low}, {high}")
    return rng.integers(int(low), int(high) + 1, num).astype(np.int64)


def _describe(name: str) -> str:
    p = LENGTH_PARAMETERS[name]
    if name == "lognormal":
        return f"lognormal, median {p['median']:g} tokens, sigma {p['sigma']:g}, capped at {p['cap']:g}"
    return f"uniform integers {p['low']:g}..{p['high']:g}"


DISTRIBUTIONS: dict[str, tuple[Callable[[int, np.random.Generator], np.ndarray], str]] = {
    name: (lambda num, rng, name=name: draw_lengths(name, num, rng), _describe(name)) for name in LENGTH_PARAMETERS
}
"""name -> (``sampler(num, rng)`` with the default parameters, description)."""


def synthetic_lengths(name: str = "lognormal", num: int = 100_000, seed: int = 0) -> np.ndarray:
    """int64 ``[num]`` lengths drawn from a built-in distribution (:func:`draw_lengths`, defaults)."""
    return draw_lengths(name, num, np.random.default_rng(seed))


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
        count=int(arr.size),
        total=int(arr.sum()),
        min=int(arr.min()),
        median=median,
        mean=float(arr.mean()),
        p90=p90,
        p99=p99,
        max=int(arr.max()),
    )


def _check_batch(batch_size: int, pad_to_multiple_of: int | None) -> None:
    check_int(batch_size, "batch_size")
    if pad_to_multiple_of is not None:
        check_int(pad_to_multiple_of, "pad_to_multiple_of")


def padding_fraction_pad_to_longest(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    *,
    pad_to_multiple_of: int | None = None,
    seed: int | None = None,
) -> float:
    """Share of computed tokens that are padding when consecutive batches pad to their longest: in the
    given order, or with ``seed`` shuffled first as a trainer's sampler would, the shuffle
    :func:`padding_fraction_bucketed` starts from with the same seed (compare the two that way: a file
    sorted by length is already bucketed in its own order)."""
    arr = validate_lengths(lengths)
    _check_batch(batch_size, pad_to_multiple_of)
    if seed is not None:
        arr = arr[np.random.default_rng(seed).permutation(arr.size)]
    return padding_fraction(int(arr.sum()), padded_tokens(arr, batch_size, pad_to_multiple_of)) or 0.0


def group_by_length(lengths: np.ndarray, order: np.ndarray, chunk: int) -> np.ndarray:
    """The one length-grouping step (bucketing): ``order`` (indices into ``lengths``) with each run of
    ``chunk`` consecutive entries sorted by length, longest first; equal lengths keep their order
    in ``order``. :class:`padless.batching.samplers.LengthGroupedBatchSampler` and
    :func:`bucketed_order` both group through it."""
    chunk_id = np.arange(order.size) // chunk
    # sort by (chunk, -length); lexsort is stable, so ties keep the given (shuffled) order
    return order[np.lexsort((-lengths[order], chunk_id))]


def bucketed_order(
    lengths: np.ndarray, batch_size: int, seed: int = 0, mega_batch_mult: int | None = None
) -> np.ndarray:
    """A length-grouped sampling order: shuffle, then sort by length (longest first) inside chunks of
    ``mega_batch_mult * batch_size``; by default ``min(n // (4 * batch_size), 50)`` batches per chunk,
    at least 1, as in Hugging Face's ``LengthGroupedSampler``."""
    n = lengths.size
    mult = mega_batch_mult or max(min(n // (4 * batch_size), 50), 1)
    return group_by_length(lengths, np.random.default_rng(seed).permutation(n), mult * batch_size)


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
    computed = padded_tokens(
        arr[bucketed_order(arr, batch_size, seed, mega_batch_mult)], batch_size, pad_to_multiple_of
    )
    return padding_fraction(int(arr.sum()), computed) or 0.0


def compare_batching(
    lengths: np.ndarray,
    plan: PackPlan,
    batch_size: int,
    seed: int = 0,
    pad_to_multiple_of: int | None = None,
    *,
    overlong: str = "truncate",
) -> dict[str, dict[str, float | int]]:
    """Padding fraction and tokens computed for pad-to-longest, bucketed and the packed ``plan``, each
    ``{"padding_fraction", "tokens_computed"}``; ``plan`` must come from ``lengths`` under ``overlong``
    (its policy is applied to the padding baselines too, so all three place the same tokens).

    Pad-to-longest and bucketing start from the same shuffle (``seed``): bucketing only re-orders
    inside chunks of whole batches, so it pads no more than pad-to-longest except where a chunk's last,
    smaller batch is concerned. The plan's rows go ``batch_size`` to a batch as wide as its longest row."""
    _check_batch(batch_size, pad_to_multiple_of)
    units = placed_lengths(validate_lengths(lengths), plan.max_length, overlong)
    real = int(units.sum())
    if real != plan.stats.real_tokens:
        raise ValueError(
            f"plan places {plan.stats.real_tokens:,} tokens but overlong={overlong!r} leaves {real:,} of these "
            "lengths: plan them with the same policy"
        )
    shuffled = units[np.random.default_rng(seed).permutation(units.size)]  # bucketed_order's own shuffle
    computed = {
        "pad_to_longest": padded_tokens(shuffled, batch_size, pad_to_multiple_of),
        "bucketed": padded_tokens(units[bucketed_order(units, batch_size, seed)], batch_size, pad_to_multiple_of),
        "packed": padded_tokens(plan.row_lengths, batch_size, pad_to_multiple_of),
    }
    return {
        name: {"padding_fraction": padding_fraction(real, tokens) or 0.0, "tokens_computed": tokens}
        for name, tokens in computed.items()
    }


def load_lengths(path: str | Path) -> np.ndarray:
    """Lengths from ``.npy``, ``.txt`` (one per line; blank lines skipped) or ``.json`` (a list).
    A bad file raises ``ValueError`` naming ``path``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r}: no such file")
    arr = _read_lengths(path)
    if arr.size == 0:
        raise ValueError(f"{path} holds no lengths")
    return arr


def _read_lengths(path: Path) -> np.ndarray:
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            raise ValueError(f"{path} is not a readable .npy array of lengths ({err})") from None
        return validate_lengths(arr)
    if suffix == ".txt":
        values = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    values.append(int(line))
                except ValueError:
                    raise ValueError(f"{path}: line {number}: {line.strip()!r} is not an integer") from None
        return validate_lengths(_int64(values, path))
    if suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of lengths, got {type(data).__name__}")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in data):
            raise ValueError(f"{path}: every length must be an integer")
        return validate_lengths(_int64(data, path))
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .npy, .txt or .json")


def _int64(values: list[int], path: Path) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        raise ValueError(f"{path}: a length does not fit in 64 bits") from None


def overlong_costs(lengths: Sequence[int] | np.ndarray, max_length: int) -> dict[str, dict[str, int]]:
    """What each overlong policy would do to the sequences longer than ``max_length``.

    ``{"overlong": {sequences, tokens}}`` (the sequences over the limit and their tokens past it) and per
    policy: ``error`` stops at the first one; ``truncate`` loses the tokens past the limit; ``split``
    keeps every token in ``pieces`` pieces of at most ``max_length``; ``drop`` loses whole sequences.
    """
    arr = validate_lengths(lengths)
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    over = arr[arr > max_length]
    n, past = int(over.size), int((over - max_length).sum())
    return {
        "overlong": {"sequences": n, "tokens": past},
        "error": {"sequences": n, "stops": int(n > 0)},
        "truncate": {"sequences": n, "tokens_lost": past},
        "split": {"sequences": n, "pieces": int((-(-over // max_length)).sum()), "tokens_lost": 0},
        "drop": {"sequences": n, "tokens_lost": int(over.sum())},
    }
