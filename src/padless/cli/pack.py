"""``padless pack``: tokenize if needed and pack a dataset into Parquet shards of packed rows."""

from __future__ import annotations

from typing import Any

from padless.export.parquet import pack_to_parquet
from padless.export.sources import open_input
from padless.planning.buffered import StreamOptions


def add_pack_arguments(parser: Any) -> None:
    """Flags of ``padless pack``."""
    d = StreamOptions(max_length=1)
    parser.add_argument("input", nargs="?", metavar="INPUT",
                        help="a .jsonl/.json/.csv/.parquet file (pre-tokenized 'input_ids', or 'text' / 'messages' "
                             "to tokenize), a datasets folder, or a built-in corpus (tweets, dialogues, ...)")
    parser.add_argument("--out", required=True, help="output folder (shards, state.json, summary.json)")
    parser.add_argument("--max-length", type=int, required=True, help="tokens per packed row")
    parser.add_argument("--buffer-size", type=int, default=d.buffer_size,
                        help="sequences held for best fit (default %(default)s)")
    parser.add_argument("--overlong", default=d.overlong, choices=("error", "truncate", "split", "drop"),
                        help="what a sequence longer than --max-length does, counted in summary.json "
                             "(default %(default)s)")
    parser.add_argument("--min-fill", type=float, default=d.min_fill,
                        help="a row leaves the buffer once this share of --max-length is filled (default %(default)s)")
    parser.add_argument("--rows-per-shard", type=int, default=8192,
                        help="packed rows per Parquet file (default %(default)s)")
    parser.add_argument("--max-shards", type=int, default=None,
                        help="stop after writing this many shards (a rerun continues where this one stopped)")
    parser.add_argument("--synthetic", metavar="DIST:N[:P1:P2...]", default=None,
                        help="instead of INPUT: N random sequences, DIST lognormal (median, sigma, cap; default 60, 1, "
                             "2048) or uniform (low, high; default 10, 500)")
    parser.add_argument("--vocab-size", type=int, default=50257, help="token ids of --synthetic lie in [0, this)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --synthetic")
    parser.add_argument("--tokenizer", default="gpt2", help="tokenizer for text and chat inputs (padless.data)")
    parser.add_argument("--train-on", default="all", help="labels of chat inputs: all | assistant | completion")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run_pack(args: Any) -> int:
    """``padless pack``: open the input, pack it into shards, print where things went."""
    for flag in ("max_length", "buffer_size", "rows_per_shard"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    source, total, key = open_input(args)
    summary = pack_to_parquet(
        source, args.out, args.max_length, rows_per_shard=args.rows_per_shard, max_shards=args.max_shards,
        progress=args.progress, input_key=key, total=total, buffer_size=args.buffer_size, overlong=args.overlong,
        min_fill=args.min_fill,
    )  # fmt: skip
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
