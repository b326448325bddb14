"""``load_corpus``: a built-in corpus or the user's data -> a tokenized corpus with labels, cached.

    >>> corpus = load_corpus("dialogues", "gpt2", train_on="assistant", max_length=512)
    >>> corpus.features()[0]          # what the collators take
    {'input_ids': [27, 91, ...], 'labels': [-100, -100, ...]}
    >>> corpus.lengths                # numpy int64, one per example, EOS included
    >>> print(corpus.report)          # read / kept / skipped by reason / truncated tokens

The first call tokenizes (a progress bar on a terminal for large corpora) and stores the result under
``<cache root>/tokens``; a later call with the same source, tokenizer and options loads it at once.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from padless.data.assets import VADER_VERSION
from padless.data.cache import cache_key, entry_path, load_entry, save_entry
from padless.data.chat import SystemPrompt, TrainOnChoice
from padless.data.corpora import split_corpus_name
from padless.data.encode import EncodeCounts, EncodeOptions, OnError, Overlong, encode_records
from padless.data.raw import TOOL_SCHEMA
from padless.data.records import Unit, numbered
from padless.layout import IGNORE_INDEX
from padless.planning.checks import OVERLONG_DEFAULT, check_int

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

RECIPES_VERSION = 1
"""Bump when a built-in recipe changes what it produces (invalidates cached tokens)."""


@dataclass(frozen=True)
class CorpusReport:
    """What loading a corpus did, in counts."""

    read: int
    """Records read from the source (before ``limit``)."""
    selected: int
    """Records left after ``limit``."""
    kept: int
    """Examples in the corpus."""
    skipped: dict[str, int]
    """Records left out, by reason (``on_error="skip"``; ``overlong="drop"``: reason ``overlong``)."""
    truncated_examples: int
    """Examples cut to ``max_length`` (``overlong="truncate"``)."""
    truncated_tokens: int
    """Tokens removed by those cuts."""
    boundary_mismatches: int
    """Chats whose piece-wise tokenization differs from whole-text tokenization (see ``encode``)."""
    tokens: int
    """Tokens in the corpus, EOS included."""
    trained_tokens: int
    """Tokens whose label is not ``IGNORE_INDEX``."""
    split_examples: int = 0
    """Examples cut into several consecutive ones (``overlong="split"``)."""
    system_prompt_added: int = 0
    """Chats that carry a system prompt the chat template added (``system_prompt="template"``)."""
    image_documents: int = 0
    """Examples that carry images (chats rendered through a processor)."""
    images: int = 0
    """Images in those examples."""
    formats: dict[str, int] = dataclasses.field(default_factory=dict)
    """Records read, by form (:data:`padless.data.formats.FORMATS`: ``alpaca``, ``sharegpt``, ...)."""
    first_skipped: list[str] = dataclasses.field(default_factory=list)
    """The messages of the first few records skipped as bad (``on_error="skip"``), naming each."""

    def format_line(self) -> str:
        """``format: Alpaca ('instruction' / 'input' / 'output'), 52 records``: the forms read, by name."""
        from padless.data.formats import FORMATS

        said = [f"{FORMATS.get(k, k)}, {v:,} record{'s' if v != 1 else ''}" for k, v in self.formats.items()]
        return "format: " + ("; ".join(said) or "none read")

    def __str__(self) -> str:
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        split = f"split {self.split_examples} examples; " if self.split_examples else ""
        system = (
            f"the chat template added a system prompt to {self.system_prompt_added} chats "
            "(system_prompt='none' leaves it out); "
            if self.system_prompt_added
            else ""
        )
        images = f"{self.image_documents} examples with {self.images} images; " if self.image_documents else ""
        return (
            f"{self.format_line()}; "
            f"read {self.read}, kept {self.kept} (selected {self.selected}); skipped: {skipped}; {images}"
            f"truncated {self.truncated_examples} examples / {self.truncated_tokens} tokens; {split}{system}"
            f"{self.tokens} tokens, {self.trained_tokens} trained"
        )


@dataclass(frozen=True)
class TokenizedCorpus:
    """Token ids and aligned labels of every example (``IGNORE_INDEX`` where not trained)."""

    name: str
    """The corpus name or path it was loaded from."""
    input_ids: list[list[int]]
    """Token ids per example; each ends with EOS when loaded with ``add_eos``."""
    labels: list[list[int]]
    """Same lengths as ``input_ids``."""
    report: CorpusReport
    """Counts of what loading did."""
    from_cache: bool = False
    """Whether the tokens came from the on-disk cache."""
    vision: list[dict[str, Any]] | None = None
    """Chats rendered through a processor: per example, the processor's other outputs (``pixel_values``,
    ``image_grid_thw``, ``mm_token_type_ids``...; ``None`` where an example has no images), which
    :meth:`features` hands to the collators with the tokens."""
    numbers: np.ndarray | None = dataclasses.field(default=None, repr=False)
    """``[n]`` int64: the number naming the record each example comes from (with :attr:`unit`, as
    :func:`padless.data.records.where` names it); None where not known."""
    unit: str = "record"
    """``line`` (JSON lines, CSV) or ``record``."""
    lengths: np.ndarray = dataclasses.field(init=False, repr=False)
    """``[n]`` int64 token count per example."""

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels):
            raise ValueError(f"{len(self.input_ids)} input_ids rows but {len(self.labels)} labels rows")
        lengths = np.fromiter((len(x) for x in self.input_ids), dtype=np.int64, count=len(self.input_ids))
        bad = next((i for i, (x, y) in enumerate(zip(self.input_ids, self.labels)) if len(x) != len(y)), None)
        if bad is not None:
            raise ValueError(f"example {bad}: {len(self.input_ids[bad])} input_ids but {len(self.labels[bad])} labels")
        object.__setattr__(self, "lengths", lengths)

    def where(self, example: int) -> str:
        """``"d.jsonl, line 7"``: the record example ``example`` (from 0) comes from."""
        from padless.data.records import where

        if self.numbers is None:
            return f"{self.name}, example {example + 1}"
        return f"{self.name}, {where(int(self.numbers[example]), self.unit)}"  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.input_ids)

    def features(self) -> list[dict[str, Any]]:
        """``[{"input_ids": [...], "labels": [...]}, ...]``, what the collators take (with each example's
        images and per-token vision columns, for a corpus rendered through a processor)."""
        if self.vision is not None:
            return [{"input_ids": x, "labels": y, **v} for x, y, v in zip(self.input_ids, self.labels, self.vision)]
        return [{"input_ids": x, "labels": y} for x, y in zip(self.input_ids, self.labels)]


def _report(
    counts: EncodeCounts, read: int, selected: int, ids: list[list[int]], labels: list[list[int]]
) -> CorpusReport:
    return CorpusReport(
        read=read,
        selected=selected,
        kept=len(ids),
        skipped=dict(counts.skipped),
        truncated_examples=counts.truncated_examples,
        truncated_tokens=counts.truncated_tokens,
        boundary_mismatches=counts.boundary_mismatches,
        tokens=sum(map(len, ids)),
        split_examples=counts.split_examples,
        system_prompt_added=counts.system_prompt_added,
        trained_tokens=sum(sum(1 for t in y if t != IGNORE_INDEX) for y in labels),
        formats=dict(counts.formats),
        first_skipped=list(counts.first_skipped),
    )


def _asset_versions() -> dict[str, str]:
    out = {"vader": VADER_VERSION}
    for dist in ("bfcl-eval", "chatterbot-corpus"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def _subsample(n: int, limit: int | None, seed: int) -> list[int]:
    """``limit`` of ``n`` record numbers, seeded, in source order."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(np.random.default_rng(seed).choice(n, size=limit, replace=False).tolist())


