"""Preference pairs (DPO) and rollout groups (GRPO) packed into rows, with or without a shared prompt.

A *group* is one prompt and ``k`` completions: a preference pair is a group of 2 (chosen, rejected),
a GRPO group has ``k`` rollouts. Two layouts, chosen by ``share_prompt``:

- independent (``False``): every completion is its own document ``prompt + completion`` (the
  prompt repeated ``k`` times), packed like any sequence; every attention backend padless accepts
  for plain packing can run it.
- shared prompt (``True``): the prompt once, each completion after it, attending to the prompt and
  not to the others (a tree, :mod:`padless.attention.tree`), positions continuing from the prompt::

      input_ids     p0 p1 p2 a0 a1 b0 b1 b2 _     prompt p, chosen a, rejected b, one pad
      position_ids   0  1  2  3  4  3  4  5 0
      labels         -  -  - a0 a1 b0 b1 b2 -     completions trained, the prompt not

  It saves ``(k - 1) * len(prompt)`` tokens of every group; only sdpa and eager (a 4D tree mask) and
  padless attention (``tree_cu_seqlens`` / ``tree_parents``) can express it
  (:func:`shared_prompt_refusal`).

A group never splits across rows: the planner (:func:`padless.plan_packs`) packs whole groups, and
a group longer than ``max_length`` follows ``overlong``: ``error``; ``truncate`` (keep the prompt's
last tokens and every completion's first tokens, cut to one common length, so the group fits);
``drop`` (left out; the batch's ``kept`` says which groups stayed, and features are numbered over
those). Both are counted in ``totals``.

Read the batch with ``padless.sequence_logprobs(model, batch)``: its features are the completions, in
order (pair ``i``'s chosen is feature ``2i``, its rejected ``2i + 1``; a rollout group's completions
follow each other), and :class:`padless.batching.batch.Placements` gives each completion's
``prev_offset`` (the prompt's last token). In the shared layout ``labels`` are not next-token labels
for a plain ``model(**batch, labels=...)`` loss: the token before a later completion's first token is
the previous completion's last, so read log-probs through the placements, never by shifting.

Rollout fields (:class:`RolloutCollator`), in TRL's ``GRPOTrainer`` names: a group feature may carry,
besides ``prompt_ids`` and ``completion_ids`` (``k`` lists), any of these, each a list with one entry
per completion (:func:`rollout_features` builds such features from TRL's padded tensors):

- ``completion_mask``: one 0/1 per ``completion_ids`` token, ``1...1 0...0``; the zeros are padding
  and are not packed (a 0 before a 1 is refused: tool results go in ``tool_mask``).
- ``tool_mask``: one 0/1 per token; 0 marks a tool result inside a multi-turn completion: packed as
  context (the tokens after it attend to it), label ``IGNORE_INDEX``, never trained.
- ``advantages``: per completion one float, or one float per token.
- ``old_per_token_logps``, ``ref_per_token_logps``: one float per token.

Per-token values are aligned with ``completion_ids`` (the padding included) and are cut with the
tokens: the padding by ``completion_mask``, a long group by ``overlong="truncate"``; a group dropped
by ``overlong="drop"`` takes them along. Advantages and log-probs must be finite; the advantages and
each kind of log-probs are given for every group of a batch or for none. ``features.separator_id`` is
refused with per-token values (the appended token would have none; TRL's completions end with EOS).

The batch carries them as ``batch.rollouts`` (a dict of CPU tensors; not model inputs, and not kept
by :func:`padless.batching.batch.batch_to`) in TRL's ``(B, T)`` completion layout: row ``b`` is
feature ``b`` (the completions of the kept groups, in order), ``T`` the longest packed completion,
every row left-aligned and zero-filled after its completion::

    completion_ids      [B, T] long     packed tokens (separator included), pad_token_id after
    completion_mask     [B, T] long     1 = a trained token (a real token whose tool_mask is 1)
    completion_lengths  [B]    long     packed tokens of each completion (tool results included)
    tool_mask           [B, T] long     given: 1 = generated, 0 = tool result or padding
    advantages          [B] or [B, T] float32   [B, T] when any completion gave per-token values
    old_per_token_logps, ref_per_token_logps   [B, T] float32   given

``sequence_logprobs(model, batch, per_token=True)`` gives feature ``b`` one log-prob per trained
token, in order: they fill the positions where ``completion_mask[b] == 1``.

An *empty* rollout has no trained token: a ``completion_mask`` of zeros (TRL's
``mask_truncated_completions``), ``[]``, or every token a tool result. It is packed (an empty one as a
single ``pad_token_id`` placeholder, label ``IGNORE_INDEX``, in no ``(B, T)`` column), its
``completion_mask`` row is all zero, its log-prob sum is 0 (never NaN), and ``totals`` counts it in
``empty_completions``. A group whose completions are all empty is packed and counted in
``empty_groups`` (a whole GRPO group truncated is a legitimate batch, so it is not an error); a group
with no completion at all is refused. Both counts are over the packed groups, after ``overlong``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from padless.attention.accept import is_tree
from padless.batching.batch import PackedBatch, Placements
from padless.batching.rowformat import RowFormat
from padless.layout import IGNORE_INDEX, Layout, check_tokens, cu_seqlens_from_lengths
from padless.planning.checks import check_int

GROUP_OVERLONG: tuple[str, ...] = ("error", "truncate", "drop")
"""Overlong policies for groups (``split`` would cut a pair across rows)."""

ROLLOUT_FIELDS: tuple[str, ...] = ("completion_mask", "tool_mask", "advantages", "old_per_token_logps",
                                   "ref_per_token_logps")  # fmt: skip
"""The optional per-completion fields of a rollout group feature (TRL ``GRPOTrainer`` names)."""

_ALL_OR_NONE = ("advantages", "old_per_token_logps", "ref_per_token_logps")
"""Fields a batch carries for every group or for none (a tensor with holes has no meaning)."""


def check_batch_for_model(model: Any, batch: Any) -> None:
    """Raise unless ``batch`` (from a collator of this module) is exact on ``model``'s attention backend.

    A shared-prompt batch built for one backend is silently wrong on another: sdpa ignores the tree
    kwargs and would cut the completions off their prompt, and padless attention refuses a 4D mask.
    Consumers such as ``sequence_logprobs`` call this before the forward. Which backend takes what is
    the backend table's (:data:`padless.attention.select.BACKENDS`): the tree kwargs are padless
    attention's, a 4D mask is for the backends whose inputs are ``mask4d``."""
    from padless.attention.backend import BACKEND_NAME
    from padless.attention.select import BACKENDS

    backend = model.config._attn_implementation
    spec = BACKENDS.get(backend)
    takes_mask4d = spec is not None and spec.inputs == "mask4d"
    if "tree_cu_seqlens" in batch and backend != BACKEND_NAME:
        raise ValueError(
            f"this shared-prompt batch carries tree_cu_seqlens for padless attention, which "
            f"attn_implementation={backend!r} ignores; build it with PreferenceCollator.for_model(model)"
        )
    mask = batch.get("attention_mask")
    if mask is not None and getattr(mask, "ndim", 0) == 4 and not takes_mask4d:
        raise ValueError(
            f"this batch carries a 4D mask for sdpa/eager, but the model uses {backend!r}; "
            "build it with PreferenceCollator.for_model(model)"
        )
    if "tree_cu_seqlens" not in batch and mask is None and backend != BACKEND_NAME and is_tree(batch):
        raise ValueError(f"this shared-prompt batch has neither a tree mask nor tree kwargs; {backend!r} cannot run it")
    if "tree_cu_seqlens" not in batch and not is_tree(batch):  # documents only: the shared batch check
        from padless.attention.accept import check_batch

        check_batch(model, batch)


