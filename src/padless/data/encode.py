"""Records -> token ids and labels: tokenize, mark targets, end each document once, apply the length limit.

- ``text`` records: tokenized with the tokenizer's special tokens (a BOS where it adds one); every
  token is a target.
- every form of record is read by :func:`padless.data.formats.read_document` (Alpaca, ShareGPT and TRL's
  prompt / completion become chats or a prompt and a completion; ``columns`` renames fields first).
- ``messages`` records: rendered into pieces by :func:`padless.data.chat.render_chat`; each piece is
  tokenized on its own (no special tokens added: the template writes its own), so a target never
  straddles a turn boundary. Whether that equals tokenizing the whole rendering at once is checked
  for every chat and the differing ones are counted (``boundary_mismatches`` in the report): with
  ChatML the boundaries sit next to special tokens or newlines, where BPE never merges, and the count
  is 0 on every built-in corpus with both the GPT-2 and the SmolLM2 tokenizer.
- a text prompt / completion: the prompt tokenized with the tokenizer's special tokens, the completion
  on its own; the completion is trained (the prompt too with ``train_on="all"``).
- ``input_ids`` records: taken as they are (``labels`` too, if given; else every token a target), and
  no EOS is appended: padless cannot know which tokenizer's conventions made them, so pre-tokenized
  ids are used as given everywhere (``load_corpus`` and ``padless pack`` alike, whatever the file type).

``labels`` are aligned with ``input_ids`` (the model shifts them), ``IGNORE_INDEX`` where not trained.
Every text and chat example ends with exactly one end-of-document token (with ``add_eos``, the
default). A text whose tokens end with EOS, or a chat whose rendering ends with EOS or with the
template's end-of-turn token (the special token it writes last: ``<|im_end|>`` in SmolLM2's ChatML,
which is also its EOS; ``<|eot_id|>`` in Llama 3's), ends there: whitespace after that token (ChatML's
closing ``"\\n"``) is left out and nothing is appended; the token keeps the label of the turn it
closes. Any other example gets EOS appended by the separator rule
(:func:`padless.layout.append_separator`): it is a target exactly when the token before it is one (the
end of a trained reply is learned; the end of a masked tool result is not). With GPT-2 and
:data:`padless.data.chat.DEFAULT_CHAT_TEMPLATE`, ``<|im_end|>`` is plain text, so a chat ends
``<|im_end|>\\n<|endoftext|>``.

An example longer than ``max_length`` (its end token included) follows ``overlong``, the planners'
vocabulary (:data:`padless.planning.plan.OVERLONG_POLICIES`): ``error`` raises; ``truncate`` keeps the first tokens
and ends the document again by the rule above; ``split`` cuts it into consecutive examples of at most
``max_length`` tokens (only the last keeps the end token); ``drop`` leaves it out. Every one but
``error`` is counted.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from padless.data.chat import SYSTEM_PROMPT, TRAIN_ON_CHOICES, SystemPrompt, TrainOnChoice, check_messages, render_chat
from padless.data.formats import parse_columns, read_document
from padless.data.records import RecordError, Unit, check_text, record_tokens, where
from padless.layout import IGNORE_INDEX, append_separator
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int
from padless.planning.plan import OVERLONG_POLICIES, OverlongPolicy

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Overlong = OverlongPolicy  # one vocabulary with the planners: error | truncate | split | drop
OnError = Literal["raise", "skip"]
ON_ERROR: tuple[str, ...] = ("raise", "skip")
_CHUNK = 512  # records per batched tokenizer call
SKIPPED_SHOWN = 5
"""How many skipped records are named (the rest are counted)."""
Closer = Callable[[list[int], list[int]], tuple[list[int], list[int]]]
"""``(ids, labels) -> (ids, labels)`` ending with exactly one end-of-document token."""


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
    system_prompt_added: int = 0
    """Chats that carry a system prompt the chat template added (0 with ``system_prompt="none"``)."""
    formats: Counter[str] = field(default_factory=Counter)
    """Records read, by form (:data:`padless.data.formats.FORMATS`)."""
    first_skipped: list[str] = field(default_factory=list)
    """The messages of the first :data:`SKIPPED_SHOWN` records skipped as bad (``on_error="skip"``)."""
    numbers: list[int] = field(default_factory=list)
    """The number naming the record each output example comes from (a split record: each piece)."""

    def skip(self, err: RecordError, at: str = "") -> None:
        """Count a bad record ``err`` as skipped; keep its message among the first few (``at`` prefixed)."""
        self.skipped[err.reason] += 1
        if len(self.first_skipped) < SKIPPED_SHOWN:
            self.first_skipped.append(f"{at}{err}")


@dataclass(frozen=True)
class EncodeOptions:
    """How records become ids and labels."""

    train_on: TrainOnChoice = "auto"
    """``auto`` (assistant turns of a chat, every token of a text) | ``all`` | ``assistant`` |
    ``completion`` (see :mod:`padless.data.chat`)."""
    add_eos: bool = True
    """End every text and chat example with one end-of-document token: its own EOS or end-of-turn
    token where it ends with one, else EOS appended (pre-tokenized ids are taken as given)."""
    max_length: int | None = None
    """Longest example allowed (tokens, EOS included); ``None`` for no limit."""
    overlong: Overlong = OVERLONG_DEFAULT
    """What a longer example does: ``error`` | ``truncate`` (the first tokens, ended again) | ``split``
    (consecutive examples, the end token in the last) | ``drop`` (left out); all but ``error`` are counted."""
    on_error: OnError = "raise"
    """What a bad record does: ``raise`` a ``ValueError`` or ``skip`` it (counted by reason)."""
    field: str | None = None
    """Force the record field to read (``text`` | ``messages`` | ``input_ids``); default: the first present."""
    chat_template: str | None = None
    """A Jinja chat template overriding the tokenizer's own."""
    columns: tuple[tuple[str, str], ...] = ()
    """``(padless name, record's field)`` pairs: the record's fields renamed before reading
    (:func:`padless.data.formats.parse_columns`; a dict or ``"a=b,c=d"`` is accepted and normalised)."""
    system_prompt: SystemPrompt = "template"
    """Text the chat template adds before the first message (SmolLM2's default system prompt, added to
    every chat without a system message): ``template`` keeps it (counted in ``system_prompt_added``),
    ``none`` leaves it out (see :mod:`padless.data.chat`)."""

    def __post_init__(self) -> None:
        if self.train_on not in TRAIN_ON_CHOICES:
            raise ValueError(f"train_on={self.train_on!r} is not one of {', '.join(TRAIN_ON_CHOICES)}")
        check_choice(self.overlong, OVERLONG_POLICIES, "overlong policy")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error={self.on_error!r} is not one of {', '.join(ON_ERROR)}")
        if self.system_prompt not in SYSTEM_PROMPT:
            raise ValueError(f"system_prompt={self.system_prompt!r} is not one of {', '.join(SYSTEM_PROMPT)}")
        if self.max_length is not None:  # 2: a truncated example keeps a token before its EOS
            check_int(self.max_length, "max_length", 2)
        object.__setattr__(self, "columns", parse_columns(self.columns or None))


