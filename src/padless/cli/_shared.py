"""Helpers that more than one ``padless`` subcommand uses (one home, so the subcommands cannot drift):
``--help`` text from docstrings (:func:`plain`) with every default shown (:class:`HelpFormatter`),
bounded integer flags (:func:`int_in`), library messages in the words of the command line
(:func:`as_flags`), the tokenizing flags of every subcommand that reads text or chats and the lines
that say what they chose (:func:`add_data_arguments`, :func:`tokenizer_choice`, :func:`system_prompt_line`,
:func:`overlong_line`; the records' form: :mod:`padless.cli._formats`), the lengths flags and the
plan description of ``padless stats`` and ``padless plan`` (:func:`add_lengths_arguments`,
:func:`input_lengths`, :func:`plan_from_args`, :func:`describe_lengths`, :func:`describe_plan`), and
the summary that ``padless bench`` and ``padless report`` print after writing a report
(:func:`report_lines`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from padless.cli._formats import (
    add_record_arguments,
    columns_of,
    data_kind,
    format_line,
    skipped_lines,
    train_on_choice,
)

if TYPE_CHECKING:
    import numpy as np

    from padless.bench.results import BenchResults
    from padless.planning.lengths import LengthSummary
    from padless.planning.plan import PackPlan


def plain(text: str | None) -> str | None:
    """``text`` without Sphinx markup, for ``--help``: ``:func:`x``` -> ``x``, double backticks -> none."""
    if text is None:
        return None
    text = re.sub(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)  # :role:`target` / :role:`text <t>`
    return text.replace("``", "")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with every default shown as ``(default: X)``, unless the help already says its
    default (``default: ...`` in words, for a default of None) or the flag has none to show (a switch,
    a required flag)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "%(default)" in text
            or "default:" in text
            or action.required
            or action.nargs == 0
            or action.default is None
            or action.default == argparse.SUPPRESS
        ):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


INT_MAX = 2**31 - 1
"""Largest count a flag takes: token ids, lengths and counts are stored as int32."""


def int_in(low: int, high: int = INT_MAX) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, high]``, else argparse's one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high:,}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


def as_flags(message: str, names: Iterable[str] | Mapping[str, str]) -> str:
    """A library message in the words of the command line: ``max_length=5`` -> ``--max-length 5``
    (``names``: argument names, or a mapping argument -> flag such as ``{"input": "INPUT"}``)."""
    flags = dict(names) if isinstance(names, Mapping) else {n: f"--{n.replace('_', '-')}" for n in names}
    for name in sorted(flags, key=len, reverse=True):
        start = r"(?<![\w/.-])"  # a whole word, not the end of a path such as /tmp/out
        message = re.sub(rf"{start}{name}=", f"{flags[name]} ", message)
        message = re.sub(rf"{start}{name}(?= (must|is|needs|holds)\b| \d)", flags[name], message)
    return message


def plural(n: int, word: str) -> str:
    """``1 row``, ``2 rows``, ``1,024 rows``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


TOKENIZER_DEFAULT = "gpt2"
"""The tokenizer without ``--tokenizer`` or ``--model``."""
TRAIN_ON_AUTO = "auto"
"""``--train-on auto``: assistant turns for chats, every token for text."""
SYSTEM_PROMPT_DEFAULT = "template"
"""``--system-prompt``: keep what the chat template adds, as :mod:`padless.data` does by default."""
_SAME_TOKENIZER = {"smollm2": "smollm2-135m"}  # one name per packaged tokenizer, so a resume sees one key


def add_data_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """How the text and chats of ``what`` (``INPUT``, ``--data``) are tokenized: ``--tokenizer``,
    ``--model`` (implies its tokenizer), ``--train-on``, ``--system-prompt``."""
    from padless.data.chat import SYSTEM_PROMPT, TRAIN_ON

    group = parser.add_argument_group(f"tokenizing {what} (text and chats)")
    group.add_argument(
        "--tokenizer",
        metavar="NAME",
        default=None,
        help="gpt2, smollm2-135m, or a transformers tokenizer name or folder (default: the "
        f"tokenizer of --model, else {TOKENIZER_DEFAULT})",
    )
    group.add_argument(
        "--model",
        metavar="NAME",
        default=None,
        help="the model the data is for: use its own tokenizer (smollm2-135m, a GPT-2 size, a "
        "transformers name or folder; default: none, --tokenizer decides)",
    )
    group.add_argument(
        "--train-on",
        choices=(TRAIN_ON_AUTO, *TRAIN_ON),
        default=TRAIN_ON_AUTO,
        help="the tokens of a chat that are trained: auto is assistant for chats ('messages') and all for text",
    )
    group.add_argument(
        "--system-prompt",
        choices=SYSTEM_PROMPT,
        default=SYSTEM_PROMPT_DEFAULT,
        help="template: a chat without a system message gets the one its chat template adds (SmolLM2's "
        "adds a default system prompt); none: only the chat's own messages",
    )
    add_record_arguments(group)


