"""Which examples each optimiser step trains on, for the two benchmark modes (pure numpy)."""

from __future__ import annotations

import numpy as np


def same_example_steps(num_examples: int, steps: int, per_step: int, seed: int) -> list[np.ndarray]:
    """Indices of each step's examples: a seeded permutation cut into steps, reshuffled per epoch."""
    if num_examples < per_step:
        raise ValueError(f"the training split has {num_examples} examples; a step needs {per_step}")
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    order = rng.permutation(num_examples)
    cursor = 0
    while len(out) < steps:
        if cursor + per_step > order.size:
            order, cursor = rng.permutation(num_examples), 0
        out.append(order[cursor : cursor + per_step])
        cursor += per_step
    return out


def token_budget_steps(strategy: str, lengths: np.ndarray, steps: int, budget: int, seed: int) -> list[np.ndarray]:
    """Indices of each step's examples when a step may feed at most ``budget`` tokens, padding included.

    padding takes examples in order while ``count x longest`` fits; packing and flattening while the
    sum of lengths fits; bucketing takes length-grouped batches (a different order, the same budget).
    """
    from padless.batching.samplers import LengthGroupedBatchSampler

    rng = np.random.default_rng(seed)
    if strategy == "bucketing":
        sampler = LengthGroupedBatchSampler(lengths, max_tokens=budget, seed=seed)
        batches: list[np.ndarray] = []
        while len(batches) < steps:
            sampler.set_epoch(sampler.epoch + 1)
            batches.extend(np.asarray(b) for b in sampler)
        return batches[:steps]
    padded = strategy == "padding"
    out: list[np.ndarray] = []
    order, cursor = rng.permutation(lengths.size), 0
    while len(out) < steps:
        take: list[int] = []
        longest = total = 0
        while True:
            if cursor == order.size:
                order, cursor = rng.permutation(lengths.size), 0
            n = int(lengths[order[cursor]])
            cost = max(longest, n) * (len(take) + 1) if padded else total + n
            if take and cost > budget:
                break
            take.append(int(order[cursor]))
            longest, total, cursor = max(longest, n), total + n, cursor + 1
        out.append(np.asarray(take))
    return out
