"""Rollout groups (GRPO) packed into rows: :class:`RolloutCollator`, a group collator
(:mod:`padless.batching.groups`) that reads a prompt, ``k`` completions and TRL's rollout fields.

Rollout fields (:class:`RolloutCollator`), in TRL's ``GRPOTrainer`` names: a group feature may carry,
besides ``prompt_ids`` and ``completion_ids`` (``k`` lists), any of these, each a list with one entry
per completion (:func:`padless.batching.rollout_inputs.rollout_features` builds such features from TRL's padded tensors):

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from padless.batching.batch import PackedBatch
from padless.batching.groups import Group, GroupCollator, need_keys
from padless.layout import IGNORE_INDEX

ROLLOUT_FIELDS: tuple[str, ...] = (
    "completion_mask",
    "tool_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
)
"""The optional per-completion fields of a rollout group feature (TRL ``GRPOTrainer`` names)."""

_ALL_OR_NONE = ("advantages", "old_per_token_logps", "ref_per_token_logps")
"""Fields a batch carries for every group or for none (a tensor with holes has no meaning)."""


class GroupBatch(PackedBatch):
    """A :class:`PackedBatch` of rollout groups: features are all completions, group after group."""

    pairs = False
    kept: np.ndarray | None = None
    """Indices (into the features given) of the groups in the batch, after ``overlong='drop'``."""
    rollouts: dict[str, Any] | None = None
    """The completions in TRL's ``(B, T)`` layout and the rollout fields given (the module docstring)."""


@dataclass(frozen=True, kw_only=True)
class RolloutCollator(GroupCollator):
    """Packs GRPO-style groups (``prompt_ids`` and ``completion_ids``, a list of ``k >= 1`` completions)
    into rows; the batch's features are every completion, group after group, so
    ``sequence_logprobs(model, batch, per_token=True)`` gives each rollout's per-token log-probs.

    A group may carry the rollout fields of :data:`ROLLOUT_FIELDS` (``completion_mask``, ``tool_mask``,
    ``advantages``, ``old_per_token_logps``, ``ref_per_token_logps``); the batch returns them as
    :attr:`GroupBatch.rollouts` in TRL's ``(B, T)`` completion layout, with ``completion_mask`` the
    trained tokens (the module docstring). :func:`padless.batching.rollout_inputs.rollout_features` builds the groups from TRL's
    padded tensors."""

    _batch_type = GroupBatch

    def _read(self, features: Sequence[Mapping[str, Any]]) -> list[Group]:
        groups = []
        for i, f in enumerate(features):
            f = need_keys(f, i, ("prompt_ids", "completion_ids"))
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

    def _group(self, f: Mapping[str, Any], i: int, k: int) -> Group:
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
                mask_of(
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
                    per_token[name] = mask_of(
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
        return Group(prompt, tuple(comps), tuple(labels), tuple(empty), {k: tuple(v) for k, v in values.items()})

    def _carry(self, batch: PackedBatch, groups: list[Group]) -> None:
        batch.rollouts = _rollout_tensors(groups, self.pad_token_id)


def _array(values: Any, where: str, kind: type) -> np.ndarray:
    """``values`` (a list, numpy array or tensor) as a 1-D int64 or a float64 array (0-d allowed for floats)."""
    values = host_values(values)
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


def mask_of(values: Any, size: int, where: str, of: str) -> np.ndarray:
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


def _rollout_tensors(groups: list[Group], pad_token_id: int) -> dict[str, Any]:
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


def host_values(values: Any) -> Any:
    """A torch tensor (any device, any dtype: bfloat16 as float32) as a numpy array; anything else as is."""
    if not hasattr(values, "detach"):
        return values
    values = values.detach().cpu()
    return values.float().numpy() if values.is_floating_point() else values.numpy()
