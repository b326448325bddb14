"""``padless pack``: tokenize if needed and pack a dataset into Parquet shards of packed rows."""

from __future__ import annotations

from typing import Any

from padless.cli import as_flags, int_in
from padless.data.inputs import open_input
from padless.export.engine import ENGINES
from padless.export.parquet import pack_to_parquet
from padless.planning.plan import OVERLONG_POLICIES

# library argument -> flag, for messages
FLAGS = {"input": "INPUT", "out": "--out", "synthetic": "--synthetic", "vocab_size": "--vocab-size",
         "max_length": "--max-length", "overlong": "--overlong", "rows_per_shard": "--rows-per-shard",
         "max_shards": "--max-shards", "shard_rows": "--shard-rows", "num_workers": "--num-workers",
         "ray_address": "--ray-address", "engine": "--engine"}  # fmt: skip


def add_pack_arguments(parser: Any) -> None:
    """Flags of ``padless pack``."""
    parser.description = (
        f"{parser.description}. One plan over the whole input (best fit decreasing from the merged length "
        "histograms of its shards); the rows are the same for --engine local and ray and any --num-workers. "
        "Pre-tokenized input ('input_ids', optional 'labels') is packed as given in every format (.jsonl, .json, "
        ".csv, .tsv, .parquet): nothing is appended, and every id and label is checked against --vocab-size "
        "(default: the vocabulary of --tokenizer). Text and chats are tokenized with --tokenizer and end with its "
        "EOS. Ctrl-C keeps the finished shards: rerun to resume."
    )
    parser.add_argument("input", nargs="?", metavar="INPUT",
                        help="a .jsonl/.json/.csv/.tsv/.parquet file (pre-tokenized 'input_ids', or 'text' / 'messages' "
                             "to tokenize; one kind per file), a datasets folder, or a built-in corpus (tweets, ...)")
    parser.add_argument("--out", required=True, help="output folder (shards, state.json, summary.json)")
    parser.add_argument("--max-length", type=int_in(1), required=True, help="tokens per packed row")
    parser.add_argument("--overlong", default="error", choices=OVERLONG_POLICIES,
                        help="what a sequence longer than --max-length does, counted in summary.json "
                             "(default %(default)s)")
    parser.add_argument("--rows-per-shard", type=int_in(1), default=8192,
                        help="packed rows per Parquet file (default %(default)s)")
    parser.add_argument("--max-shards", type=int_in(1), default=None,
                        help="stop after writing this many shards (a rerun continues where this one stopped)")
    parser.add_argument("--engine", default="local", choices=ENGINES,
                        help="local: this process; ray: Ray tasks (pip install 'padless[ray]'); same rows either way")
    parser.add_argument("--num-workers", type=int_in(1), default=None,
                        help="--engine ray: tasks at once (and the CPUs of a local Ray; default: all CPUs)")
    parser.add_argument("--ray-address", default=None,
                        help="--engine ray: an existing cluster (ray://HOST:10001, HOST:6379, or auto)")
    parser.add_argument("--shard-rows", type=int_in(1), default=65536,
                        help="input records per unit of work (default %(default)s; the rows do not depend on it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an --out that holds a packing of another input or other flags")
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
    if args.engine == "local" and (args.num_workers is not None or args.ray_address is not None):
        raise ValueError("--num-workers and --ray-address need --engine ray")
    try:
        src = open_input(args.input, synthetic=args.synthetic, vocab_size=args.vocab_size, seed=args.seed,
                         tokenizer=args.tokenizer, train_on=args.train_on, shard_rows=args.shard_rows,
                         progress=args.progress)  # fmt: skip
        summary = pack_to_parquet(
            src, args.out, args.max_length, rows_per_shard=args.rows_per_shard, max_shards=args.max_shards,
            overlong=args.overlong, shard_rows=args.shard_rows, engine=args.engine, num_workers=args.num_workers,
            ray_address=args.ray_address, overwrite=args.overwrite, progress=args.progress,
        )  # fmt: skip
    except ValueError as exc:
        message = as_flags(str(exc), FLAGS).replace("overwrite=True", "--overwrite")
        if "outside the vocabulary" in message and args.vocab_size is None:
            message += f" of --tokenizer {args.tokenizer}; pass --vocab-size or --tokenizer for ids of another tokenizer"
        raise ValueError(message) from None
    s = summary["stats"]
    if summary.get("already_complete"):
        print(f"{args.out} is already complete ({len(summary['shards'])} shards); nothing to do")
        return 0
    run = summary["this_run"]
    done = "packed" if summary["complete"] else "stopped after --max-shards; rerun to continue:"
    print(f"{done} {s['num_sequences']} sequences into {s['num_rows']} rows of {args.max_length} tokens "
          f"({len(summary['shards'])} shards in {args.out}), efficiency {s['efficiency']:.4f} "
          f"({s['relative_gap']:.4%} over the lower bound), truncated {s['truncated_sequences']}, dropped "
          f"{s['dropped_sequences']}; {run['engine']} engine, {run['workers']} workers, peak RSS "
          f"{run['peak_rss_mib']} MiB, {run['wall_s']} s")  # fmt: skip
    return 0