def load_corpus(
    name_or_path: str | Path,
    tokenizer: str | PreTrainedTokenizerBase = "gpt2",
    *,
    train_on: TrainOnChoice = "auto",
    max_length: int | None = None,
    overlong: Overlong = OVERLONG_DEFAULT,
    limit: int | None = None,
    seed: int = 0,
    add_eos: bool = True,
    on_error: OnError = "raise",
    field: str | None = None,
    tool_schema: str | None = None,
    chat_template: str | None = None,
    system_prompt: SystemPrompt = "template",
    split: str = "train",
    cache: bool = True,
    progress: bool | None = None,
    processor: Any = None,
    columns: Any = None,
) -> TokenizedCorpus:
    """Tokenize a built-in corpus (:data:`CORPORA`, e.g. ``"tweets:all"``) or a data file / dataset.

    ``train_on`` picks the targets (``auto``: the assistant turns of chats, every token of texts; or
    ``all`` | ``assistant`` | ``completion``, see :mod:`padless.data.chat`); ``max_length`` with ``overlong`` (``error`` | ``truncate`` | ``split`` |
    ``drop``, as in the planners) bounds the example length; ``on_error`` (``raise`` | ``skip``) decides what a bad record does;
    ``limit`` keeps a seeded random subset of that many records (in source order); ``seed`` also
    drives the recipes' choices; ``tool_schema`` (``half`` | ``always`` | ``never``; default: the
    recipe's, ``half`` for toolcalls, ``never`` for agentic-rag) whether built-in tool-call examples
    show their schemas in a system turn; ``field`` forces the record field read from user data;
    ``chat_template`` overrides the tokenizer's; ``system_prompt`` (``template`` | ``none``) keeps or
    leaves out a system prompt the chat template adds (counted in the report); ``split`` is the
    ``datasets`` split. Records may be of any form of :mod:`padless.data.formats` (Alpaca, ShareGPT,
    TRL's prompt / completion, chats, text, token ids; :attr:`CorpusReport.formats` counts them);
    ``columns`` (``{"instruction": "question"}`` or ``"instruction=question,..."``) renames a record's
    own fields to those first. Errors name the file and a record by its line in JSON lines and CSV
    files, else by its position, from 1 (:func:`padless.data.records.where`).

    ``processor`` (a vision-language processor, its hub name or folder, or ``"offline"``): chats whose
    content parts hold images (a path relative to the file, bytes, a data URI; or the record's
    ``images`` field) are rendered through it (:func:`padless.data.images.render_image_chat`: its chat
    template, each image expanded into its tokens, the assistant turns trained), and every example
    keeps its images (:attr:`TokenizedCorpus.vision`). A document with images is never cut:
    ``overlong="truncate"`` or ``"split"`` refuses one naming it, ``"drop"`` drops it with its images
    (counted). Such a corpus is not cached (its images are the processor's arrays).
    """
    if processor is not None:
        return _image_corpus(name_or_path, processor, max_length, overlong, limit, seed, on_error, split, train_on)
    from padless.data.files import file_fingerprint, read_records
    from padless.data.tokenizer import load_tokenizer, tokenizer_fingerprint

    opts = EncodeOptions(
        train_on=train_on,
        add_eos=add_eos,
        max_length=max_length,
        overlong=overlong,
        on_error=on_error,
        field=field,
        chat_template=chat_template,
        system_prompt=system_prompt,
        columns=columns or (),
    )
    if limit is not None:
        check_int(limit, "limit")
    if tool_schema is not None and tool_schema not in TOOL_SCHEMA:
        raise ValueError(f"tool_schema={tool_schema!r} is not one of {', '.join(TOOL_SCHEMA)}")
    name = str(name_or_path)
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    builtin = split_corpus_name(name)
    key_parts: dict[str, Any] = {
        "tokenizer": tokenizer_fingerprint(tok),
        "options": asdict(opts),
        "limit": limit,
        "seed": seed,
    }
    rows: list[tuple[int, Any]] | None = None
    unit: Unit = "record"
    if builtin is not None:
        recipe, selector = builtin
        tool_schema = tool_schema or recipe.tool_schema
        if recipe.kind == "text" and train_on not in ("all", "auto"):
            raise ValueError(
                f"corpus {recipe.name!r} is plain text; train_on={train_on!r} needs chats; use train_on='all'"
            )
        key_parts["source"] = {
            "recipe": name,
            "version": RECIPES_VERSION,
            "assets": _asset_versions(),
            "tool_schema": tool_schema,
        }
        pre_skipped: dict[str, int] = {}
        pre_notes: list[str] = []
    elif tool_schema is not None:
        raise ValueError(f"tool_schema={tool_schema!r} applies to the built-in corpora only, not to {name!r}")
    elif Path(name).expanduser().is_file():
        key_parts["source"] = file_fingerprint(Path(name).expanduser())
    else:  # a datasets folder or name: its fingerprint is known only once loaded
        found = read_records(name, split=split, on_error=on_error)
        rows, unit, pre_skipped, key_parts["source"] = found.rows, found.unit, dict(found.skipped), found.fingerprint
        pre_notes = list(found.first_skipped)
    path = entry_path(Path(name).name if builtin is None else name, cache_key(key_parts))
    if cache and (hit := load_entry(path)) is not None:
        ids, labels, meta = hit
        return TokenizedCorpus(
            name, ids, labels, CorpusReport(**meta["report"]), from_cache=True, numbers=meta.get("numbers"),
            unit=meta.get("unit", "record"),
        )  # fmt: skip

    if builtin is not None:
        recipe, selector = builtin
        rows = numbered(recipe.build(selector, seed, tool_schema or recipe.tool_schema))
    elif rows is None:
        found = read_records(name, split=split, on_error=on_error)
        rows, unit, pre_skipped, pre_notes = found.rows, found.unit, dict(found.skipped), list(found.first_skipped)
    read = len(rows) + sum(pre_skipped.values())
    chosen = [rows[i] for i in _subsample(len(rows), limit, seed)]
    ids, labels, counts = encode_records(
        [r for _, r in chosen],
        tok,
        opts,
        numbers=[i for i, _ in chosen],
        unit=unit,
        progress=progress,
        desc=f"tokenizing {name}",
        source=name if builtin is None and Path(name).expanduser().is_file() else None,
    )
    counts.skipped.update(pre_skipped)
    counts.first_skipped[:0] = pre_notes
    report = _report(counts, read, len(chosen), ids, labels)
    numbers = np.asarray(counts.numbers, dtype=np.int64)
    if cache:
        save_entry(path, ids, labels, {"name": name, "key": key_parts, "report": asdict(report), "unit": unit}, numbers)
    return TokenizedCorpus(name, ids, labels, report, numbers=numbers, unit=unit)