def _plan(record: Any, at: str, tokenizer: PreTrainedTokenizerBase, opts: EncodeOptions) -> tuple[str, Any, str]:
    """``(kind, payload, form)``: ``("text", str)``, ``("chat", (pieces, system prompt added))``,
    ``("prompt_completion", (prompt, completion, prompt trained))`` or ``("tokens", (ids, labels or None))``,
    and the record's form (:data:`padless.data.formats.FORMATS`)."""
    doc = read_document(record, at, columns=opts.columns, field=opts.field)
    if doc.kind == "tokens":
        return "tokens", record_tokens(doc.value, at, len(tokenizer)), doc.format
    if doc.kind == "text":
        if opts.train_on not in ("all", "auto"):  # a configuration error, never a skip
            raise ValueError(
                f"{at} is plain text; train_on={opts.train_on!r} needs chats ('messages'); use train_on='all'"
            )
        return "text", check_text({"text": doc.value}, at), doc.format
    if doc.kind == "prompt_completion":
        return "prompt_completion", (*doc.value, opts.train_on == "all"), doc.format
    messages = check_messages(doc.value, at)
    train_on = "assistant" if opts.train_on == "auto" else opts.train_on
    context = doc.prompt_messages if opts.train_on == "auto" else 0
    pieces = render_chat(messages, tokenizer, train_on, opts.chat_template, at, opts.system_prompt, context)
    return "chat", pieces, doc.format


