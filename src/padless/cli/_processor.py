"""``--processor NAME`` for ``padless stats``: the lengths of ``--data`` chats with images rendered
through a vision-language processor, as ``padless pack --processor`` renders them (images expanded into
their tokens, the assistant turns trained)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from padless.cli._shared import TRAIN_ON_AUTO, InputLengths, data_kind


def processor_line(name: str, processor: Any) -> str:
    """``processor: CLASS (where); ...``: the vision-language processor ``--processor NAME`` uses."""
    where = "built offline: GPT-2's tokenizer + Qwen-VL's special tokens" if name == "offline" else name
    return (
        f"processor: {type(processor).__name__} ({where}); its chat template renders the chats and expands "
        f"each image into its tokens; vocabulary {len(processor.tokenizer):,}"
    )


def processor_lengths(args: argparse.Namespace) -> InputLengths:
    """The lengths of ``--data`` chats rendered through ``--processor`` (images expanded into their
    tokens, the assistant turns trained), as ``padless pack --processor`` renders them."""
    from padless.data.load import load_corpus
    from padless.data.shards import cached_processor
    from padless.planning.plan import validate_lengths

    name = args.data
    kind = data_kind(name)
    if kind not in ("messages", None):
        raise ValueError(f"--processor renders chats ('messages' records) with their images; {name} holds {kind}")
    if args.train_on not in (TRAIN_ON_AUTO, "assistant"):
        raise ValueError(
            f"--processor trains the assistant turns; --train-on {args.train_on} applies to chats rendered by a tokenizer"
        )
    if args.tokenizer is not None:
        raise ValueError("--processor brings its own tokenizer; leave out --tokenizer")
    if not args.processor.strip():
        raise ValueError("--processor needs a processor name or folder (or 'offline'), got ''")
    processor = cached_processor(args.processor)
    try:
        corpus = load_corpus(name, processor=processor, train_on="assistant")
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if name in message else f"--data {name}: {message}") from None
    report = corpus.report
    notes = [
        processor_line(args.processor, processor),
        f"train on: the assistant turns; {report.trained_tokens:,} of {report.tokens:,} tokens trained; "
        f"{report.image_documents:,} documents with {report.images:,} images (placed whole by packing)",
    ]
    data = {
        "processor": args.processor,
        "vocab_size": len(processor.tokenizer),
        "kind": "messages",
        "train_on": "assistant",
        "tokens": report.tokens,
        "trained_tokens": report.trained_tokens,
        "image_documents": report.image_documents,
        "images": report.images,
    }
    where = "file" if Path(name).expanduser().exists() else "corpus"
    return InputLengths(validate_lengths(corpus.lengths), f"{where} {name}", notes, data)