def corpus_lengths(name: str, tokenizer: str | PreTrainedTokenizerBase = "gpt2", **options: Any) -> np.ndarray:
    """``[n]`` int64 token lengths of a corpus (EOS included); ``options`` go to :func:`load_corpus`."""
    return load_corpus(name, tokenizer, **options).lengths


def _image_corpus(
    name: Any, processor: Any, max_length: int | None, overlong: str, limit: int | None, seed: int,
    on_error: str, split: str, train_on: str,
) -> TokenizedCorpus:  # fmt: skip
    """:func:`load_corpus` of chats rendered through ``processor``, images kept (see its docstring)."""
    from padless.data.files import read_records
    from padless.data.images import render_image_chat
    from padless.data.records import where
    from padless.data.shards import cached_processor
    from padless.planning.checks import check_choice, overlong_error
    from padless.planning.plan import OVERLONG_POLICIES

    check_choice(overlong, OVERLONG_POLICIES, "overlong policy")
    if train_on not in ("auto", "assistant"):
        raise ValueError(f"train_on={train_on!r}: chats rendered through a processor train their assistant turns")
    if limit is not None:
        check_int(limit, "limit")
    if max_length is not None:
        check_int(max_length, "max_length", 2)
    proc = cached_processor(processor) if isinstance(processor, str) else processor
    path = Path(str(name)).expanduser()
    if split_corpus_name(str(name)) is not None and not path.exists():
        raise ValueError(f"corpus {name!r} is built-in text without images; processor= renders chat files with images")
    rows, unit, pre, _, _ = read_records(str(name), split=split, on_error=on_error)
    base_dir = path.parent if path.is_file() else path
    skipped: dict[str, int] = dict(pre)
    chosen = [rows[i] for i in _subsample(len(rows), limit, seed)]
    ids, labels, vision = [], [], []
    truncated = truncated_tokens = pieces = 0
    for number, record in chosen:
        at = f"{path.name if path.is_file() else name}, {where(number, unit)}"
        try:
            messages = record.get("messages") if isinstance(record, dict) else None
            if not isinstance(messages, list):
                fields = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{at}: a chat record needs a 'messages' list (fields: {fields})")
            feature = render_image_chat(messages, proc, where=at, base_dir=base_dir, images=record.get("images"))
        except ValueError:
            if on_error == "raise":
                raise
            skipped["bad_record"] = skipped.get("bad_record", 0) + 1
            continue
        x, y = feature.pop("input_ids"), feature.pop("labels")
        has_images = any(k in feature for k in ("pixel_values", "pixel_values_videos"))
        if max_length is not None and len(x) > max_length:
            if overlong == "error" or (has_images and overlong != "drop"):
                if overlong == "error":
                    raise overlong_error(
                        number, len(x), max_length, what=f"{at.rsplit(', ', 1)[0]}, {unit}", numbered=True
                    )
                raise ValueError(
                    f"{at} holds images and {len(x)} tokens, above max_length={max_length}: a document with images "
                    f"is never cut (overlong={overlong!r} would cut its images); raise max_length or use overlong='drop'"
                )
            if overlong == "drop":
                skipped["overlong"] = skipped.get("overlong", 0) + 1
                continue
            cuts = (
                [(0, max_length)]
                if overlong == "truncate"
                else [(a, a + max_length) for a in range(0, len(x), max_length)]
            )
            truncated += overlong == "truncate"
            truncated_tokens += len(x) - max_length if overlong == "truncate" else 0
            pieces += overlong == "split"
            for a, b in cuts:
                ids.append(x[a:b])
                labels.append(y[a:b])
                vision.append({k: v[a:b] for k, v in feature.items()})  # text only: per-token columns
            continue
        ids.append(x)
        labels.append(y)
        vision.append(feature)
    keys = list(dict.fromkeys(k for v in vision for k in v))
    vision = [{k: v.get(k) for k in keys} for v in vision]
    with_images = [v for v in vision if v.get("image_grid_thw") is not None or v.get("pixel_values") is not None]
    report = CorpusReport(
        read=len(rows) + sum(pre.values()), selected=len(chosen), kept=len(ids), skipped=skipped,
        truncated_examples=truncated, truncated_tokens=truncated_tokens, boundary_mismatches=0,
        tokens=sum(map(len, ids)), trained_tokens=sum(sum(1 for t in y if t != IGNORE_INDEX) for y in labels),
        split_examples=pieces, image_documents=len(with_images), images=sum(_image_count(v) for v in with_images),
    )  # fmt: skip
    return TokenizedCorpus(str(name), ids, labels, report, vision=vision)


def _image_count(vision: dict[str, Any]) -> int:
    """Images of one example: rows of ``image_grid_thw``, else the image axis of ``pixel_values``."""
    from padless.layout import image_axis

    grid = vision.get("image_grid_thw")
    if grid is not None:
        return len(grid)
    pixels = np.asarray(vision["pixel_values"])
    return int(pixels.shape[image_axis("pixel_values", pixels.ndim, vision)])
