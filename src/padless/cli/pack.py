"""``padless pack``: tokenize if needed and pack a dataset into Parquet shards of packed rows.

Before packing it prints what it will do with the data, one line each: the input and its kind, the
tokenizer (name and vocabulary), what is trained (``--train-on auto``: assistant turns for chats, every
token for text) and what a sequence over ``--max-length`` does (``--overlong``, with padless' shared
default). A rerun with other flags names each flag that changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from padless.cli._formats import CHATS, columns_of, skipped_lines
from padless.cli._shared import (
    SYSTEM_PROMPT_DEFAULT,
    add_data_arguments,
    as_flags,
    data_flags_given,
    data_kind,
    int_in,
    load_named_tokenizer,
    overlong_line,
    plural,
    system_prompt_line,
    tokenizer_choice,
    train_on_choice,
)
from padless.data.corpora import split_corpus_name
from padless.data.formats import FORMATS
from padless.data.inputs import open_input
from padless.export.engine import ENGINES
from padless.export.parquet import pack_to_parquet
from padless.export.state import JobMismatch
from padless.planning.checks import OVERLONG_DEFAULT
from padless.planning.plan import OVERLONG_POLICIES

# library argument -> flag, for messages
FLAGS = {"input": "INPUT", "out": "--out", "synthetic": "--synthetic", "vocab_size": "--vocab-size",
         "max_length": "--max-length", "overlong": "--overlong", "rows_per_shard": "--rows-per-shard",
         "max_shards": "--max-shards", "shard_rows": "--shard-rows", "num_workers": "--num-workers",
         "ray_address": "--ray-address", "engine": "--engine", "tokenizer": "--tokenizer", "train_on": "--train-on",
         "system_prompt": "--system-prompt", "seed": "--seed", "processor": "--processor", "on_error": "--on-error"}  # fmt: skip


def add_pack_arguments(parser: Any) -> None:
    """Flags of ``padless pack``."""
    parser.description = (
        f"{parser.description}. One plan over the whole input (best fit decreasing from the merged length "
        "histograms of its shards); the rows are the same for --engine local and ray and any --num-workers. "
        "Pre-tokenized input ('input_ids', optional 'labels') is packed as given in every format (.jsonl, .json, "
        ".csv, .tsv, .parquet): nothing is appended, and every id and label is checked against --vocab-size "
        "(default: the vocabulary of --tokenizer). Text and chats are tokenized with --tokenizer (or the tokenizer "
        "of --model) and end with its EOS. Ctrl-C keeps the finished shards: rerun to resume."
    )
    parser.add_argument(
        "input",
        nargs="?",
        metavar="INPUT",
        help="a .jsonl/.json/.csv/.tsv/.parquet file (pre-tokenized 'input_ids', or 'text' / 'messages' "
        "to tokenize; one kind per file), a datasets folder, or a built-in corpus (tweets, ...)",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="output folder (shards, state.json, summary.json): new, empty, or an earlier packing to resume",
    )
    parser.add_argument("--max-length", type=int_in(1), required=True, help="tokens per packed row")
    parser.add_argument(
        "--overlong",
        default=OVERLONG_DEFAULT,
        choices=OVERLONG_POLICIES,
        help="what a sequence longer than --max-length does, counted in summary.json; one default "
        "with padless stats and the collators",
    )
    parser.add_argument("--rows-per-shard", type=int_in(1), default=8192, help="packed rows per Parquet file")
    parser.add_argument(
        "--max-shards",
        type=int_in(1),
        default=None,
        help="stop after writing this many shards; a rerun continues where this one stopped (default: no limit)",
    )
    parser.add_argument(
        "--engine",
        default="local",
        choices=ENGINES,
        help="local: this process; ray: Ray tasks (pip install 'padless[ray]'); same rows either way",
    )
    parser.add_argument(
        "--num-workers",
        type=int_in(1),
        default=None,
        help="--engine ray: tasks at once, and the CPUs of a local Ray (default: all CPUs)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="--engine ray: an existing cluster, ray://HOST:10001, HOST:6379 or auto (default: start a local Ray)",
    )
    parser.add_argument(
        "--shard-rows",
        type=int_in(1),
        default=65536,
        help="input records per unit of work (the rows do not depend on it)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an --out that holds a packing of another input or other flags, or pack "
        "into a non-empty folder padless did not write (its other files are kept)",
    )
    parser.add_argument(
        "--synthetic",
        metavar="DIST:N[:P1:P2...]",
        default=None,
        help="instead of INPUT: N random sequences, DIST lognormal (median, sigma, cap: 60, 1, 2048 "
        "unless given) or uniform (low, high: 10, 500 unless given)",
    )
    parser.add_argument(
        "--vocab-size",
        type=int_in(1),
        default=None,
        help="token ids lie in [0, this): checked for pre-tokenized INPUT, drawn for --synthetic "
        "(default: the --tokenizer's vocabulary; 50257 for --synthetic)",
    )
    parser.add_argument(
        "--processor",
        default=None,
        metavar="NAME",
        help="render chats with images through this vision-language processor (a hub name or folder; 'offline': "
        "the Qwen2-VL processor padless builds from offline parts); each row carries its documents' images (default: none; chats go through --tokenizer, text parts only)",
    )
    parser.add_argument("--seed", type=int_in(0), default=0, help="seed of --synthetic")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    add_data_arguments(parser, "INPUT")


def _describe(args: Any) -> tuple[str | None, str, list[str]]:
    """``(tokenizer, train_on, lines)``: what pack will do with the input, resolved from the flags."""
    if args.synthetic is not None:
        if given := data_flags_given(args):
            raise ValueError(
                f"{' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to an INPUT to tokenize; "
                "--synthetic draws random token ids (below --vocab-size)"
            )
        return (
            None,
            "all",
            [f"input: --synthetic {args.synthetic} (random token ids)", overlong_line(args.overlong, args.max_length)],
        )
    if not Path(args.input).expanduser().exists() and split_corpus_name(args.input) is None:
        return None, "all", []  # opening it says what it is not
    columns = columns_of(args)
    kind = data_kind(args.input, columns)
    train_on, train_line = train_on_choice(args.train_on, kind, args.input)
    if args.system_prompt != SYSTEM_PROMPT_DEFAULT and kind is not None and kind not in CHATS:
        raise ValueError(
            f"--system-prompt {args.system_prompt} applies to chats; {args.input} holds {FORMATS.get(kind, kind)}"
        )
    named = f", {FORMATS.get(kind, kind)}" if kind else ""
    mapped = f" (--columns {','.join(f'{a}={b}' for a, b in columns)})" if columns and kind else ""
    lines = [f"input: {args.input}{named}{mapped}"]
    if args.processor is not None:
        return None, "assistant", [*lines, *_processor_lines(args, kind)]
    name, origin = tokenizer_choice(args)
    if kind != "input_ids" or args.vocab_size is None:  # pre-tokenized ids with --vocab-size need no tokenizer
        tok, tok_line = load_named_tokenizer(name, origin)
        if kind == "input_ids":
            tok_line = (
                f"vocabulary: ids checked against [0, {len(tok):,}), the vocabulary of tokenizer {name} "
                f"({origin}; or pass --vocab-size)"
            )
        lines.append(tok_line)
    if train_line is not None:
        lines.append(train_line)
    lines.append(overlong_line(args.overlong, args.max_length))
    return name, train_on, lines


def _processor_lines(args: Any, kind: str | None) -> list[str]:
    """What ``--processor`` does, checked against the other flags."""
    if kind != "messages":
        raise ValueError(
            f"--processor renders chats ('messages' records) with their images; {args.input} holds {FORMATS.get(kind, kind)}"
        )
    if args.train_on not in ("auto", "assistant"):
        raise ValueError(
            f"--processor trains the assistant turns; --train-on {args.train_on} applies to chats rendered by a tokenizer"
        )
    if getattr(args, "tokenizer", None) is not None:
        raise ValueError("--processor brings its own tokenizer; leave out --tokenizer")
    from padless.data.shards import cached_processor

    processor = cached_processor(args.processor)
    where = (
        "built offline: GPT-2's tokenizer + Qwen-VL's special tokens" if args.processor == "offline" else args.processor
    )
    return [
        f"processor: {type(processor).__name__} ({where}); its chat template renders the chats and expands "
        f"each image into its tokens; vocabulary {len(processor.tokenizer):,}",
        "trained: the assistant turns (every other token is masked)",
        overlong_line(args.overlong, args.max_length) + "; a document with images is placed whole",
    ]


def _changed(exc: JobMismatch) -> str:
    """A refused resume in flags: ``--max-length was 1024, now 2048; ...``."""

    def shown(value: Any) -> str:
        return "(not recorded)" if value is None else str(value)

    said = []
    for name, was, now in exc.changes:
        if name == "input":
            said.append("INPUT is not the input packed there (other content)")
        else:
            said.append(f"{FLAGS.get(name, name)} was {shown(was)}, now {shown(now)}")
    return (
        f"--out {exc.out} holds a packing made with other flags: {'; '.join(said)}; rerun with the same flags, "
        "choose another --out, or pass --overwrite to start over"
    )


def run_pack(args: Any) -> int:
    """``padless pack``: open the input, pack it into shards, print where things went."""
    if (args.input is None) == (args.synthetic is None):
        raise ValueError("give exactly one of INPUT and --synthetic")
    if args.engine == "local" and (args.num_workers is not None or args.ray_address is not None):
        raise ValueError("--num-workers and --ray-address need --engine ray")
    tokenizer, train_on, lines = _describe(args)
    if lines:
        print("\n".join(lines), flush=True)
    data: dict[str, Any] = (
        {} if tokenizer is None else {"tokenizer": tokenizer, "train_on": train_on, "system_prompt": args.system_prompt}
    )
    if args.synthetic is None:
        data.update(columns=columns_of(args), on_error=args.on_error)
    if args.processor is not None:
        data = {"processor": args.processor, "train_on": "assistant"}
    try:
        src = open_input(
            args.input,
            synthetic=args.synthetic,
            vocab_size=args.vocab_size,
            seed=args.seed,
            shard_rows=args.shard_rows,
            progress=args.progress,
            **data,
        )
        summary = pack_to_parquet(
            src,
            args.out,
            args.max_length,
            rows_per_shard=args.rows_per_shard,
            max_shards=args.max_shards,
            overlong=args.overlong,
            shard_rows=args.shard_rows,
            engine=args.engine,
            num_workers=args.num_workers,
            ray_address=args.ray_address,
            overwrite=args.overwrite,
            progress=args.progress,
        )
    except JobMismatch as exc:
        raise ValueError(_changed(exc)) from None
    except ValueError as exc:
        message = as_flags(str(exc), FLAGS).replace("overwrite=True", "--overwrite")
        if "outside the vocabulary" in message and args.vocab_size is None:
            message += f" of --tokenizer {tokenizer}; pass --vocab-size or --tokenizer for ids of another tokenizer"
        raise ValueError(message) from None
    s = summary["stats"]
    if summary.get("already_complete"):
        print(f"{args.out} is already complete ({plural(len(summary['shards']), 'shard')}); nothing to do")
        return 0
    run = summary["this_run"]
    if (line := system_prompt_line(int(summary.get("system_prompt_added", 0)), s["num_sequences"])) is not None:
        print(line)
    for line in skipped_lines(summary.get("skipped_records", {}), summary.get("first_skipped", [])):
        print(line)
    done = "packed" if summary["complete"] else "stopped after --max-shards (rerun to continue):"
    print(
        f"{done} {plural(s['num_sequences'], 'sequence')} into {plural(s['num_rows'], 'row')} of "
        f"{args.max_length} tokens, {plural(len(summary['shards']), 'shard')} in {args.out}\n"
        f"  efficiency {s['efficiency']:.2%} ({s['relative_gap']:.2%} over the lower bound); truncated "
        f"{s['truncated_sequences']:,}, split {s['split_sequences']:,}, dropped {s['dropped_sequences']:,}\n"
        f"{_images_line(summary)}"
        f"  {run['engine']} engine, {plural(run['workers'], 'worker')}, {run['wall_s']:.1f} s, peak RSS "
        f"{run['peak_rss_mib']:,.0f} MiB"
    )
    return 0


def _images_line(summary: dict[str, Any]) -> str:
    """``  images: 37 documents with images, their images in their rows; 2 dropped with their images``."""
    held, dropped = int(summary.get("image_documents", 0)), int(summary.get("dropped_image_documents", 0))
    if not held:
        return ""
    gone = f"; {plural(dropped, 'document')} with images dropped as overlong, their images with them" if dropped else ""
    return (
        f"  images: {plural(held - dropped, 'document')} with images, each row carrying its documents' images{gone}\n"
    )
