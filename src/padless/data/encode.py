"""Records -> token ids and labels: tokenize, mark targets, end with EOS, apply the length limit.

- ``text`` records: tokenized with the tokenizer's special tokens (a BOS where it adds one); every
  token is a target.
- ``messages`` records: rendered into pieces by :func:`padless.data.chat.chat_pieces`; each piece is
  tokenized on its own (no special tokens added: the template writes its own), so a target never
  straddles a turn boundary. Whether that equals tokenizing the whole rendering at once is checked
  for every chat and the differing ones are counted (``boundary_mismatches`` in the report): with
  ChatML the boundaries sit next to special tokens or newlines, where BPE never merges, and the count
  is 0 on every built-in corpus with both the GPT-2 and the SmolLM2 tokenizer.
- ``input_ids`` records: taken as they are (``labels`` too, if given; else every token a target), and
  no EOS is appended: padless cannot know which tokenizer's conventions made them, so pre-tokenized
  ids are used as given everywhere (``load_corpus`` and ``padless pack`` alike, whatever the file type).

``labels`` are aligned with ``input_ids`` (the model shifts them), ``IGNORE_INDEX`` where not trained.
Text and chat examples get EOS appended unless the ids already end with it, by the one separator rule
(:func:`padless.layout.append_separator`): it is a target exactly when the token before it is one (the
end of a trained reply is learned; the end of a masked tool result is not).

An example longer than ``max_length`` (EOS included) follows ``overlong``, the planners' vocabulary
(:data:`padless.OVERLONG_POLICIES`): ``error`` raises; ``truncate`` keeps the first tokens and ends
with EOS again; ``split`` cuts it into consecutive examples of at most ``max_length`` tokens (only the
last ends with EOS); ``drop`` leaves it out. Every one but ``error`` is counted.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from padless.data.chat import TRAIN_ON, TrainOn, chat_pieces, check_messages
from padless.data.records import RecordError, check_text, check_tokens, record_kind
from padless.layout import IGNORE_INDEX, append_separator
from padless.planning.checks import check_choice, check_int, overlong_error
from padless.planning.plan import OVERLONG_POLICIES, OverlongPolicy

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Overlong = OverlongPolicy  # one vocabulary with the planners: error | truncate | split | drop
OnError = Literal["raise", "skip"]
ON_ERROR: tuple[str, ...] = ("raise", "skip")
_CHUNK = 512  # records per batched tokenizer call


@dataclass
class EncodeCounts:
    """What happened to the records (mutable while encoding; frozen into the corpus report)."""

    read: int = 0
    """Records seen."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Records left out, by reason (only with ``on_error="skip"``, or ``overlong="drop"``: reason ``overlong``)."""
    truncated_examples: int = 0
    """Examples cut to ``max_length``."""
    truncated_tokens: int = 0
    """Tokens removed by those cuts."""
    split_examples: int = 0
    """Examples cut into several (``overlong="split"``); each piece is an example of the output."""
    boundary_mismatches: int = 0
    """Chats whose piece-wise tokenization differs from tokenizing the whole rendering."""


@dataclass(frozen=True)
class EncodeOptions:
    """How records become ids and labels."""

    train_on: TrainOn = "all"
    """``all`` | ``assistant`` | ``completion`` (see :mod:`padless.data.chat`)."""
    add_eos: bool = True
    """End every text and chat example with EOS so packed rows are EOS-separated (pre-tokenized ids are
    taken as given)."""
    max_length: int | None = None
    """Longest example allowed (tokens, EOS included); ``None`` for no limit."""
    overlong: Overlong = "error"
    """What a longer example does: ``error`` | ``truncate`` (first tokens + EOS) | ``split`` (consecutive
    examples, EOS at the end of the last) | ``drop`` (left out); all but ``error`` are counted."""
    on_error: OnError = "raise"
    """What a bad record does: ``raise`` a ``ValueError`` or ``skip`` it (counted by reason)."""
    field: str | None = None
    """Force the record field to read (``text`` | ``messages`` | ``input_ids``); default: the first present."""
    chat_template: str | None = None
    """A Jinja chat template overriding the tokenizer's own."""

    def __post_init__(self) -> None:
        if self.train_on not in TRAIN_ON:
            raise ValueError(f"train_on={self.train_on!r} is not one of {', '.join(TRAIN_ON)}")
        check_choice(self.overlong, OVERLONG_POLICIES, "overlong policy")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error={self.on_error!r} is not one of {', '.join(ON_ERROR)}")
        if self.max_length is not None:  # 2: a truncated example keeps a token before its EOS
            check_int(self.max_length, "max_length", 2)


def _plan(record: Any, index: int, tokenizer: PreTrainedTokenizerBase, opts: EncodeOptions) -> tuple[str, Any]:
    """``("text", str)``, ``("chat", pieces)`` or ``("tokens", (ids, labels or None))``."""
    kind = record_kind(record, index, opts.field)
    if kind == "tokens":
        return "tokens", check_tokens(record, index, len(tokenizer))
    if kind == "text":
        if opts.train_on != "all":  # a configuration error, never a skip
            raise ValueError(f"record {index} is plain text; train_on={opts.train_on!r} needs chats "
                             f"('messages'); use train_on='all'")
        return "text", check_text(record, index)
    messages = check_messages(record["messages"], index)
    return "chat", chat_pieces(messages, tokenizer, opts.train_on, opts.chat_template, index)


