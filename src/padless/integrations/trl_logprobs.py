"""What padless' GRPO and DPO trainers share: TRL's padded rows read as packed features, the layout
chosen for the model's backend, one fitted collator per model, the start line and the first-step guard.

:mod:`padless.integrations.trl_grpo` and :mod:`padless.integrations.trl_dpo` build on it; both are
imported from :mod:`padless.integrations.trl` (and :mod:`padless.integrations.trl_rl`). Layouts,
refusals and the start line: :mod:`padless.integrations.trl_rl`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from padless._optional import require

require("trl", "padless.integrations.trl")

from padless.attention.adapters import base_model_of, without_ddp  # noqa: E402
from padless.integrations.first_step import attach_guard  # noqa: E402
from padless.integrations.trainer_boundary import announce, start_line, trainer_words  # noqa: E402
from padless.integrations.trainer_rows import training_dtype  # noqa: E402


def _span(mask: np.ndarray, side: str, where: str) -> int:
    """Tokens of a 0/1 mask row that is padded on ``side`` only (``left``: zeros then ones), else
    ``ValueError``: a hole inside a sequence has no packed form that attends as TRL's row does."""
    n = int(mask.sum())
    want = np.arange(mask.size) >= mask.size - n if side == "left" else np.arange(mask.size) < n
    if not np.array_equal(mask.astype(bool), want):
        raise ValueError(
            f"{where} is not {side}-padded (a 0 between its tokens); padless packs each sequence as the "
            "contiguous tokens its mask keeps"
        )
    return n


def _check_group_sizes(
    features: list[dict[str, Any]], max_length: int | None, share_prompt: bool, trainer: str
) -> None:
    """Raise naming ``max_length`` when a group cannot fit one row (a group never splits)."""
    if max_length is None:
        return
    for f in features:
        comps = f["completion_ids"] if "completion_ids" in f else [f["chosen_ids"], f["rejected_ids"]]
        copies = 1 if share_prompt else len(comps)
        need = copies * len(f["prompt_ids"]) + sum(len(c) for c in comps)
        if need > max_length:
            k = len(comps)
            raise ValueError(
                f"a group (a prompt and {k} completion{'s' * (k != 1)}) needs {need} tokens in one row "
                f"(share_prompt={share_prompt}), more than {trainer}(max_length={max_length}); a group "
                "never splits across rows: raise max_length, or set it to None (one row per forward "
                "chunk)"
            )


class _PackedLogprobs:
    """What both trainers share: the layout choice, one fitted collator per model, the start line."""

    _padless_collator_type: Any = None
    _padless_trainer_name = ""
    _padless_words: Mapping[str, str] = {}

    @staticmethod
    def _padless_check(share_prompt: Any, max_length: Any) -> None:
        """The trainer's own arguments, checked before TRL sets anything up."""
        from padless.planning.checks import check_int

        if max_length is not None:
            check_int(max_length, "max_length")
        if share_prompt not in (None, True, False):
            raise ValueError(
                f"share_prompt must be True, False or None (shared where the backend can), got {share_prompt!r}"
            )

    def _padless_setup(self, share_prompt: bool | None, max_length: int | None, guard: Any = True) -> None:
        """Fit the collator to the policy now: a backend the rule refuses fails at construction; attach
        the first-step guard (:mod:`padless.integrations.first_step`)."""
        self.padless_guard = attach_guard(self, guard, f"{self._padless_trainer_name}Trainer")
        self._padless_max_length = max_length
        self._padless_share = share_prompt
        self._padless_refusal: str | None = None
        self._padless_collators: dict[int, Any] = {}
        self._padless_collator_for(self.model)

    def _padless_collator_for(self, model: Any) -> Any:
        """The collator fitted to ``model`` (one per model: the policy, a separate reference model)."""
        inner = without_ddp(model)
        key = id(base_model_of(inner))
        if key in self._padless_collators:
            return self._padless_collators[key]
        options = dict(
            max_length=self._padless_max_length,
            pad_token_id=self._tokenizer.pad_token_id,
            device=self.args.device,
            dtype=training_dtype(self.args),
        )
        cls = self._padless_collator_type
        if self._padless_share is None:  # shared where the rule accepts the tree for this backend
            try:
                collator = cls.for_model(inner, share_prompt=True, **options)
            except ValueError as err:
                self._padless_refusal = str(err)
                collator = cls.for_model(inner, share_prompt=False, **options)
            self._padless_share = collator.share_prompt
        else:
            collator = cls.for_model(inner, share_prompt=self._padless_share, **options)
        self._padless_collators[key] = collator
        return collator

    def start_line(self) -> str:
        """What :meth:`train` logs first: model, backend, layout, the rule's verdict, rows and layout."""
        collator = self._padless_collator_for(self.model)
        rows = (
            "one row per forward chunk"
            if self._padless_max_length is None
            else f"{self._padless_max_length}-token rows"
        )
        if collator.share_prompt:
            layout = "one prompt per group (share_prompt=True)"
        else:
            layout = "one document per completion (share_prompt=False)"
            if self._padless_refusal is not None:
                layout += f"; shared prompt refused: {self._padless_refusal}"
        return start_line(
            self.model,
            collator,
            rows=f"{self._padless_trainer_name} log-probs on packed rows, {rows}",
            documents=f"{layout}, {self.padless_guard.said()}",
        )

    def _padless_guarded(self, model: Any, batch: Any) -> None:
        """Run the guard on ``batch`` (a packed forward chunk of ``model``) when due: it re-runs the batch,
        whose full logits the log-prob pass does not keep (only the trained positions')."""
        guard = getattr(self, "padless_guard", None)  # absent while TRL's __init__ precomputes log-probs
        if guard is not None and guard.due(model):
            guard(model, batch)
        elif guard is not None and model.training:
            guard.tick()

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's ``train``, after logging :meth:`start_line` (:func:`padless.integrations.transformers.announce`)."""
        announce(self, self.start_line())
        with trainer_words(self._padless_words):
            out = super().train(*args, **kwargs)  # type: ignore[misc]
        said = self.rows_said()
        if said:
            announce(self, said)
        return out

    def rows_said(self) -> str | None:
        """What the log-prob passes' rows held over training, said after it: how full they were and what
        ``overlong`` truncated or dropped (``None`` before any pass)."""
        t = self._padless_collator_for(self.model).totals
        if not t.get("row_tokens"):
            return None
        parts = [f"padless: {self._padless_trainer_name} rows were {t['placed_tokens'] / t['row_tokens']:.1%} full"]
        parts.append(f"{t['groups']:,} groups packed")
        if t["truncated_groups"]:
            parts.append(f"{t['truncated_groups']:,} truncated ({t['truncated_tokens']:,} tokens cut)")
        if t["dropped_groups"]:
            parts.append(f"{t['dropped_groups']:,} dropped ({t['dropped_tokens']:,} tokens)")
        return ", ".join(parts)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        with trainer_words(self._padless_words):
            return super().evaluate(*args, **kwargs)  # type: ignore[misc]


def _refuse_multimodal(trainer: str, processing_class: Any) -> None:
    from transformers import ProcessorMixin

    if isinstance(processing_class, ProcessorMixin):
        raise ValueError(
            f"{trainer}: multimodal inputs (pixel_values, image tokens) are not packed yet; "
            f"{trainer}(processing_class={type(processing_class).__name__}) is a processor: "
            f"train vision-language models with trl.{trainer}"
        )