class PairedBatch(PackedBatch):
    """A :class:`PackedBatch` of preference pairs: ``padless.sequence_logprobs`` returns ``[num_pairs, 2]``."""

    pairs = True
    kept: np.ndarray | None = None
    """Indices (into the features given) of the groups in the batch, after ``overlong='drop'``."""


class GroupBatch(PackedBatch):
    """A :class:`PackedBatch` of rollout groups: features are all completions, group after group."""

    pairs = False
    kept: np.ndarray | None = None
    """Indices (into the features given) of the groups in the batch, after ``overlong='drop'``."""
    rollouts: dict[str, Any] | None = None
    """The completions in TRL's ``(B, T)`` layout and the rollout fields given (the module docstring)."""


@dataclass(frozen=True)
class _Group:
    """One validated group. ``completions[j]`` are the tokens packed (an empty rollout: one
    placeholder token), ``labels[j]`` their unshifted labels; ``values[name][j]`` a rollout field of
    completion ``j``: per token (aligned with its real tokens) or, for per-completion advantages, 0-d."""

    prompt: np.ndarray
    completions: tuple[np.ndarray, ...]
    labels: tuple[np.ndarray, ...]
    empty: tuple[bool, ...]
    """Per completion: no token was given (``completions[j]`` is the placeholder)."""
    values: Mapping[str, tuple[np.ndarray, ...]] = field(default_factory=dict)

    def real(self, j: int) -> int:
        """Tokens of completion ``j`` that were given (the placeholder is none)."""
        return 0 if self.empty[j] else self.completions[j].size

    @property
    def given(self) -> int:
        """Tokens of the group as given: one prompt and every completion."""
        return self.prompt.size + sum(self.real(j) for j in range(len(self.completions)))

    def cut(self, prompt: int, cap: int) -> _Group:
        """The group with the prompt's last ``prompt`` tokens and each completion's first ``cap``
        (``cap >= 1``: a placeholder stays), its per-token values cut with the tokens."""
        values = {k: tuple(a[:cap] if a.ndim else a for a in v) for k, v in self.values.items()}
        return _Group(
            self.prompt[self.prompt.size - prompt :],
            tuple(c[:cap] for c in self.completions),
            tuple(lab[:cap] for lab in self.labels),
            self.empty,
            values,
        )


