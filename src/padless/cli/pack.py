"""``padless pack``: tokenize if needed and pack a dataset into Parquet shards of packed rows."""

from __future__ import annotations

from typing import Any

from padless.cli import as_flags, int_in
from padless.export.parquet import pack_to_parquet
from padless.export.sources import open_input
from padless.planning.buffered import StreamOptions

# library argument -> flag, for messages
FLAGS = {"input": "INPUT", "out": "--out", "synthetic": "--synthetic", "vocab_size": "--vocab-size",
         "max_length": "--max-length", "buffer_size": "--buffer-size", "overlong": "--overlong",
         "min_fill": "--min-fill", "rows_per_shard": "--rows-per-shard", "max_shards": "--max-shards",
         "max_delay": "--max-delay"}  # fmt: skip


def add_pack_arguments(parser: Any) -> None:
    """Flags of ``padless pack``."""
    d = StreamOptions(max_length=1)
    parser.description = (
        f"{parser.description}. Pre-tokenized input ('input_ids', optional 'labels') is packed as given in "
        "every format (.jsonl, .json, .csv, .tsv, .parquet): nothing is appended, and every id and label is "
        "checked against --vocab-size (default: the vocabulary of --tokenizer). Text and chats are tokenized "
        "with --tokenizer and end with its EOS. Ctrl-C keeps the finished shards: rerun to resume."
    )
    parser.add_argument("input", nargs="?", metavar="INPUT",
                        help="a .jsonl/.json/.csv/.tsv/.parquet file (pre-tokenized 'input_ids', or 'text' / 'messages' "
                             "to tokenize), a datasets folder, or a built-in corpus (tweets, dialogues, ...)")
    parser.add_argument("--out", required=True, help="output folder (shards, state.json, summary.json)")
    parser.add_argument("--max-length", type=int_in(1), required=True, help="tokens per packed row")
    parser.add_argument("--buffer-size", type=int_in(1), default=d.buffer_size,
                        help="sequences held for best fit (default %(default)s)")
    parser.add_argument("--overlong", default=d.overlong, choices=("error", "truncate", "split", "drop"),
                        help="what a sequence longer than --max-length does, counted in summary.json "
                             "(default %(default)s)")
    parser.add_argument("--min-fill", type=float, default=d.min_fill,
                        help="a row leaves the buffer once this share of --max-length is filled (default %(default)s)")
    parser.add_argument("--rows-per-shard", type=int_in(1), default=8192,
                        help="packed rows per Parquet file (default %(default)s)")
    parser.add_argument("--max-shards", type=int_in(1), default=None,
                        help="stop after writing this many shards (a rerun continues where this one stopped)")
    parser.add_argument("--synthetic", metavar="DIST:N[:P1:P2...]", default=None,
                        help="instead of INPUT: N random sequences, DIST lognormal (median, sigma, cap; default 60, 1, "
                             "2048) or uniform (low, high; default 10, 500)")
    parser.add_argument("--vocab-size", type=int_in(1), default=None,
                        help="token ids lie in [0, this): checked for pre-tokenized INPUT (default: the --tokenizer's "
                             "vocabulary), drawn for --synthetic (default 50257)")
    parser.add_argument("--seed", type=int_in(0), default=0, help="seed of --synthetic")
    parser.add_argument("--tokenizer", default="gpt2",
                        help="tokenizer of text and chat inputs, and the vocabulary of pre-tokenized ones (padless.data)")
    parser.add_argument("--train-on", default="all", help="labels of chat inputs: all | assistant | completion")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run_pack(args: Any) -> int:
    """``padless pack``: open the input, pack it into shards, print where things went."""
    if (args.input is None) == (args.synthetic is None):
        raise ValueError("give exactly one of INPUT and --synthetic")
    try:
        src = open_input(args.input, synthetic=args.synthetic, vocab_size=args.vocab_size, seed=args.seed,
                         tokenizer=args.tokenizer, train_on=args.train_on, progress=args.progress)  # fmt: skip
        summary = pack_to_parquet(
            src.source, args.out, args.max_length, rows_per_shard=args.rows_per_shard, max_shards=args.max_shards,
            progress=args.progress, input_key=src.key, total=src.total, buffer_size=args.buffer_size,
            overlong=args.overlong, min_fill=args.min_fill, vocab_size=src.vocab_size,
        )  # fmt: skip
    except ValueError as exc:
        message = as_flags(str(exc), FLAGS)
        if "outside the vocabulary" in message and args.vocab_size is None:
            message += f" of --tokenizer {args.tokenizer}; pass --vocab-size or --tokenizer for ids of another tokenizer"
        raise ValueError(message) from None
    s = summary["stats"]
    if summary.get("already_complete"):
        print(f"{args.out} is already complete ({len(summary['shards'])} shards); nothing to do")
        return 0
    done = "packed" if summary["complete"] else "stopped after --max-shards; rerun to continue:"
    print(f"{done} {s['num_sequences']} sequences into {s['num_rows']} rows of {args.max_length} tokens "
          f"({len(summary['shards'])} shards in {args.out}), efficiency {s['efficiency']:.4f}, "
          f"truncated {s['truncated_sequences']}, dropped {s['dropped_sequences']}; "
          f"peak RSS {summary['this_run']['peak_rss_mib']} MiB, {summary['this_run']['wall_s']} s")  # fmt: skip
    return 0
