"""Groups (a prompt and its completions) packed into rows, with or without a shared prompt: the layouts
and the collator base that preference pairs (:mod:`padless.batching.preference`) and rollout groups
(:mod:`padless.batching.rollouts`) share.

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
  (:func:`padless.attention.tree.shared_prompt_refusal`).

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

GROUP_OVERLONG: tuple[str, ...] = ("error", "truncate", "drop")
"""Overlong policies for groups (``split`` would cut a pair across rows)."""


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


@dataclass(frozen=True)
class Group:
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

    def cut(self, prompt: int, cap: int) -> Group:
        """The group with the prompt's last ``prompt`` tokens and each completion's first ``cap``
        (``cap >= 1``: a placeholder stays), its per-token values cut with the tokens."""
        values = {k: tuple(a[:cap] if a.ndim else a for a in v) for k, v in self.values.items()}
        return Group(
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
class GroupCollator(RowFormat):
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
            "placed_tokens": 0,
            "row_tokens": 0,
        }
    )
    """Running counts over every batch collated so far (``tokens``: as given, one prompt per group;
    ``empty_completions`` / ``empty_groups``: packed completions with no trained token, and packed
    groups whose completions all are, counted after ``overlong``; ``placed_tokens`` / ``row_tokens``:
    the tokens placed in rows and the rows' tokens, padding included: how full the rows are)."""

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
    def _read(self, features: Sequence[Mapping[str, Any]]) -> list[Group]:
        raise NotImplementedError

    def _tokens(self, values: Any, where: str) -> np.ndarray:
        return self.features.tokens(values, where)

    def _completion(self, values: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
        return self.features.sequence(values, None, where)

    def _fitted(self, groups: list[Group]) -> tuple[list[Group], np.ndarray]:
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

    def _rows(self, groups: list[Group]) -> list[list[int]]:
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
        self.totals["placed_tokens"] += sum(g.input_ids.size for parts in row_parts for g in parts)
        self.totals["row_tokens"] += len(rows) * width
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
            parents = [
                *(np.where(g.parents >= 0, g.parents + b, -1) for g, b in zip(parts, base)),
                *([[-1]] if n < width else []),  # the pad: its own segment, positions from 0
            ]
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

    def _carry(self, batch: PackedBatch, groups: list[Group]) -> None:
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


def need_keys(feature: Any, i: int, keys: tuple[str, ...]) -> Mapping[str, Any]:
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