def _tokenize(tokenizer: PreTrainedTokenizerBase, texts: list[str], specials: bool) -> list[list[int]]:
    if not texts:
        return []
    return [list(t) for t in tokenizer(texts, add_special_tokens=specials)["input_ids"]]


def _encode_chunk(
    planned: list[tuple[int, str, Any]], tokenizer: PreTrainedTokenizerBase, counts: EncodeCounts
) -> list[tuple[int, str, list[int], list[int]]]:
    """Batched tokenization of one chunk of planned records, in order: ``(number, kind, ids, labels)``."""
    texts = [p for _, kind, p in planned if kind == "text"]
    pairs = [p for _, kind, p in planned if kind == "prompt_completion"]
    prompt_ids = iter(_tokenize(tokenizer, [p for p, _, _ in pairs], True))  # a prompt starts as a text does
    completion_ids = iter(_tokenize(tokenizer, [c for _, c, _ in pairs], False))
    chats = [p[0] for _, kind, p in planned if kind == "chat"]
    text_ids = iter(_tokenize(tokenizer, texts, True))  # plain text gets the tokenizer's BOS, if any
    piece_ids = iter(_tokenize(tokenizer, [t for pieces in chats for t, _ in pieces], False))
    multi = [pieces for pieces in chats if len(pieces) > 1]
    whole_ids = iter(_tokenize(tokenizer, ["".join(t for t, _ in pieces) for pieces in multi], False))
    out = []
    for number, kind, payload in planned:
        if kind == "text":
            ids = next(text_ids)
            labels = list(ids)
        elif kind == "prompt_completion":
            head, tail = next(prompt_ids), next(completion_ids)
            ids = head + tail
            labels = (head if payload[2] else [IGNORE_INDEX] * len(head)) + tail
        elif kind == "chat":
            pieces, added = payload
            ids, labels = [], []
            for _, trained in pieces:
                toks = next(piece_ids)
                ids += toks
                labels += toks if trained else [IGNORE_INDEX] * len(toks)
            if len(pieces) > 1 and next(whole_ids) != ids:
                counts.boundary_mismatches += 1
            counts.system_prompt_added += added
        else:
            ids, given = payload
            labels = list(ids) if given is None else given
        out.append((number, kind, ids, labels))
    return out


def encode_records(
    records: Sequence[Any],
    tokenizer: PreTrainedTokenizerBase,
    opts: EncodeOptions,
    *,
    numbers: Sequence[int] | None = None,
    unit: Unit = "record",
    progress: bool | None = None,
    desc: str = "tokenizing",
    source: str | None = None,
) -> tuple[list[list[int]], list[list[int]], EncodeCounts]:
    """Encode ``records``; ``numbers`` (default 1, 2, ...) and ``unit`` (``record`` | ``line``) name
    them in errors, as :func:`padless.data.records.where` does, after ``source`` (a file's name) if given."""
    from tqdm.auto import tqdm

    numbers = range(1, len(records) + 1) if numbers is None else numbers
    if len(numbers) != len(records):
        raise ValueError(f"{len(numbers)} record numbers for {len(records)} records")
    if opts.add_eos and tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; pass add_eos=False")
    ender = _DocumentEnd(tokenizer) if opts.add_eos else None
    counts = EncodeCounts(read=len(records))
    out_ids: list[list[int]] = []
    out_labels: list[list[int]] = []
    show = progress if progress is not None else (len(records) >= 2000 and sys.stderr.isatty())
    with tqdm(total=len(records), desc=desc, unit="rec", disable=not show) as bar:
        for start in range(0, len(records), _CHUNK):
            planned: list[tuple[int, str, Any]] = []
            for rec, number in zip(records[start : start + _CHUNK], numbers[start : start + _CHUNK]):
                at = where(number, unit) if source is None else f"{source}, {where(number, unit)}"
                try:
                    kind, payload, form = _plan(rec, at, tokenizer, opts)
                except RecordError as err:
                    if opts.on_error == "raise":
                        raise
                    counts.skip(err)
                    continue
                counts.formats[form] += 1
                planned.append((number, kind, payload))
            for number, kind, ids, labels in _encode_chunk(planned, tokenizer, counts):
                close = None if ender is None or kind == "tokens" else ender.closer(ids, chat=kind == "chat")
                named = where(number, unit) if source is None else f"{source}, {where(number, unit)}"
                for example_ids, example_labels in _finish(ids, labels, named, close, opts, counts):
                    out_ids.append(example_ids)
                    out_labels.append(example_labels)
                    counts.numbers.append(number)
            bar.update(min(_CHUNK, len(records) - start))
    return out_ids, out_labels, counts


