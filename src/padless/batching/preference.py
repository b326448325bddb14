"""Preference pairs (DPO) packed into rows, with or without a shared prompt.

A preference pair is a group of 2 (``prompt_ids``; ``chosen_ids``, ``rejected_ids``): the layouts
(independent, or the prompt shared by both completions), the overlong policies and how to read the
batch are :mod:`padless.batching.groups`'. Pair ``i``'s chosen is feature ``2i``, its rejected
``2i + 1``; ``padless.sequence_logprobs(model, batch)`` returns ``[num_pairs, 2]``, chosen first.

Rollout groups (GRPO) are :mod:`padless.batching.rollouts`, built from TRL's tensors by
:mod:`padless.batching.rollout_inputs`; their public names import from here too, as they always have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from padless.batching.batch import PackedBatch
from padless.batching.groups import (  # noqa: F401 (re-exported: the group layouts' public names)
    GROUP_OVERLONG,
    Group,
    GroupCollator,
    GroupLayout,
    check_batch_for_model,
    need_keys,
    share_prompt,
)
from padless.batching.rollout_inputs import rollout_features  # noqa: F401 (re-exported)
from padless.batching.rollouts import ROLLOUT_FIELDS, GroupBatch, RolloutCollator  # noqa: F401 (re-exported)


class PairedBatch(PackedBatch):
    """A :class:`PackedBatch` of preference pairs: ``padless.sequence_logprobs`` returns ``[num_pairs, 2]``."""

    pairs = True
    kept: np.ndarray | None = None
    """Indices (into the features given) of the groups in the batch, after ``overlong='drop'``."""


@dataclass(frozen=True, kw_only=True)
class PreferenceCollator(GroupCollator):
    """Packs preference pairs (``prompt_ids``, ``chosen_ids``, ``rejected_ids``) into rows; returns a
    :class:`PairedBatch` (``sequence_logprobs`` -> ``[num_pairs, 2]``, chosen first). See
    :mod:`padless.batching.groups` for the two layouts, ``share_prompt`` and the overlong policies."""

    _batch_type = PairedBatch

    def _read(self, features: Sequence[Mapping[str, Any]]) -> list[Group]:
        keys = ("prompt_ids", "chosen_ids", "rejected_ids")
        groups = []
        for i, f in enumerate(features):
            f = need_keys(f, i, keys)
            pair = [self._completion(f[k], f"feature {i} {k}") for k in keys[1:]]
            groups.append(
                Group(
                    self._tokens(f["prompt_ids"], f"feature {i} prompt_ids"),
                    tuple(c for c, _ in pair),
                    tuple(lab for _, lab in pair),
                    (False, False),
                )
            )
        return groups