def tokenizer_choice(args: argparse.Namespace) -> tuple[str, str]:
    """``(tokenizer name, where the choice came from)`` from ``--tokenizer`` and ``--model``; the two
    must agree when both are given (``--model`` only picks the tokenizer)."""
    from padless.models.factory import check_model_name, tokenizer_name_for

    implied = None
    if args.model is not None:
        if not args.model.strip():
            raise ValueError("--model needs a model name, got ''")
        try:
            check_model_name(args.model)  # an unknown model is named as a model, not as its tokenizer
            implied = tokenizer_name_for(args.model)
        except ValueError as exc:
            raise ValueError(f"--model {args.model}: {as_flags(str(exc), ['processor'])}") from None
        implied = _SAME_TOKENIZER.get(implied, implied)
    if args.tokenizer is not None:
        if not args.tokenizer.strip():
            raise ValueError("--tokenizer needs a tokenizer name or folder, got ''")
        name = _SAME_TOKENIZER.get(args.tokenizer, args.tokenizer)
        if implied is not None and name != implied:
            raise ValueError(
                f"--tokenizer {args.tokenizer} is not the tokenizer of --model {args.model} ({implied}); "
                "pass one of them"
            )
        return name, "--tokenizer"
    if implied is not None:
        return implied, f"the tokenizer of --model {args.model}"
    return TOKENIZER_DEFAULT, "the default; pass --tokenizer or --model for your model's"


def load_named_tokenizer(name: str, origin: str) -> tuple[Any, str]:
    """The tokenizer ``name`` and the line that says which one is used: ``tokenizer: NAME, vocab N (ORIGIN)``."""
    from padless.data.tokenizer import load_tokenizer

    tok = load_tokenizer(name)
    return tok, f"tokenizer: {name}, vocab {len(tok):,} ({origin})"


def system_prompt_line(added: int, chats: int | None = None) -> str | None:
    """``system prompt added to N chats ...`` when the chat template added one to any chat."""
    if not added:
        return None
    of = f" of {chats:,}" if chats else ""
    return (
        f"system prompt added to {added:,}{of} chats by the tokenizer's chat template (they have no system "
        "message; --system-prompt none leaves it out)"
    )


def overlong_line(policy: str, max_length: int, over: int | None = None) -> str:
    """``overlong: POLICY (...)``, what happens to sequences over ``--max-length``; ``over``: how many
    there are, where known."""
    from padless.planning.plan import OVERLONG_POLICIES

    others = "|".join(p for p in OVERLONG_POLICIES if p != policy)
    if over is None:
        what = {
            "error": "the first sequence over --max-length {m} stops with an error",
            "truncate": "a sequence over --max-length {m} keeps its first {m} tokens",
            "split": "a sequence over --max-length {m} is cut into pieces of {m}",
            "drop": "a sequence over --max-length {m} is left out",
        }[policy].format(m=max_length)
    else:
        what = f"{plural(over, 'sequence')} over --max-length {max_length}"
    return f"overlong: {policy} ({what}; pass --overlong {others})"


@dataclass
class InputLengths:
    """The lengths :func:`input_lengths` found, and what it says about them."""

    lengths: np.ndarray
    """``[n]`` int64 sequence lengths."""
    source: str
    """Where they came from, in a few words."""
    notes: list[str] = field(default_factory=list)
    """Lines printed before the lengths: the tokenizer, what is trained, the system prompt."""
    data: dict[str, Any] = field(default_factory=dict)
    """The same for ``--json`` (empty unless ``--data``)."""
    name_example: Callable[[int], str] | None = None
    """``--data``: where sequence ``i`` (from 0) comes from, ``"d.jsonl, line 7"``."""


_DATA_FLAGS = (
    ("tokenizer", None, "--tokenizer"),
    ("model", None, "--model"),
    ("train_on", TRAIN_ON_AUTO, "--train-on"),
    ("system_prompt", SYSTEM_PROMPT_DEFAULT, "--system-prompt"),
    ("columns", None, "--columns"),
    ("on_error", "raise", "--on-error"),
)


def data_flags_given(args: argparse.Namespace) -> list[str]:
    """The flags of :func:`add_data_arguments` given other values than their defaults."""
    return [flag for name, default, flag in _DATA_FLAGS if getattr(args, name) != default]


