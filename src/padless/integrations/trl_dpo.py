"""padless' ``DPOTrainer``: TRL 1.16's, with the policy's and the reference's log-probs read off packed
pairs (:mod:`padless.integrations.trl_rl` for the whole story).

While TRL's ``compute_loss`` and ``compute_ref_log_probs`` run, the fused forward TRL put on the policy
(and the reference model) answers ``model(..., labels=..., fused_lm_head=True)`` from pairs packed by
:class:`padless.PreferenceCollator` (:meth:`PackedDPOTrainer._packed_forward`), with every per-token
field TRL reads in TRL's shifted ``(2B, L - 1)`` layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from padless._optional import require

require("trl", "padless.integrations.trl")

import torch  # noqa: E402
import trl  # noqa: E402

from padless.attention.adapters import without_ddp  # noqa: E402
from padless.integrations.trainer_boundary import trainer_words  # noqa: E402
from padless.integrations.trl_logprobs import (  # noqa: E402
    _check_group_sizes,
    _PackedLogprobs,
    _refuse_multimodal,
    _span,
)

DPO_WORDS: dict[str, str] = {
    "max_length": "DPOTrainer.max_length", "share_prompt": "DPOTrainer.share_prompt",
    "backend": "attn_implementation='{backend}' when loading the model, or in DPOConfig.model_init_kwargs",
}  # fmt: skip
"""Library argument -> where ``DPOTrainer`` takes it."""


def _preference_pairs(
    input_ids: Any, attention_mask: Any, labels: Any
) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray]:
    """TRL's padded DPO rows (``[2B, L]``: the chosen of pair ``i`` in row ``i``, its rejected in row
    ``B + i``, right-padded; ``labels`` -100 except on the completion) as
    :class:`padless.PreferenceCollator` features, the pair index of each feature and each pair's prompt
    length. A pair with an empty completion (a prompt that ``max_length`` cut to the end) is left out:
    TRL scores none of its tokens."""
    ids, att, lab = (t.detach().cpu().numpy() for t in (input_ids, attention_mask, labels))
    half = ids.shape[0] // 2
    features, pairs, prompt_lengths = [], [], []
    for i in range(half):
        parts = []
        for r in (i, half + i):
            n = _span(att[r], "right", f"attention_mask row {r}")
            trained = lab[r, :n] != -100
            c = int(trained.sum())
            if c and not trained[n - c :].all():
                raise ValueError(
                    f"DPO row {r}: its completion is not the end of its tokens; padless packs a "
                    "prompt followed by its completion"
                )
            parts.append((ids[r, : n - c].tolist(), ids[r, n - c : n].tolist()))
        (prompt, chosen), (other, rejected) = parts
        if not chosen or not rejected:
            continue
        if not prompt:
            raise ValueError(
                f"pair {i} has an empty prompt (its tokens all belong to the completions), so nothing "
                "predicts their first tokens; give every pair a prompt of at least one token"
            )
        if prompt != other:
            raise ValueError(
                f"pair {i}: the chosen and rejected rows hold different prompts ({len(prompt)} and "
                f"{len(other)} tokens), as DPOConfig(truncation_mode='keep_end') cuts them; padless packs "
                "one prompt per pair: use truncation_mode='keep_start' or a DPOConfig(max_length) that "
                "holds the pair"
            )
        features.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
        pairs.append(i)
        prompt_lengths.append(len(prompt))
    return features, np.array(pairs, dtype=np.int64), np.array(prompt_lengths, dtype=np.int64)


class PackedDPOTrainer(_PackedLogprobs, trl.DPOTrainer):
    """``trl.DPOTrainer`` whose policy and reference log-probs come from packed pairs (module
    docstring). Takes ``DPOTrainer``'s arguments plus, keyword-only, ``share_prompt``, ``max_length`` and
    ``guard`` (``True``, default: the first packed forward checked on the policy; ``False``; or an
    :class:`padless.IsolationGuard`)."""

    _padless_trainer_name = "DPO"
    _padless_words = DPO_WORDS

    def __init__(
        self,
        model: Any,
        ref_model: Any = None,
        args: Any = None,
        *trl_args: Any,
        share_prompt: bool | None = None,
        max_length: int | None = None,
        guard: Any = True,
        **trl_kwargs: Any,
    ) -> None:
        from padless.batching.preference import PreferenceCollator

        self._padless_collator_type = PreferenceCollator
        self._padless_active = False
        self._padless_ready = False
        self._padless_pending = (share_prompt, max_length, guard)
        with trainer_words(DPO_WORDS):
            self._padless_check(share_prompt, max_length)
            _refuse_multimodal("DPOTrainer", trl_kwargs.get("processing_class"))
            super().__init__(model, ref_model, args, *trl_args, **trl_kwargs)  # may precompute reference log-probs
            if self._is_vision_dataset:
                raise ValueError("DPOTrainer: image datasets are not packed yet; train them with trl.DPOTrainer")
            if self.aux_loss_enabled:
                raise ValueError(
                    "DPOTrainer: the MoE load-balancing loss is not computed on packed rows yet; set "
                    "DPOConfig(router_aux_loss_coef=0.0) or train with trl.DPOTrainer"
                )
            self._padless_ensure()

    def _padless_ensure(self) -> None:
        """Fit the collator once the policy exists (TRL may precompute reference log-probs inside its
        ``__init__``, before this class's ``__init__`` resumes)."""
        if not self._padless_ready:
            self._padless_ready = True
            self._padless_setup(*self._padless_pending)

    def _padless_modules(self) -> list[tuple[Any, tuple[str, ...]]]:
        """The modules TRL gave a fused LM head and the per-token fields it asked each for."""
        from accelerate.utils import is_peft_model

        policy = self.model.get_base_model() if is_peft_model(self.model) else self.model
        fields: tuple[str, ...] = ("log_probs", "entropy", "mean_logits", "is_top1")
        if self.use_weighting:
            fields += ("log_sum_sq_probs",)
        modules = [(policy, fields)]
        if self.ref_model is not None:
            modules.append((without_ddp(self.ref_model), ("log_probs",)))
        return modules

    @contextmanager
    def _packed_forwards(self) -> Iterator[None]:
        """While inside, TRL's fused forward calls (``fused_lm_head=True``) on the policy and the reference
        model run on packed pairs (:meth:`_packed_forward`); every other call is TRL's."""
        if self._padless_active:
            yield
            return
        self._padless_ensure()
        saved = []
        try:
            for module, fields in self._padless_modules():
                previous = module.__dict__.get("forward")
                saved.append((module, previous))
                module.forward = self._packed_forward(module, module.forward, fields)
            self._padless_active = True
            yield
        finally:
            self._padless_active = False
            for module, previous in reversed(saved):
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous

    def _packed_forward(self, module: Any, previous: Any, fields: tuple[str, ...]) -> Any:
        """``module``'s forward: TRL's ``previous`` one, except for ``fused_lm_head=True`` calls, answered
        with a ``FusedCausalLMOutput`` of ``fields`` computed on packed pairs, in TRL's layout."""

        def forward(*args: Any, fused_lm_head: bool = False, labels: Any = None, **kwargs: Any) -> Any:
            if not fused_lm_head:
                return previous(*args, labels=labels, **kwargs)
            return self._fused_from_packed(module, previous, args, labels, kwargs, fields)

        return forward

    def _fused_from_packed(
        self,
        module: Any,
        previous: Any,
        args: tuple[Any, ...],
        labels: Any,
        kwargs: dict[str, Any],
        fields: tuple[str, ...],
    ) -> Any:
        from trl.trainer.utils import FusedCausalLMOutput

        from padless.batching.batch import batch_to
        from padless.objectives.rollouts import completion_token_stats

        num_items = kwargs.pop("num_items_in_batch", None)
        plain = ("input_ids", "attention_mask", "use_cache")
        extra = sorted(k for k, v in kwargs.items() if k not in plain and v is not None)
        if args or extra:
            what = ", ".join(extra) or "positional inputs"
            raise ValueError(
                f"DPOTrainer: {what} cannot be packed yet (images, MoE router logits, TRL's shift_labels "
                "for context parallelism); train this set-up with trl.DPOTrainer"
            )
        input_ids, attention_mask = kwargs["input_ids"], kwargs["attention_mask"]
        with trainer_words(DPO_WORDS):
            features, pairs, prompt_lengths = _preference_pairs(input_ids, attention_mask, labels)
            if not features:  # nothing scored: TRL's own forward returns its zeros
                return previous(fused_lm_head=True, labels=labels, num_items_in_batch=num_items, **kwargs)
            collator = self._padless_collator_for(module)
            _check_group_sizes(features, self._padless_max_length, collator.share_prompt, "DPOTrainer")
            batch = batch_to(collator(features), input_ids.device)
        stats = completion_token_stats(module, batch, outputs=fields)
        if module is self._padless_modules()[0][0]:  # the policy (a separate reference model is not trained)
            self._padless_guarded(module, batch)  # [2N, T]: chosen 2k, rejected 2k + 1
        half, width = input_ids.size(0) // 2, input_ids.size(1) - 1
        f, t = stats["mask"].nonzero(as_tuple=True)  # every scored token: feature, column in its completion
        pair = torch.from_numpy(pairs).to(f.device)[f // 2]
        row = pair + half * (f % 2)  # TRL's row: chosen i, rejected B + i
        col = torch.from_numpy(prompt_lengths - 1).to(f.device)[f // 2] + t  # shifted: position p - 1 predicts p
        out = {name: stats[name].new_zeros(2 * half, width).index_put((row, col), stats[name][f, t]) for name in fields}
        mask = torch.zeros(2 * half, width, dtype=torch.bool, device=f.device).index_put(
            (row, col), torch.ones_like(f, dtype=torch.bool)
        )
        count = mask.sum().clamp(min=1) if num_items is None else num_items
        return FusedCausalLMOutput(loss=-out["log_probs"].sum() / count, label_mask=mask, **out)

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """TRL's DPO loss and metrics, on log-probs read from packed pairs."""
        with self._packed_forwards(), trainer_words(DPO_WORDS):
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )

    def compute_ref_log_probs(self, model: Any, inputs: Any) -> Any:
        """TRL's reference log-probs of one batch (``precompute_ref_log_probs``), from packed pairs."""
        with self._packed_forwards(), trainer_words(DPO_WORDS):
            return super().compute_ref_log_probs(model, inputs)


DPOTrainer = PackedDPOTrainer
"""The drop-in name: ``from padless.integrations.trl import DPOTrainer``."""