def _tokenize(tokenizer: PreTrainedTokenizerBase, texts: list[str], specials: bool) -> list[list[int]]:
    if not texts:
        return []
    return [list(t) for t in tokenizer(texts, add_special_tokens=specials)["input_ids"]]


def _encode_chunk(planned: list[tuple[int, str, Any]], tokenizer: PreTrainedTokenizerBase,
                  counts: EncodeCounts) -> list[tuple[int, str, list[int], list[int]]]:
    """Batched tokenization of one chunk of planned records, in order: ``(index, kind, ids, labels)``."""
    texts = [p for _, kind, p in planned if kind == "text"]
    chats = [p for _, kind, p in planned if kind == "chat"]
    text_ids = iter(_tokenize(tokenizer, texts, True))  # plain text gets the tokenizer's BOS, if any
    piece_ids = iter(_tokenize(tokenizer, [t for pieces in chats for t, _ in pieces], False))
    multi = [pieces for pieces in chats if len(pieces) > 1]
    whole_ids = iter(_tokenize(tokenizer, ["".join(t for t, _ in pieces) for pieces in multi], False))
    out = []
    for idx, kind, payload in planned:
        if kind == "text":
            ids = next(text_ids)
            labels = list(ids)
        elif kind == "chat":
            ids, labels = [], []
            for _, trained in payload:
                toks = next(piece_ids)
                ids += toks
                labels += toks if trained else [IGNORE_INDEX] * len(toks)
            if len(payload) > 1 and next(whole_ids) != ids:
                counts.boundary_mismatches += 1
        else:
            ids, given = payload
            labels = list(ids) if given is None else given
        out.append((idx, kind, ids, labels))
    return out


def encode_records(
    records: Sequence[Any],
    tokenizer: PreTrainedTokenizerBase,
    opts: EncodeOptions,
    *,
    indices: Sequence[int] | None = None,
    progress: bool | None = None,
    desc: str = "tokenizing",
) -> tuple[list[list[int]], list[list[int]], EncodeCounts]:
    """Encode ``records`` (``indices`` are their numbers in the source, for messages)."""
    from tqdm.auto import tqdm

    indices = list(range(len(records))) if indices is None else list(indices)
    eos = tokenizer.eos_token_id
    if opts.add_eos and eos is None:
        raise ValueError("the tokenizer has no EOS token; pass add_eos=False")
    counts = EncodeCounts(read=len(records))
    out_ids: list[list[int]] = []
    out_labels: list[list[int]] = []
    show = progress if progress is not None else (len(records) >= 2000 and sys.stderr.isatty())
    with tqdm(total=len(records), desc=desc, unit="rec", disable=not show) as bar:
        for start in range(0, len(records), _CHUNK):
            planned: list[tuple[int, str, Any]] = []
            for rec, idx in zip(records[start:start + _CHUNK], indices[start:start + _CHUNK]):
                try:
                    planned.append((idx, *_plan(rec, idx, tokenizer, opts)))
                except RecordError as err:
                    if opts.on_error == "raise":
                        raise
                    counts.skipped[err.reason] += 1
            for idx, kind, ids, labels in _encode_chunk(planned, tokenizer, counts):
                add_eos = opts.add_eos and kind != "tokens"  # pre-tokenized ids are taken as given
                for example_ids, example_labels in _finish(ids, labels, idx, eos if add_eos else None, opts, counts):
                    out_ids.append(example_ids)
                    out_labels.append(example_labels)
            bar.update(min(_CHUNK, len(records) - start))
    return out_ids, out_labels, counts


def _with_eos(ids: list[int], labels: list[int], eos: int) -> tuple[list[int], list[int]]:
    """``ids`` ending with EOS by the one separator rule (:func:`padless.layout.append_separator`)."""
    new_ids, new_labels = append_separator(np.asarray(ids, dtype=np.int64), np.asarray(labels, dtype=np.int64), eos)
    return new_ids.tolist(), new_labels.tolist()


def _finish(ids: list[int], labels: list[int], index: int, eos: int | None, opts: EncodeOptions,
            counts: EncodeCounts) -> list[tuple[list[int], list[int]]]:
    """Append EOS (``eos=None``: none), then apply ``max_length``: the examples this record becomes (none if left out)."""
    if not ids:
        if opts.on_error == "raise":
            raise RecordError("empty", f"record {index} tokenizes to nothing")
        counts.skipped["empty"] += 1
        return []
    if eos is not None:  # None: no EOS for this example
        ids, labels = _with_eos(ids, labels, eos)
    limit = opts.max_length
    if limit is None or len(ids) <= limit:
        return [(ids, labels)]
    if opts.overlong == "error":
        raise overlong_error(index, len(ids), limit, what="record")
    if opts.overlong == "drop":
        counts.skipped["overlong"] += 1
        return []
    if opts.overlong == "split":  # consecutive pieces; only the last keeps the EOS
        counts.split_examples += 1
        return [(ids[s : s + limit], labels[s : s + limit]) for s in range(0, len(ids), limit)]
    # truncate; with EOS, end with it again so packed rows stay EOS-separated
    if eos is not None:
        kept = _with_eos(ids[: limit - 1], labels[: limit - 1], eos)
    else:
        kept = ids[:limit], labels[:limit]
    counts.truncated_examples += 1
    counts.truncated_tokens += len(ids) - len(kept[0])
    return [kept]
