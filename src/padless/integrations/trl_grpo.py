"""padless' ``GRPOTrainer``: TRL 1.16's, with every log-prob pass (policy, old policy, reference) on
packed rows (:mod:`padless.integrations.trl_rl` for the whole story).

Every call of ``_get_per_token_logps_and_entropies`` rebuilds each row's prompt and completion from
TRL's masks, groups the rows that share prompt ids (:func:`_rollout_groups`), packs the groups with
:class:`padless.RolloutCollator` for the model and returns TRL's ``(B, T)`` log-probs and entropies
(:func:`padless.objectives.rollouts.completion_token_stats`), in forward chunks of at most TRL's
``batch_size`` completions, or dealt by cost (``balance="cost"``, :func:`_forward_chunks`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from padless._optional import require

require("trl", "padless.integrations.trl")

import torch  # noqa: E402
import trl  # noqa: E402

from padless.integrations.trainer_boundary import trainer_words  # noqa: E402
from padless.integrations.trl_logprobs import (  # noqa: E402
    _check_group_sizes,
    _PackedLogprobs,
    _refuse_multimodal,
    _span,
)

GRPO_WORDS: dict[str, str] = {
    "max_length": "GRPOTrainer.max_length", "share_prompt": "GRPOTrainer.share_prompt",
    "balance": "GRPOTrainer.balance", "cost_a": "GRPOTrainer.cost_a",
    "backend": "attn_implementation='{backend}' when loading the model, or in GRPOConfig.model_init_kwargs",
}  # fmt: skip
"""Library argument -> where ``GRPOTrainer`` takes it (:func:`padless.integrations.transformers.in_trainer_words`)."""


def _rollout_groups(
    prompt_ids: Any, prompt_mask: Any, completion_ids: Any, completion_mask: Any
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """TRL's padded rollouts as :class:`padless.RolloutCollator` features, and the TRL row of every
    completion of those features, in feature order.

    ``prompt_ids``/``prompt_mask`` ``[B, P]`` left-padded, ``completion_ids``/``completion_mask``
    ``[B, C]`` right-padded (TRL 1.16's ``_generate_and_score_completions``). Rows with the same prompt
    ids form one group, in the order of their first row: TRL repeats each prompt ``num_generations``
    times and shuffles the generation batch before splitting it into micro-batches, so a micro-batch's
    rollouts of one prompt need not be adjacent. A row whose completion mask is all 0 (TRL's
    ``mask_truncated_completions``) is left out: TRL scores none of its tokens."""
    pid, pm, cid, cm = (t.detach().cpu().numpy() for t in (prompt_ids, prompt_mask, completion_ids, completion_mask))
    groups: dict[tuple[int, ...], list[int]] = {}
    for b in range(pid.shape[0]):
        p = _span(pm[b], "left", f"prompt_mask row {b}")
        c = _span(cm[b], "right", f"completion_mask row {b}")
        if c == 0:
            continue
        if p == 0:
            raise ValueError(f"rollout {b} has an empty prompt: nothing predicts its first completion token")
        groups.setdefault(tuple(pid[b, pid.shape[1] - p :].tolist()), []).append(b)
    features = [
        {"prompt_ids": list(prompt), "completion_ids": [cid[b, : int(cm[b].sum())].tolist() for b in rows]}
        for prompt, rows in groups.items()
    ]
    rows = np.array([b for members in groups.values() for b in members], dtype=np.int64)
    return features, rows


def _forward_chunks(
    features: list[dict[str, Any]],
    size: int,
    *,
    balance: str = "tokens",
    share_prompt: bool = False,
    cost_a: float | None = None,
) -> list[list[int]]:
    """Indices of the rollout ``features`` of each forward chunk, whole groups only.

    * ``balance="tokens"``: in order, runs of at most ``size`` completions (a group of more than ``size``
      completions is a run of its own).
    * ``balance="cost"``: the groups dealt to as many chunks as ``"tokens"`` makes, so that the chunks'
      costs (:func:`padless.planning.balance.group_loads` with ``share_prompt`` and ``cost_a``) are even:
      :func:`padless.planning.balance.balance_groups`, free counts, a group never split. A chunk may
      then hold more than ``size`` completions (many short ones); its cost is within the largest
      group's of the mean (the bound in :mod:`padless.planning.balance`). Each chunk's indices ascend.
    """
    runs, run, count = [], [], 0
    for i, f in enumerate(features):  # TRL's order: runs of at most size completions
        n = len(f["completion_ids"])
        if run and count + n > size:
            runs.append(run)
            run, count = [], 0
        run.append(i)
        count += n
    if run:
        runs.append(run)
    if balance == "tokens" or len(runs) <= 1:
        return runs
    from padless.planning.balance import balance_groups

    got = balance_groups(
        [len(f["prompt_ids"]) for f in features],
        [[len(c) for c in f["completion_ids"]] for f in features],
        (1, len(runs)),
        share_prompt=share_prompt,
        balance="cost",
        cost_a=cost_a,
    )
    return [got.items(0, m).tolist() for m in range(len(runs))]


class PackedGRPOTrainer(_PackedLogprobs, trl.GRPOTrainer):
    """``trl.GRPOTrainer`` whose log-prob passes run on packed rows (module docstring). Takes
    ``GRPOTrainer``'s arguments plus, keyword-only, ``share_prompt``, ``max_length``, ``balance``
    (``"tokens"``, default: forward chunks in TRL's order; ``"cost"``: groups dealt to the same number of
    chunks so that their costs are even, :func:`_forward_chunks`), ``cost_a`` (``"cost"`` only;
    default ``12 * hidden_size`` of the policy's config) and ``guard`` (``True``, default: the first packed
    forward checked on the model; ``False``; or an :class:`padless.IsolationGuard`)."""

    _padless_trainer_name = "GRPO"
    _padless_words = GRPO_WORDS

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: Any = None,
        *trl_args: Any,
        share_prompt: bool | None = None,
        max_length: int | None = None,
        balance: str = "tokens",
        cost_a: float | None = None,
        guard: Any = True,
        **trl_kwargs: Any,
    ) -> None:
        from padless.batching.preference import RolloutCollator
        from padless.integrations.transformers import balance_options
        from padless.planning.balance import BALANCES, check_balance
        from padless.planning.checks import check_choice

        self._padless_collator_type = RolloutCollator
        with trainer_words(GRPO_WORDS):
            self._padless_check(share_prompt, max_length)
            check_choice(balance, BALANCES, "balance")
            if cost_a is not None:
                check_balance(balance, cost_a)
            _refuse_multimodal("GRPOTrainer", trl_kwargs.get("processing_class"))
            super().__init__(model, reward_funcs, args, *trl_args, **trl_kwargs)
            if self.aux_loss_enabled:
                raise ValueError(
                    "GRPOTrainer: the MoE load-balancing loss (output_router_logits) is not computed on "
                    "packed rows yet; set GRPOConfig(router_aux_loss_coef=0.0) or train with trl.GRPOTrainer"
                )
            self._padless_balance = balance_options(
                self.model, balance, cost_a
            )  # a model named by a string: loaded now
            self._padless_setup(share_prompt, max_length, guard)

    def start_line(self) -> str:
        """:meth:`_PackedLogprobs.start_line`, saying so when the forward chunks are balanced by cost."""
        line = super().start_line()
        if self._padless_balance["balance"] == "cost":
            line += f", forward chunks balanced by cost a*l + l**2 (a={self._padless_balance['cost_a']:g})"
        return line

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[Any, Any, Any]:
        """TRL's ``(logps, entropies, aux_loss)`` of the last ``logits_to_keep`` positions of
        ``input_ids`` ``[B, P + T]`` (``[prompt | completion]``, ``attention_mask`` the two masks side by
        side), computed on packed rows: ``(B, T)`` float32, 0 where the completion mask is 0; entropies
        only with ``compute_entropy``; aux loss None. Forward chunks hold at most ``batch_size``
        completions, whole groups only; with ``balance="cost"`` as many chunks, of even cost
        (:func:`_forward_chunks`). Each chunk's log-probs go back to their TRL rows."""
        from padless.batching.batch import batch_to
        from padless.objectives.rollouts import completion_token_stats

        given = sorted(k for k, v in multimodal.items() if v is not None)
        if given:
            raise ValueError(
                f"GRPOTrainer: multimodal inputs ({', '.join(given)}) are not packed yet; train "
                "vision-language models with trl.GRPOTrainer"
            )
        if compute_aux_loss:
            raise ValueError("GRPOTrainer: the MoE load-balancing loss is not computed on packed rows yet")
        t = logits_to_keep
        features, rows = _rollout_groups(
            input_ids[:, :-t], attention_mask[:, :-t], input_ids[:, -t:], attention_mask[:, -t:]
        )
        if not features:  # every completion masked: nothing is scored, TRL's own pass returns its zeros
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss
            )
        with trainer_words(GRPO_WORDS):
            collator = self._padless_collator_for(model)
            _check_group_sizes(features, self._padless_max_length, collator.share_prompt, "GRPOTrainer")
        outputs = ("log_probs", "entropy") if compute_entropy else ("log_probs",)
        pieces: dict[str, list[Any]] = {name: [] for name in outputs}
        first = np.cumsum([0] + [len(f["completion_ids"]) for f in features])  # feature i: rows[first[i]:first[i + 1]]
        chunks = _forward_chunks(
            features, batch_size or input_ids.size(0), share_prompt=collator.share_prompt, **self._padless_balance
        )
        order = []  # the TRL row of each completion, in the order the chunks return them
        for chunk in chunks:
            batch = batch_to(collator([features[i] for i in chunk]), input_ids.device)
            with self.accelerator.autocast():
                stats = completion_token_stats(model, batch, width=t, temperature=self.temperature, outputs=outputs)
                self._padless_guarded(model, batch)
            for name in outputs:
                pieces[name].append(stats[name])
            order.extend(rows[first[i] : first[i + 1]] for i in chunk)
        index = torch.from_numpy(np.concatenate(order)).to(input_ids.device)
        full = {
            name: torch.cat(p).new_zeros(input_ids.size(0), t).index_copy(0, index, torch.cat(p))
            for name, p in pieces.items()
        }
        return full["log_probs"], full.get("entropy"), None


GRPOTrainer = PackedGRPOTrainer
"""The drop-in name: ``from padless.integrations.trl import GRPOTrainer``."""