def _fit(prompt: int, completions: np.ndarray, max_length: int, copies: int) -> tuple[int, int]:
    """``(prompt tokens kept, completion cap)`` so that ``copies * p + sum(min(C, cap)) <= max_length``:
    the prompt keeps what leaves one token per completion, then completions share the rest."""
    k = completions.size
    p = min(prompt, (max_length - k) // copies)
    if p < 1:
        raise ValueError(
            f"max_length={max_length} cannot hold one prompt token and one token of each of {k} "
            "completions; raise max_length"
        )
    budget = max_length - copies * p
    low, high = 1, int(completions.max())  # largest cap whose completions fit the budget
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if int(np.minimum(completions, mid).sum()) <= budget else (low, mid - 1)
    return p, low


@dataclass(frozen=True, kw_only=True)
class _GroupCollator(RowFormat):
    """A :class:`padless.batching.rowformat.RowFormat` whose pieces are groups (a prompt and its
    completions): ``max_length`` ``None`` puts every group of the batch in one row; ``strategy`` may
    not be ``wrapped`` (it cuts groups); ``overlong`` is one of :data:`GROUP_OVERLONG`; ``attention``
    ``position_ids`` serves the independent layout only; ``windows`` too (the tree mask of a shared
    prompt carries none); ``features.separator_id`` (EOS) is appended to every completion."""

    share_prompt: bool = True
    """Put the prompt once before its completions (tree mask) instead of once per completion."""
    totals: dict[str, int] = field(
        default_factory=lambda: {
            "groups": 0,
            "completions": 0,
            "tokens": 0,
            "truncated_groups": 0,
            "truncated_tokens": 0,
            "dropped_groups": 0,
            "dropped_tokens": 0,
            "empty_completions": 0,
            "empty_groups": 0,
        }
    )
    """Running counts over every batch collated so far (``tokens``: as given, one prompt per group;
    ``empty_completions`` / ``empty_groups``: packed completions with no trained token, and packed
    groups whose completions all are, counted after ``overlong``)."""

    _batch_type = PackedBatch
    _checked_downstream = True  # sequence_logprobs checks each (model, batch) pair before the forward

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.share_prompt and self.attention == "position_ids":
            raise ValueError(
                "share_prompt=True needs attention='mask4d' (sdpa, eager) or 'varlen' (padless attention); "
                "position_ids alone cannot say that completions share a prompt"
            )
        if self.share_prompt and self.windows is not None:
            raise ValueError(
                f"the 4D tree mask of a shared prompt carries no sliding window (windows={self.windows!r}); "
                "use share_prompt=False"
            )
        if self.overlong not in GROUP_OVERLONG:
            raise ValueError(
                f"unknown overlong policy {self.overlong!r} for groups; choose one of "
                f"{', '.join(GROUP_OVERLONG)} (a group never splits across rows)"
            )
        if self.strategy == "wrapped":
            raise ValueError("strategy='wrapped' cuts sequences across rows; a group never splits, choose another")

    @classmethod
    def layout_of(cls, options: Mapping[str, Any]) -> Layout:
        return "shared_prompt" if options.get("share_prompt", True) else "documents"

    # subclasses: features -> groups
    def _read(self, features: Sequence[Mapping[str, Any]]) -> list[_Group]:
        raise NotImplementedError

    def _tokens(self, values: Any, where: str) -> np.ndarray:
        return self.features.tokens(values, where)

    def _completion(self, values: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
        return self.features.sequence(values, None, where)

    def _fitted(self, groups: list[_Group]) -> tuple[list[_Group], np.ndarray]:
        """Apply ``overlong``; returns the groups to place and the indices of those kept."""
        copies = lambda g: 1 if self.share_prompt else len(g.completions)  # noqa: E731
        unit = lambda g: copies(g) * g.prompt.size + sum(c.size for c in g.completions)  # noqa: E731
        t = self.totals
        t["groups"] += len(groups)
        t["completions"] += sum(len(g.completions) for g in groups)
        t["tokens"] += sum(g.given for g in groups)
        kept, out = [], []
        for i, g in enumerate(groups):
            if self.max_length is None or unit(g) <= self.max_length:
                kept.append(i)
                out.append(g)
                continue
            if self.overlong == "error":
                raise ValueError(
                    f"group {i} needs {unit(g)} tokens in a row (share_prompt={self.share_prompt}), more "
                    f"than the collator's max_length={self.max_length}, and overlong='error' refuses it: "
                    "raise max_length, or choose overlong='truncate' or 'drop'"
                )
            if self.overlong == "drop":
                t["dropped_groups"] += 1
                t["dropped_tokens"] += g.given
                continue
            sizes = np.array([c.size for c in g.completions])
            cut = g.cut(*_fit(g.prompt.size, sizes, self.max_length, copies(g)))
            t["truncated_groups"] += 1
            t["truncated_tokens"] += g.given - cut.given
            kept.append(i)
            out.append(cut)
        if not out:
            raise ValueError("every group of the batch was dropped by overlong='drop'; nothing to train on")
        empty = [[not (lab != IGNORE_INDEX).any() for lab in g.labels] for g in out]
        t["empty_completions"] += sum(map(sum, empty))
        t["empty_groups"] += sum(map(all, empty))
        return out, np.array(kept, dtype=np.int64)

    def _rows(self, groups: list[_Group]) -> list[list[int]]:
        if self.max_length is None:
            return [list(range(len(groups)))]
        from padless.planning.plan import plan_packs

        copies = [1 if self.share_prompt else len(g.completions) for g in groups]
        units = [c * g.prompt.size + sum(x.size for x in g.completions) for c, g in zip(copies, groups)]
        plan = plan_packs(units, self.max_length, strategy=self.strategy, overlong="error")
        return [plan.row(r)[0].tolist() for r in range(plan.num_rows)]

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> PackedBatch:
        from padless.attention.tree import additive_tree_mask

        if len(features) == 0:
            raise ValueError("the batch is empty: a collator needs at least one feature")
        groups = self._read(features)
        self._check_verdict()  # a fitted collator whose settings changed since is refused
        groups, kept = self._fitted(groups)
        first_feature = np.concatenate([[0], np.cumsum([len(g.completions) for g in groups])])
        rows = self._rows(groups)
        lay = share_prompt if self.share_prompt else _independent
        layouts = [_relabel(lay(g.prompt, g.completions, checked=True), g.labels) for g in groups]
        pieces: list[tuple[int, int, int, int, int]] = []  # per completion: feature, row, offset, length, prev
        row_parts: list[list[GroupLayout]] = []
        for r, row in enumerate(rows):
            offset = 0
            for gi in row:
                g = layouts[gi]
                for j, (o, prev) in enumerate(zip(g.completion_offsets, g.prev_offsets)):
                    pieces.append(
                        (
                            int(first_feature[gi]) + j,
                            r,
                            offset + int(o),
                            groups[gi].completions[j].size,
                            offset + int(prev),
                        )
                    )
                offset += g.input_ids.size
            row_parts.append([layouts[gi] for gi in row])
        width = self.row_width(max(sum(g.input_ids.size for g in parts) for parts in row_parts))
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        labels = np.full_like(input_ids, IGNORE_INDEX)
        position_ids = np.zeros_like(input_ids)
        trees: list[tuple[np.ndarray, np.ndarray]] = []
        for r, parts in enumerate(row_parts):
            n = sum(g.input_ids.size for g in parts)
            input_ids[r, :n] = np.concatenate([g.input_ids for g in parts])
            labels[r, :n] = np.concatenate([g.labels for g in parts])
            position_ids[r, :n] = np.concatenate([g.position_ids for g in parts])
            position_ids[r, n:] = np.arange(width - n)
            base = np.cumsum([0] + [g.segment_lengths.size for g in parts])
            lengths = [*(g.segment_lengths for g in parts), *([[width - n]] if n < width else [])]
            parents = [*(np.where(g.parents >= 0, g.parents + b, -1) for g, b in zip(parts, base)),
                       *([[-1]] if n < width else [])]  # the pad: its own segment, positions from 0  # fmt: skip
            trees.append((np.concatenate(lengths).astype(np.int64), np.concatenate(parents).astype(np.int64)))
        if not self.share_prompt:  # plain documents: the row format's mask (windows included) or cu_seq_lens
            batch = self.row_inputs(input_ids, labels, position_ids, [lengths.tolist() for lengths, _ in trees])
        else:
            batch = self.row_inputs(input_ids, labels, position_ids, None)
            if self.attention == "mask4d":
                batch["attention_mask"] = additive_tree_mask(trees, dtype=self.mask_dtype)
            else:  # varlen: padless attention's tree kwargs
                base = np.cumsum([0] + [lengths.size for lengths, _ in trees[:-1]])
                cu = cu_seqlens_from_lengths(np.concatenate([lengths for lengths, _ in trees]))
                parents = np.concatenate([np.where(p >= 0, p + b, -1) for (_, p), b in zip(trees, base)])
                batch.update(
                    tree_cu_seqlens=torch.from_numpy(cu).to(torch.int32), tree_parents=torch.from_numpy(parents)
                )
        arr = np.array(pieces, dtype=np.int64).reshape(-1, 5)
        placements = Placements(
            feature=arr[:, 0],
            start=np.zeros(len(arr), dtype=np.int64),
            row=arr[:, 1],
            offset=arr[:, 2],
            length=arr[:, 3],
            num_features=int(first_feature[-1]),
            prev_offset=arr[:, 4],
        )
        out = self._batch_type(batch, placements)
        out.kept = kept
        self._carry(out, groups)
        return out

    def _carry(self, batch: PackedBatch, groups: list[_Group]) -> None:
        """Attach what the batch carries besides the model inputs (subclasses; the packed groups)."""


@dataclass(frozen=True)
class GroupLayout:
    """One group (a prompt and ``k`` completions) laid out as a stretch of a row; int64 arrays."""

    input_ids: np.ndarray
    """``[n]`` tokens."""
    labels: np.ndarray
    """``[n]`` the completion tokens, ``IGNORE_INDEX`` on the prompt (unshifted)."""
    position_ids: np.ndarray
    """``[n]`` positions; each completion continues from its prompt's length."""
    segment_lengths: np.ndarray
    """``[S]`` segments of the stretch (prompt, completions; or one document per completion)."""
    parents: np.ndarray
    """``[S]`` each segment's parent segment (local index), -1 for none."""
    completion_offsets: np.ndarray
    """``[k]`` offset of each completion's first token."""
    prev_offsets: np.ndarray
    """``[k]`` offset of the token that predicts each completion's first token (its prompt's last)."""


def _as_group(prompt_ids: Any, completion_ids: Sequence[Any], checked: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    if checked:
        return prompt_ids, list(completion_ids)
    if len(completion_ids) == 0:
        raise ValueError("completion_ids must hold at least one completion")
    prompt = check_tokens(prompt_ids, where="prompt_ids")[0]
    return prompt, [check_tokens(c, where=f"completion_ids[{j}]")[0] for j, c in enumerate(completion_ids)]


def share_prompt(prompt_ids: Any, completion_ids: Sequence[Any], *, checked: bool = False) -> GroupLayout:
    """The shared-prompt layout of one group: the prompt once, then each completion, each attending to
    the prompt and not to the others (segments ``[P, C_1, ..., C_k]``, parents ``[-1, 0, ..., 0]``),
    positions of every completion running ``P, P + 1, ...``::

        share_prompt([7, 8, 9], [[1, 2], [3]])
        input_ids     7    8    9  1  2  3
        position_ids  0    1    2  3  4  3
        labels     -100 -100 -100  1  2  3     prev_offsets [2, 2]: the prompt's last token predicts both
    """
    prompt, comps = _as_group(prompt_ids, completion_ids, checked)
    sizes = np.array([c.size for c in comps], dtype=np.int64)
    p = prompt.size
    starts = p + np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return GroupLayout(
        input_ids=np.concatenate([prompt, *comps]),
        labels=np.concatenate([np.full(p, IGNORE_INDEX, dtype=np.int64), *comps]),
        position_ids=np.concatenate([np.arange(p), *(p + np.arange(n) for n in sizes)]).astype(np.int64),
        segment_lengths=np.concatenate([[p], sizes]).astype(np.int64),
        parents=np.array([-1] + [0] * sizes.size, dtype=np.int64),
        completion_offsets=starts.astype(np.int64),
        prev_offsets=np.full(sizes.size, p - 1, dtype=np.int64),
    )


def _relabel(layout: GroupLayout, labels: Sequence[np.ndarray]) -> GroupLayout:
    """``layout`` with each completion's labels replaced by ``labels[j]`` (tool results masked)."""
    out = layout.labels.copy()
    for o, lab in zip(layout.completion_offsets, labels):
        out[o : o + lab.size] = lab
    return replace(layout, labels=out)


def _independent(prompt_ids: Any, completion_ids: Sequence[Any], *, checked: bool = False) -> GroupLayout:
    """The independent layout: one document ``prompt + completion`` per completion."""
    prompt, comps = _as_group(prompt_ids, completion_ids, checked)
    p, masked = prompt.size, np.full(prompt.size, IGNORE_INDEX, dtype=np.int64)
    sizes = np.array([p + c.size for c in comps], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) + p
    return GroupLayout(
        input_ids=np.concatenate([x for c in comps for x in (prompt, c)]),
        labels=np.concatenate([x for c in comps for x in (masked, c)]),
        position_ids=np.concatenate([np.arange(n) for n in sizes]).astype(np.int64),
        segment_lengths=sizes,
        parents=np.full(sizes.size, -1, dtype=np.int64),
        completion_offsets=starts.astype(np.int64),
        prev_offsets=(starts - 1).astype(np.int64),
    )


def _need(feature: Any, i: int, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(feature, Mapping):
        raise ValueError(f"feature {i} is a {type(feature).__name__}, expected a mapping with keys {', '.join(keys)}")
    missing = [k for k in keys if k not in feature]
    if missing:
        raise ValueError(f"feature {i} has no {', '.join(repr(k) for k in missing)} (it has {sorted(feature)})")
    from padless.batching.rowformat import VISION_KEYS

    images = [k for k in feature if k in VISION_KEYS and k != "token_type_ids"]
    if images:  # never dropped: a batch without them would score image placeholder tokens as text
        raise ValueError(
            f"feature {i} carries image inputs ({', '.join(map(repr, images))}): this collator does not carry "
            "images (padless.PackingCollator.for_model(model) and padless.PaddingCollator do); remove the image records"
        )
    return feature


@dataclass(frozen=True, kw_only=True)
class PreferenceCollator(_GroupCollator):
    """Packs preference pairs (``prompt_ids``, ``chosen_ids``, ``rejected_ids``) into rows; returns a
    :class:`PairedBatch` (``sequence_logprobs`` -> ``[num_pairs, 2]``, chosen first). See the module
    docstring for the two layouts, ``share_prompt`` and the overlong policies."""

    _batch_type = PairedBatch

    def _read(self, features: Sequence[Mapping[str, Any]]) -> list[_Group]:
        keys = ("prompt_ids", "chosen_ids", "rejected_ids")
        groups = []
        for i, f in enumerate(features):
            f = _need(f, i, keys)
            pair = [self._completion(f[k], f"feature {i} {k}") for k in keys[1:]]
            groups.append(
                _Group(
                    self._tokens(f["prompt_ids"], f"feature {i} prompt_ids"),
                    tuple(c for c, _ in pair),
                    tuple(lab for _, lab in pair),
                    (False, False),
                )
            )
        return groups


@dataclass(frozen=True, kw_only=True)
class RolloutCollator(_GroupCollator):
    """Packs GRPO-style groups (``prompt_ids`` and ``completion_ids``, a list of ``k >= 1`` completions)
    into rows; the batch's features are every completion, group after group, so
    ``sequence_logprobs(model, batch, per_token=True)`` gives each rollout's per-token log-probs.

    A group may carry the rollout fields of :data:`ROLLOUT_FIELDS` (``completion_mask``, ``tool_mask``,
    ``advantages``, ``old_per_token_logps``, ``ref_per_token_logps``); the batch returns them as
    :attr:`GroupBatch.rollouts` in TRL's ``(B, T)`` completion layout, with ``completion_mask`` the
    trained tokens (the module docstring). :func:`rollout_features` builds the groups from TRL's
    padded tensors."""

    _batch_type = GroupBatch

    def _read(self, features: Sequence[Mapping[str, Any]]) -> list[_Group]:
        groups = []
        for i, f in enumerate(features):
            f = _need(f, i, ("prompt_ids", "completion_ids"))
            comps = f["completion_ids"]
            if isinstance(comps, (str, bytes)) or not hasattr(comps, "__len__") or len(comps) == 0:
                raise ValueError(f"feature {i} completion_ids must be a non-empty list of token-id lists")
            groups.append(self._group(f, i, len(comps)))
        for name in _ALL_OR_NONE:
            having = [i for i, g in enumerate(groups) if name in g.values]
            if having and len(having) < len(groups):
                missing = next(i for i, g in enumerate(groups) if name not in g.values)
                raise ValueError(
                    f"feature {missing} has no {name}, but feature {having[0]} has: give {name} for "
                    "every group of the batch or for none"
                )
        return groups

    def _group(self, f: Mapping[str, Any], i: int, k: int) -> _Group:
        """Feature ``i`` (a group of ``k`` completions) validated: padding stripped, tool results masked."""
        prompt = self._tokens(f["prompt_ids"], f"feature {i} prompt_ids")
        given = {name: f[name] for name in ROLLOUT_FIELDS if f.get(name) is not None}
        for name, entries in given.items():
            n = _count(entries)
            if n != k:
                what = "values" if name == "advantages" else "entries"
                raise ValueError(
                    f"feature {i} {name} has {'no list of' if n is None else n} {what} for {k} "
                    f"completions; give one per completion_ids entry"
                )
        sep = self.features.separator_id
        comps, labels, empty = [], [], []
        values: dict[str, list[np.ndarray]] = {name: [] for name in given if name != "completion_mask"}
        for j, c in enumerate(f["completion_ids"]):
            where = f"feature {i} completion_ids[{j}]"
            ids = _array(c, where, int)
            mask = (
                _mask(
                    given["completion_mask"][j],
                    ids.size,
                    f"feature {i} completion_mask[{j}]",
                    f"{ids.size} tokens of completion_ids[{j}]",
                )
                if "completion_mask" in given
                else None
            )
            n = ids.size if mask is None else int(mask.sum())
            if mask is not None and not mask[:n].all():
                raise ValueError(
                    f"feature {i} completion_mask[{j}] has a 0 at token {int(np.argmin(mask))} before a 1 "
                    f"at token {int(np.flatnonzero(mask)[-1])}: a completion's mask is 1...1 0...0 "
                    "(trailing padding); mark tool results inside a completion with tool_mask"
                )
            per_token = {}
            for name in values:
                label = f"feature {i} {name}[{j}]"
                if name == "tool_mask":
                    per_token[name] = _mask(
                        given[name][j], ids.size, label, f"{ids.size} tokens of completion_ids[{j}]"
                    )
                    continue
                a = _array(given[name][j], label, float)
                if name == "advantages" and a.ndim == 0:
                    _finite(a, label, "advantages")
                    values[name].append(a.astype(np.float32))
                    continue
                if a.size != ids.size:
                    raise ValueError(
                        f"{label} has {a.size} values for the {ids.size} tokens of completion_ids[{j}]"
                        + ("" if name == "advantages" else ": from another batch?")
                    )
                _finite(a[:n], label, "advantages" if name == "advantages" else "log-probs")
                per_token[name] = a
            if sep is not None and per_token:
                raise ValueError(
                    f"feature {i} {next(iter(per_token))} gives one value per completion token, but "
                    f"features.separator_id={sep} appends a token it has no value for; TRL's completions "
                    "end with their EOS already: build the RolloutCollator without separator_id"
                )
            for name, a in per_token.items():
                values[name].append(a[:n].astype(np.int64 if name == "tool_mask" else np.float32))
            if n == 0:  # an empty rollout: one untrained placeholder keeps its place (and its sum at 0)
                comps.append(np.array([self.pad_token_id], dtype=np.int64))
                labels.append(np.array([IGNORE_INDEX], dtype=np.int64))
            else:
                tool = per_token.get("tool_mask")
                lab = None if tool is None else np.where(tool[:n] == 1, ids[:n], IGNORE_INDEX)
                tokens, lab = self.features.sequence(ids[:n], lab, where)
                comps.append(tokens)
                labels.append(lab)
            empty.append(n == 0)
        return _Group(prompt, tuple(comps), tuple(labels), tuple(empty), {k: tuple(v) for k, v in values.items()})

    def _carry(self, batch: PackedBatch, groups: list[_Group]) -> None:
        batch.rollouts = _rollout_tensors(groups, self.pad_token_id)


def _array(values: Any, where: str, kind: type) -> np.ndarray:
    """``values`` (a list, numpy array or tensor) as a 1-D int64 or a float64 array (0-d allowed for floats)."""
    values = _host(values)
    try:
        a = np.asarray(values, dtype=np.float64 if kind is float else None)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} is not a flat list of numbers ({exc})") from None
    if a.ndim > 1 or (a.ndim == 0 and kind is int):
        raise ValueError(f"{where} must be a 1-D list, got shape {a.shape}")
    if kind is int:
        if a.size and not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.bool_)):
            raise ValueError(f"{where} must hold integers, got {a.dtype}")
        a = a.astype(np.int64)
    return a


def _mask(values: Any, size: int, where: str, of: str) -> np.ndarray:
    """A 0/1 mask of ``size`` values as int64."""
    m = _array(values, where, int)
    if m.size != size:
        raise ValueError(f"{where} has {m.size} values for the {of}; a mask has one value per token")
    if ((m != 0) & (m != 1)).any():
        raise ValueError(f"{where} holds {int(m[(m != 0) & (m != 1)][0])}; a mask holds 0 and 1 only")
    return m


def _finite(a: np.ndarray, where: str, what: str) -> None:
    """Refuse a non-finite value of ``a`` (0-d: one per completion; 1-D: per token)."""
    bad = np.flatnonzero(~np.isfinite(a.reshape(-1)))
    if bad.size:
        at = f" at token {int(bad[0])}" if a.ndim else ""
        raise ValueError(f"{where} is {a.reshape(-1)[bad[0]]}{at}; {what} must be finite")


def _count(entries: Any) -> int | None:
    """How many entries a per-completion field has (``None``: not a list)."""
    if isinstance(entries, (str, bytes, Mapping)):
        return None
    try:
        return len(entries)
    except TypeError:  # a number, a 0-d array or tensor
        return None


def _rollout_tensors(groups: list[_Group], pad_token_id: int) -> dict[str, Any]:
    """The packed groups' completions in TRL's ``(B, T)`` layout (the module docstring)."""
    flat = [(g, j) for g in groups for j in range(len(g.completions))]
    lengths = np.array([g.real(j) for g, j in flat], dtype=np.int64)  # [B]
    inside = np.arange(int(lengths.max())) < lengths[:, None]  # [B, T]: row b's first lengths[b] columns
    real = lambda arrays: np.concatenate([a[:n] for a, n in zip(arrays, lengths)])  # noqa: E731  row-major order
    ids = np.full(inside.shape, pad_token_id, dtype=np.int64)
    ids[inside] = real([g.completions[j] for g, j in flat])
    trained = np.zeros(inside.shape, dtype=np.int64)
    trained[inside] = real([g.labels[j] != IGNORE_INDEX for g, j in flat])
    out = {"completion_ids": ids, "completion_mask": trained, "completion_lengths": lengths}
    names = sorted({name for g in groups for name in g.values}, key=ROLLOUT_FIELDS.index)
    for name in names:
        dtype = np.int64 if name == "tool_mask" else np.float32
        arrays = [g.values[name][j] if name in g.values else np.ones(g.real(j), dtype) for g, j in flat]
        if name == "advantages" and all(a.ndim == 0 for a in arrays):
            out[name] = np.array(arrays, dtype=np.float32)  # [B]
            continue
        arrays = [np.full(n, a, dtype) if a.ndim == 0 else a for a, n in zip(arrays, lengths)]
        table = np.zeros(inside.shape, dtype=dtype)
        table[inside] = real(arrays)
        out[name] = table
    return {k: torch.from_numpy(v) for k, v in out.items()}


def rollout_features(
    prompt_ids: Any,
    prompt_mask: Any,
    completion_ids: Any,
    completion_mask: Any,
    *,
    num_generations: int | None = None,
    tool_mask: Any = None,
    advantages: Any = None,
    old_per_token_logps: Any = None,
    ref_per_token_logps: Any = None,
) -> list[dict[str, Any]]:
    """:class:`RolloutCollator` group features from TRL ``GRPOTrainer``'s padded tensors.

    ``prompt_ids`` / ``prompt_mask`` ``[B, P]`` left-padded (``0...0 1...1``), ``completion_ids`` /
    ``completion_mask`` ``[B, T]`` right-padded (``1...1 0...0``; a row of zeros is an empty rollout),
    ``tool_mask``, ``old_per_token_logps``, ``ref_per_token_logps`` ``[B, T]``, ``advantages`` ``[B]``
    or ``[B, T]``; tensors (any device) or arrays. The padding is stripped (per-token values with
    their tokens), and rows become groups: consecutive rows with the same prompt, or, given
    ``num_generations``, exactly that many consecutive rows, which must share their prompt. A group
    never splits: the collator packs it whole. Returns one feature per group, rows in order, so the
    batch's ``(B, T)`` rows are these rows (while no group is dropped)::

        prompt_ids [[0, 5, 6], [0, 5, 6], [7, 8, 9]]   prompt_mask [[0, 1, 1], [0, 1, 1], [1, 1, 1]]
        completion_ids [[1, 2], [3, 0], [4, 0]]        completion_mask [[1, 1], [1, 0], [1, 0]]
        -> [{"prompt_ids": [5, 6], "completion_ids": [[1, 2], [3]]},
            {"prompt_ids": [7, 8, 9], "completion_ids": [[4]]}]
    """
    tables = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": advantages,
              "old_per_token_logps": old_per_token_logps, "ref_per_token_logps": ref_per_token_logps}  # fmt: skip
    t = {k: _table(v, k) for k, v in tables.items() if v is not None}
    rows, width = t["completion_ids"].shape
    if t["prompt_ids"].shape[0] != rows:
        raise ValueError(
            f"prompt_ids has {t['prompt_ids'].shape[0]} rows, completion_ids {rows}; one prompt per completion"
        )
    for name, a in t.items():
        ref = "prompt_ids" if name == "prompt_mask" else "completion_ids"
        if (
            name not in ("prompt_ids", "completion_ids")
            and a.shape != t[ref].shape
            and not (name == "advantages" and a.shape == (rows,))
        ):
            also = f" or ({rows},)" if name == "advantages" else ""
            raise ValueError(
                f"{name} has shape {a.shape}, but {ref} has {t[ref].shape}; it must be {t[ref].shape}{also}"
            )
    prompts, lengths = [], []
    for b in range(rows):
        pm = _mask(t["prompt_mask"][b], t["prompt_mask"].shape[1], f"prompt_mask row {b}", "prompt")
        p = int(pm.sum())
        if p == 0 or not pm[pm.size - p :].all():
            raise ValueError(
                f"prompt_mask row {b} is {'all zero' if p == 0 else 'not 0...0 1...1'}: prompts are "
                "left-padded and every rollout needs a prompt"
            )
        prompts.append(t["prompt_ids"][b, pm.size - p :].astype(np.int64))
        cm = _mask(t["completion_mask"][b], width, f"completion_mask row {b}", "completion")
        n = int(cm.sum())
        if not cm[:n].all():
            raise ValueError(
                f"completion_mask row {b} has a 0 at token {int(np.argmin(cm))} before a 1: completions "
                "are right-padded (1...1 0...0); mark tool results with tool_mask"
            )
        lengths.append(n)
    starts = _group_starts(prompts, num_generations)
    features = []
    for lo, hi in zip(starts, [*starts[1:], rows]):
        f: dict[str, Any] = {
            "prompt_ids": prompts[lo],
            "completion_ids": [t["completion_ids"][b, : lengths[b]].astype(np.int64) for b in range(lo, hi)],
        }  # noqa: E501
        for name in ("tool_mask", "advantages", "old_per_token_logps", "ref_per_token_logps"):
            if name in t:
                a = t[name]
                f[name] = [a[b] if a.ndim == 1 else a[b, : lengths[b]] for b in range(lo, hi)]
        features.append(f)
    return features