class _DocumentEnd:
    """The end-of-document rule for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.eos: int = tokenizer.eos_token_id
        added = getattr(tokenizer, "added_tokens_decoder", {})
        self.special = set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}
        self._blank: dict[int, bool] = {}

    def blank(self, token: int) -> bool:
        """Whether ``token`` is whitespace only."""
        if token not in self._blank:
            self._blank[token] = token not in self.special and not self.tokenizer.decode([token]).strip()
        return self._blank[token]

    def closer(self, ids: list[int], *, chat: bool) -> Closer:
        """:meth:`close` for this document, whose end tokens are EOS and, for a chat, the special token
        its rendering ends with before any whitespace (the template's end of turn)."""
        k = len(ids)
        while chat and k and self.blank(ids[k - 1]):
            k -= 1
        last = ids[k - 1] if chat and k else self.eos
        end = frozenset({self.eos, last} if last in self.special else {self.eos})
        return lambda ids, labels: self.close(ids, labels, end)

    def close(self, ids: list[int], labels: list[int], end: frozenset[int]) -> tuple[list[int], list[int]]:
        """``ids`` ending with exactly one token of ``end``: cut after it where only whitespace follows,
        else EOS appended by the separator rule (:func:`padless.layout.append_separator`)."""
        k = len(ids)
        while k and ids[k - 1] not in end and self.blank(ids[k - 1]):
            k -= 1
        if k and ids[k - 1] in end:
            # The whitespace a template writes after its end-of-turn token (ChatML's "\n") only separates
            # turns: a model ends its reply with the end-of-turn token and never produces what follows,
            # and a document ends with its end token (rows are cut there), so that whitespace is left out.
            return ids[:k], labels[:k]
        new_ids, new_labels = append_separator(
            np.asarray(ids, dtype=np.int64), np.asarray(labels, dtype=np.int64), self.eos
        )
        return new_ids.tolist(), new_labels.tolist()


def _finish(
    ids: list[int],
    labels: list[int],
    at: str,
    close: Closer | None,
    opts: EncodeOptions,
    counts: EncodeCounts,
) -> list[tuple[list[int], list[int]]]:
    """End the document (``close=None``: as it is), then apply ``max_length``: the examples this record
    becomes (none if left out)."""
    if not ids:
        problem = RecordError("empty", f"{at} tokenizes to nothing")
        if opts.on_error == "raise":
            raise problem
        counts.skip(problem)
        return []
    if close is not None:
        ids, labels = close(ids, labels)
    limit = opts.max_length
    if limit is None or len(ids) <= limit:
        return [(ids, labels)]
    if opts.overlong == "error":
        raise overlong_error_at(at, len(ids), limit)
    if opts.overlong == "drop":
        counts.skipped["overlong"] += 1
        return []
    if opts.overlong == "split":  # consecutive pieces; only the last keeps its end token
        counts.split_examples += 1
        return [(ids[s : s + limit], labels[s : s + limit]) for s in range(0, len(ids), limit)]
    # truncate; an ended document ends again, so packed rows stay separated
    if close is not None:
        kept = close(ids[: limit - 1], labels[: limit - 1])
    else:
        kept = ids[:limit], labels[:limit]
    counts.truncated_examples += 1
    counts.truncated_tokens += len(ids) - len(kept[0])
    return [kept]


def overlong_error_at(at: str, length: int, max_length: int) -> ValueError:
    """The error for the record named ``at`` (``"d.jsonl, line 3"``), ``length`` tokens over ``max_length``."""
    return ValueError(
        f"{at} has length {length}, longer than max_length {max_length}; choose overlong='truncate', 'split' or "
        "'drop', or a larger max_length"
    )
