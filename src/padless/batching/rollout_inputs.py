"""TRL ``GRPOTrainer``'s padded rollout tensors -> :class:`padless.batching.rollouts.RolloutCollator`
group features (:func:`rollout_features`): the padding stripped, consecutive rows with one prompt made
one group.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from padless.batching.rollouts import host_values, mask_of
from padless.planning.checks import check_int


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
    tables = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": advantages,
        "old_per_token_logps": old_per_token_logps,
        "ref_per_token_logps": ref_per_token_logps,
    }
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
        pm = mask_of(t["prompt_mask"][b], t["prompt_mask"].shape[1], f"prompt_mask row {b}", "prompt")
        p = int(pm.sum())
        if p == 0 or not pm[pm.size - p :].all():
            raise ValueError(
                f"prompt_mask row {b} is {'all zero' if p == 0 else 'not 0...0 1...1'}: prompts are "
                "left-padded and every rollout needs a prompt"
            )
        prompts.append(t["prompt_ids"][b, pm.size - p :].astype(np.int64))
        cm = mask_of(t["completion_mask"][b], width, f"completion_mask row {b}", "completion")
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


def _table(values: Any, name: str) -> np.ndarray:
    a = np.asarray(host_values(values))
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