def _host(values: Any) -> Any:
    """A torch tensor (any device, any dtype: bfloat16 as float32) as a numpy array; anything else as is."""
    if not hasattr(values, "detach"):
        return values
    values = values.detach().cpu()
    return values.float().numpy() if values.is_floating_point() else values.numpy()


def _table(values: Any, name: str) -> np.ndarray:
    a = np.asarray(_host(values))
    if a.ndim not in ((1, 2) if name == "advantages" else (2,)):
        raise ValueError(
            f"{name} must be a [B, {'P' if name.startswith('prompt') else 'T'}] table, got shape {a.shape}"
        )
    return a


def _group_starts(prompts: list[np.ndarray], num_generations: int | None) -> list[int]:
    """First row of each group: where the prompt changes, or every ``num_generations`` rows (checked)."""
    same = lambda a, b: a.size == b.size and bool((a == b).all())  # noqa: E731
    if num_generations is None:
        return [b for b in range(len(prompts)) if b == 0 or not same(prompts[b], prompts[b - 1])]
    check_int(num_generations, "num_generations")
    if len(prompts) % num_generations:
        raise ValueError(
            f"num_generations={num_generations} does not divide the {len(prompts)} rows of completion_ids; "
            "a group never splits"
        )
    starts = list(range(0, len(prompts), num_generations))
    for g, lo in enumerate(starts):
        for b in range(lo + 1, lo + num_generations):
            if not same(prompts[b], prompts[lo]):
                raise ValueError(
                    f"rows {lo}..{lo + num_generations - 1} are group {g} (num_generations="
                    f"{num_generations}), but row {b}'s prompt differs from row {lo}'s"
                )
    return starts