def input_lengths(args: argparse.Namespace, *, default_dist: str | None = "lognormal") -> InputLengths:
    """The lengths the flags of :func:`add_lengths_arguments` ask for. Without ``--lengths``,
    ``--data`` or ``--dist``: ``default_dist``, or an error when that is None. ``--data`` is tokenized
    as :func:`add_data_arguments` says (by :func:`padless.data.load_corpus`, cached)."""
    from padless.planning.lengths import DISTRIBUTIONS, load_lengths, synthetic_lengths

    if args.data is None:
        if given := data_flags_given(args):
            raise ValueError(
                f"{' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --data (the data to "
                "tokenize), not to --lengths or --dist"
            )
    if args.lengths is not None:
        if not args.lengths.strip():
            raise ValueError("--lengths needs a file name, got ''")
        try:
            return InputLengths(load_lengths(args.lengths), f"file {Path(args.lengths).name}")
        except ValueError as exc:
            raise ValueError(f"--lengths: {exc}") from None
    if args.data is not None:
        return _data_lengths(args)
    dist = args.dist or default_dist
    if dist is None:
        raise ValueError(
            "no lengths given: pass --lengths FILE, --data CORPUS or --dist "
            f"{'|'.join(DISTRIBUTIONS)} (with --num and --seed)"
        )
    return InputLengths(synthetic_lengths(dist, args.num, args.seed), f"{DISTRIBUTIONS[dist][1]}, seed {args.seed}")


def _data_lengths(args: argparse.Namespace) -> InputLengths:
    from padless.planning.plan import validate_lengths

    try:
        from padless.data.load import load_corpus
    except ImportError as exc:
        raise ValueError(f"--data needs padless.data.load_corpus, which is not available: {exc}") from None

    name = args.data
    if not name.strip():
        raise ValueError("--data needs a corpus name or a data file, got ''")
    tok_name, origin = tokenizer_choice(args)
    columns = columns_of(args)
    kind = data_kind(name, columns)
    train_on, train_line = train_on_choice(args.train_on, kind, name)
    tok, tok_line = load_named_tokenizer(tok_name, origin)
    try:
        corpus = load_corpus(
            name, tok, train_on=train_on, system_prompt=args.system_prompt, columns=columns,  # type: ignore[arg-type]
            on_error=args.on_error,  # type: ignore[arg-type]
        )  # fmt: skip
    except ValueError as exc:
        message = as_flags(str(exc), ["train_on", "system_prompt"])
        if name not in message:  # "line 3: ..." -> "f.jsonl, line 3: ...", as padless pack names a record
            message = f"{name}, {message}" if message.startswith(("line ", "record ")) else f"--data {name}: {message}"
        raise ValueError(message) from None
    report = corpus.report
    added = report.system_prompt_added
    forms = list(report.formats)
    notes = [tok_line, *([format_line(forms[0], columns)] if len(forms) == 1 else [report.format_line()])]
    if train_line is not None:
        trained = f"; {report.trained_tokens:,} of {report.tokens:,} tokens trained" if kind != "input_ids" else ""
        notes.append(train_line + trained)
    if (line := system_prompt_line(added, report.kept)) is not None:
        notes.append(line)
    notes += skipped_lines(report.skipped, report.first_skipped, report.read)
    data = {"tokenizer": tok_name, "vocab_size": len(tok), "kind": kind, "train_on": train_on,
            "system_prompt": args.system_prompt, "system_prompt_added": added, "tokens": report.tokens,
            "trained_tokens": report.trained_tokens, "formats": report.formats, "skipped": report.skipped,
            "first_skipped": report.first_skipped}  # fmt: skip
    where = "file" if Path(name).expanduser().exists() else "corpus"
    found = InputLengths(validate_lengths(corpus.lengths), f"{where} {name}", notes, data)
    found.name_example = corpus.where
    return found


def strategy_flag(text: str) -> str:
    """``--strategy``: the name given, or for a deprecated one the strategy it plans as, after one line on
    stderr saying so (a ``DeprecationWarning`` would not show: Python hides them outside ``__main__``)."""
    from padless.planning.plan import DEPRECATED_STRATEGIES

    if (instead := DEPRECATED_STRATEGIES.get(text)) is None:
        return text
    message = f"--strategy {text} is deprecated: it plans as {instead}; pass --strategy {instead}"
    print(f"padless: warning: {message}", file=sys.stderr)
    return instead


