"""TRL's ``SFTTrainer`` with padless packing, configured through TRL's own ``SFTConfig``.

    from padless.integrations.trl import SFTTrainer        # was: from trl import SFTTrainer
    trainer = SFTTrainer(model=model, args=SFTConfig(packing=True, max_length=1024), train_dataset=dataset,
                         processing_class=tokenizer)

The same class, the same ``SFTConfig``; what ``packing``, ``padding_free`` and ``max_length`` do:

* ``packing=True``: TRL's preparation (formatting, chat template, tokenization, ``labels``) runs as
  usual, then padless plans rows of ``max_length`` tokens over the whole dataset (TRL packs inside
  ``datasets.map`` batches), re-planned every epoch and dealt to the ranks by a
  :class:`padless.DistributedPackedBatchSampler`; ``per_device_train_batch_size`` rows make a
  micro-batch. ``packing_strategy`` maps to padless' planners: ``"bfd"`` best fit decreasing,
  ``"bfd_split"`` the same with overlong sequences split, ``"wrapped"`` cuts at row ends but keeps
  every piece its own document. An evaluation dataset is packed once by :func:`padless.pack_dataset`.
* ``padding_free=True`` without packing: each micro-batch's examples become one row (as TRL does).
* neither: TRL's padded batches, unchanged.

In both packed modes the collator is :meth:`padless.PackingCollator.for_model` for the model's
attention backend, after :func:`padless.resolve_backend` has accepted it (``padless`` varlen
attention, or ``sdpa``/``eager`` with a 4D block-causal mask; a backend that cannot isolate documents
for this model is refused). The loss is TRL's own: summed over tokens and divided by the trained
tokens of the whole optimiser step, all micro-batches and ranks. For a model whose ``loss_type``
transformers maps to no loss (GPT-2), Trainer would count each row's first label as trained; the
model gets ``loss_type="ForCausalLM"`` (:func:`count_shifted_labels`) so padded and packed runs
divide by the same count.

Overlong sequences: TRL's ``"bfd"`` truncates them silently. Here a sequence longer than
``max_length`` raises unless ``overlong=`` (an argument of this trainer) says ``"truncate"``
(``truncation_mode="keep_start"`` only), ``"split"`` or ``"drop"``; ``"bfd_split"`` and ``"wrapped"``
imply ``"split"``. Where TRL's own paths are exact and where they are not:
docs/integrations/exactness.md.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from padless._optional import require

require("trl", "padless.integrations.trl")

import trl  # noqa: E402

from padless.integrations.datasets import pack_dataset, resolve_strategy  # noqa: E402
from padless.integrations.transformers import (  # noqa: E402
    count_shifted_labels,
    exact_collator,
    loader_for,
    packed_batches,
    shifts_labels,
    training_dtype,
)


@contextmanager
def _no_max_length(args: Any):
    """``args.max_length`` set to None for TRL's preparation, so that it does not truncate: padless'
    overlong policy decides instead."""
    kept = args.max_length
    args.max_length = None
    try:
        yield
    finally:
        args.max_length = kept


class PackedSFTTrainer(trl.SFTTrainer):
    """``trl.SFTTrainer`` with padless packing (module docstring). Takes ``SFTTrainer``'s arguments
    plus ``overlong`` (keyword-only): what a sequence longer than ``max_length`` does when packing."""

    def __init__(
        self,
        model: Any,
        args: Any = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        *trl_args: Any,
        overlong: str | None = None,
        **trl_kwargs: Any,
    ) -> None:
        if args is not None and getattr(args, "packing", False):
            planner, policy = resolve_strategy(args.packing_strategy, overlong)
            if policy == "truncate" and args.truncation_mode != "keep_start":
                raise ValueError(f"overlong='truncate' keeps the start of a sequence; truncation_mode="
                                 f"{args.truncation_mode!r} asks for its end")
            self._padless_mode: str | None = "packed"
            self._padless_plan = {"strategy": planner, "overlong": policy}
        else:
            self._padless_mode = "padding_free" if args is not None and getattr(args, "padding_free", False) else None
            self._padless_plan = {}
        if not isinstance(model, str):
            count_shifted_labels(model)  # before Trainer reads loss_type
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, processing_class, *trl_args,
                         **trl_kwargs)  # fmt: skip
        from padless.attention.adapters import base_model_of

        inner = base_model_of(self.model)  # peft_config=...: TRL wrapped the model in a PeftModel
        count_shifted_labels(inner)
        if hasattr(self, "_loss_shifts_labels"):  # a model loaded by TRL from a name: read loss_type again
            self._loss_shifts_labels = shifts_labels(inner)
        self._rows: tuple[Any, Any, Any] | None = None
        if self._padless_mode is None:
            return
        packed = self._padless_mode == "packed"
        self.data_collator = exact_collator(
            inner, self.args.max_length if packed else None, device=self.args.device, dtype=training_dtype(self.args),
            pad_token_id=self._tokenizer.pad_token_id, **self._padless_plan,
        )  # fmt: skip
        if packed and self.train_dataset is not None:
            self._packed_rows()

    # ------------------------------------------------------------------ data

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, packing: bool, formatting_func: Any,
                         dataset_name: str) -> Any:  # fmt: skip
        """TRL's preparation without TRL's truncation and packing; then, for evaluation, padless'
        ``pack_dataset`` (training rows are planned per epoch by the sampler)."""
        if not packing or self._padless_mode != "packed":
            return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)
        datasets = require("datasets")
        if not isinstance(dataset, datasets.Dataset):
            raise ValueError(f"padless packing plans over a whole dataset and cannot take a {type(dataset).__name__} "
                             f"({dataset_name}); pack a stream with padless.PackedStream, or set packing=False")
        with _no_max_length(args):
            dataset = super()._prepare_dataset(dataset, processing_class, args, False, formatting_func, dataset_name)
        prepacked = "seq_lengths" in dataset.column_names  # rows packed beforehand stay as they are
        dataset = dataset.select_columns(["input_ids", "labels", *(["seq_lengths"] if prepacked else [])])
        if dataset_name == "train" or prepacked:
            return dataset
        return pack_dataset(dataset, args.max_length, args.packing_strategy, overlong=self._padless_plan["overlong"])

    def _packed_rows(self) -> tuple[Any, Any]:
        if self._rows is None or self._rows[0] is not self.train_dataset:
            args = self.args
            sampler, view = packed_batches(
                self.train_dataset, args.max_length, args.per_device_train_batch_size, world_size=args.world_size,
                rank=args.process_index, seed=args.data_seed if args.data_seed is not None else args.seed,
                pad_token_id=self._tokenizer.pad_token_id, **self._padless_plan,
            )  # fmt: skip
            self._rows = (self.train_dataset, sampler, view)
        return self._rows[1], self._rows[2]

    @property
    def batch_sampler(self) -> Any:
        """The packed-row sampler of this rank (``packing=True``), else None."""
        return self._packed_rows()[0] if self._padless_mode == "packed" and self.train_dataset is not None else None

    def get_train_dataloader(self) -> Any:
        if self._padless_mode != "packed":
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("SFTTrainer: training requires a train_dataset")
        sampler, view = self._packed_rows()
        return loader_for(self, view, sampler)

    # ------------------------------------------------------------------ metrics

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """TRL's loss. Only its ``num_tokens`` metric is recounted for padless batches: TRL reads it from a
        2D ``attention_mask`` or from the width of one flattened row; padless rows send a 4D mask or several
        rows. Counted as TRL counts its padding-free rows: every token fed, row-end padding included."""
        before = getattr(self, "_total_train_tokens", None)
        out = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if self._padless_mode is not None and before is not None and self.model.training:
            import torch

            fed = torch.tensor(inputs["input_ids"].numel(), device=inputs["input_ids"].device)
            total = int(self.accelerator.gather_for_metrics(fed).sum().item())
            self._total_train_tokens = before + total // getattr(self, "_tp_size", 1)
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        return out


SFTTrainer = PackedSFTTrainer
"""The drop-in name: ``from padless.integrations.trl import SFTTrainer``."""