def add_lengths_arguments(parser: argparse.ArgumentParser, *, default_dist: str | None = None) -> None:
    """Flags of ``padless stats`` and ``padless plan``: where the lengths come from, how ``--data`` is
    tokenized, and how to plan them (``default_dist``: the lengths without a source flag)."""
    from padless.planning.checks import OVERLONG_DEFAULT
    from padless.planning.lengths import DISTRIBUTIONS
    from padless.planning.plan import DEPRECATED_STRATEGIES, OVERLONG_POLICIES, STRATEGIES

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--lengths", metavar="FILE", help="lengths file: .npy, .txt (one per line) or .json list")
    src.add_argument(
        "--dist",
        choices=list(DISTRIBUTIONS),
        default=None,
        help="synthetic distribution"
        + (f" (default: {default_dist}, without --lengths or --data)" if default_dist else ""),
    )
    src.add_argument(
        "--data",
        metavar="DATA",
        help="a data file (.jsonl, .json, .csv, .tsv, .parquet with 'text', 'messages' or 'input_ids'), "
        "a datasets folder, or a built-in corpus (tweets, dialogues, toolcalls, agentic-rag)",
    )
    parser.add_argument("--num", type=int_in(1), default=100_000, help="draws from --dist")
    parser.add_argument("--seed", type=int_in(0), default=0, help="seed for --dist, bucketing and histogram_best_fit")
    parser.add_argument("--max-length", type=int_in(1), default=2048, help="row capacity in tokens")
    parser.add_argument(
        "--strategy",
        type=strategy_flag,
        choices=[s for s in STRATEGIES if s not in DEPRECATED_STRATEGIES],
        default="best_fit_decreasing",
        help="packing strategy",
    )
    parser.add_argument(
        "--overlong",
        choices=OVERLONG_POLICIES,
        default=OVERLONG_DEFAULT,
        help="what a sequence over --max-length does; one default with padless pack and the collators",
    )
    parser.add_argument("--max-per-row", type=int_in(1), default=None, help="cap on documents per row (default: none)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")
    add_data_arguments(parser, "--data")


def overlong_refusal(over: int, args: argparse.Namespace, first: str = "") -> ValueError | None:
    """The error for ``over`` sequences over ``--max-length`` under ``--overlong error``, else None;
    ``first``: where the first of them is (``"d.jsonl, line 7 (3,012 tokens)"``), said when known."""
    if not over or args.overlong != "error":
        return None
    said = f" (the first: {first})" if first else ""
    return ValueError(
        f"{over:,} sequence{'s are' if over != 1 else ' is'} over --max-length {args.max_length}{said} and "
        "--overlong is error (the default); pass --overlong truncate, split or drop to plan them, or a "
        "larger --max-length"
    )


def first_overlong(found: InputLengths, max_length: int) -> str:
    """Where the first sequence over ``max_length`` comes from and its length, for
    :func:`overlong_refusal` (``""`` when none is over or the lengths name no records)."""
    import numpy as np

    over = np.flatnonzero(found.lengths > max_length)
    if not over.size or found.name_example is None:
        return ""
    return f"{found.name_example(int(over[0]))}, {int(found.lengths[over[0]]):,} tokens"


def plan_from_args(args: argparse.Namespace, lengths: np.ndarray) -> PackPlan:
    """The plan the flags of :func:`add_lengths_arguments` ask for (sequences over ``--max-length``
    under ``--overlong error`` are refused with their count, as :func:`overlong_refusal` says)."""
    from padless.planning.plan import plan_packs

    if (refusal := overlong_refusal(int((lengths > args.max_length).sum()), args)) is not None:
        raise refusal
    return plan_packs(
        lengths,
        args.max_length,
        strategy=args.strategy,
        overlong=args.overlong,
        max_per_row=args.max_per_row,
        seed=args.seed,
    )


def describe_lengths(found: InputLengths, summary: LengthSummary) -> list[str]:
    """Lines describing the lengths and where they came from (``padless stats`` and ``padless plan``)."""
    return [
        *found.notes,
        f"lengths: {found.source}",
        f"  {plural(summary.count, 'sequence')}, {plural(summary.total, 'token')}; min {summary.min}, "
        f"median {summary.median:g}, mean {summary.mean:.1f}, p90 {summary.p90:g}, p99 {summary.p99:g}, "
        f"max {summary.max}",
    ]


def describe_plan(plan: PackPlan, args: argparse.Namespace) -> list[str]:
    """Lines describing the plan (``padless stats`` and ``padless plan``)."""
    s = plan.stats
    return [
        f"plan: {args.strategy}, max_length {plan.max_length}, overlong {args.overlong}"
        + (f", max {args.max_per_row} per row" if args.max_per_row else ""),
        f"  {plural(s.num_rows, 'row')} (lower bound {s.lower_bound:,}, gap {s.gap_to_lower_bound:,} = "
        f"{100 * s.relative_gap:.3f}%), "
        f"efficiency {100 * s.efficiency:.3f}%, documents per row {s.mean_per_row:.1f} mean / {s.max_per_row} max",
        f"  truncated {s.truncated_sequences:,} ({s.truncated_tokens:,} tokens), split {s.split_sequences:,}, "
        f"dropped {s.dropped_sequences:,} ({s.dropped_tokens:,} tokens)",
    ]


def report_lines(results: BenchResults, html: Path, extra: Iterable[str] = ()) -> list[str]:
    """What ``padless bench`` and ``padless report`` print after writing a report: the summary table,
    then where things are."""
    from padless.bench.report import format_summary_table

    return [format_summary_table(results), "", f"report:  {html}", *extra]
