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
  ``balance="cost"`` (an argument of this trainer, as ``overlong`` is) deals each step's rows so that the
  ranks' costs ``sum(a * l + l**2)`` are even rather than their tokens (docs/balance.md).
* ``padding_free=True`` without packing: each micro-batch's examples become one row (as TRL does).
* neither: TRL's padded batches, unchanged.

In both packed modes the collator is :meth:`padless.PackingCollator.for_model` for the model's
attention backend, fitted by the exactness rule, whose verdict it holds (``padless`` varlen
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

Around TRL: the records of ``train_dataset`` and ``eval_dataset`` (a ``datasets.Dataset``, or a list of
dicts, made a ``Dataset``) are checked by padless' record checks before TRL reads them
(:func:`check_sft_records`), so a misspelt field fails naming the record, the field and the fields it
has, not with a ``KeyError`` from inside ``datasets.map``; then padless renders them into ``input_ids``
and ``labels`` (:mod:`padless.integrations.sft_records`: every form ``load_corpus`` reads, Alpaca,
ShareGPT and TRL's prompt / completion included; what is trained follows ``SFTConfig`` as in TRL). padless' errors raised inside name the
trainer argument (``SFTTrainer(overlong=...)``, ``SFTConfig(max_length=...)``: :data:`SFT_WORDS`).
``train`` first logs one line: model, backend, layout, verdict, rows, their fill, what the plan cut
(:func:`padless.integrations.trainer_rows.plan_said`); in both packed modes the first packed step is
checked on the model (``guard``: :mod:`padless.integrations.first_step`), its cost logged after it.

``GRPOTrainer`` and ``DPOTrainer`` are imported from here too: TRL's RL trainers whose log-prob passes
run on packed rows (:mod:`padless.integrations.trl_rl`).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

from padless._optional import require

require("trl", "padless.integrations.trl")

import torch  # noqa: E402
import trl  # noqa: E402

from padless.integrations.datasets import pack_dataset, resolve_strategy  # noqa: E402
from padless.integrations.first_step import attach_guard, guarded_loss, keep_placements  # noqa: E402
from padless.integrations.sft_records import (  # noqa: E402,F401  (check_sft_records: a public name of this module)
    CHAT_FIELDS,
    check_sft_records,
    field_names,
    render_sft_dataset,
)
from padless.integrations.trainer_context import (  # noqa: E402
    context_groups,
    context_step_loss,
    data_parallel_place,
    prepare_model,
    resolve_layout,
    use_padless_attention,
)
from padless.integrations.transformers import (  # noqa: E402
    announce,
    balance_options,
    balance_said,
    count_shifted_labels,
    exact_collator,
    loader_for,
    packed_batches,
    plan_said,
    shifts_labels,
    start_line,
    trainer_words,
    training_dtype,
)

SFT_WORDS: dict[str, str] = {
    "max_length": "SFTConfig.max_length", "seq_length": "SFTConfig.max_length",
    "context_parallel": "SFTTrainer.context_parallel", "context_layout": "SFTTrainer.context_layout",
    "strategy": "SFTConfig.packing_strategy", "overlong": "SFTTrainer.overlong",
    "overlong policy": "SFTTrainer.overlong", "rows_per_batch": "SFTConfig.per_device_train_batch_size",
    "truncation_mode": "SFTConfig.truncation_mode", "balance": "SFTTrainer.balance", "cost_a": "SFTTrainer.cost_a",
    "max_image_patches": "SFTTrainer.max_image_patches",
    "backend": "attn_implementation='{backend}' when loading the model, or in SFTConfig.model_init_kwargs",
}  # fmt: skip
"""Library argument -> where ``SFTTrainer`` takes it (``SFTConfig`` field or trainer argument), for
:func:`padless.integrations.transformers.in_trainer_words`."""


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
    plus, keyword-only: ``overlong`` (what a sequence longer than ``max_length`` does when packing),
    ``balance`` (``"tokens"``, default, or ``"cost"``: with ``packing=True``, each step's rows dealt so
    that the ranks' costs ``sum(a * l + l**2)`` are even, docs/balance.md) and ``cost_a`` (``"cost"``
    only; default ``12 * hidden_size`` of the model's config), ``max_image_patches`` (with
    ``packing=True`` and images: the most vision-encoder patches a row's images may hold) and ``guard``
    (packed modes: ``True``, default, checks the first packed step on the model; ``False``; or an
    :class:`padless.IsolationGuard` with its period), ``context_parallel`` and ``context_layout`` (with
    ``packing=True`` under ``torchrun``: each row split over that many ranks,
    :mod:`padless.integrations.trainer_context`)."""

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
        balance: str = "tokens",
        cost_a: float | None = None,
        max_image_patches: int | None = None,
        guard: Any = True,
        context_parallel: int = 1,
        context_layout: str = "auto",
        **trl_kwargs: Any,
    ) -> None:
        with trainer_words(SFT_WORDS):
            from padless.planning.balance import BALANCES, check_balance
            from padless.planning.checks import check_choice

            check_choice(balance, BALANCES, "balance")  # before TRL's set-up: a bad argument fails at once
            if cost_a is not None:
                check_balance(balance, cost_a)
            self._padless_checked: list[Any] = []
            train_dataset, args = self._rendered_images(train_dataset, processing_class, args)
            train_dataset = self._checked(train_dataset, "train_dataset", args, trl_kwargs)
            if isinstance(eval_dataset, Mapping):
                eval_dataset = {
                    k: self._checked(d, f"eval_dataset[{k!r}]", args, trl_kwargs) for k, d in eval_dataset.items()
                }
            else:
                eval_dataset = self._checked(eval_dataset, "eval_dataset", args, trl_kwargs)
            if args is not None and getattr(args, "packing", False):
                planner, policy = resolve_strategy(args.packing_strategy, overlong)
                if policy == "truncate" and args.truncation_mode != "keep_start":
                    raise ValueError(
                        f"SFTTrainer(overlong='truncate') keeps the start of a sequence; SFTConfig("
                        f"truncation_mode={args.truncation_mode!r}) asks for its end"
                    )
                self._padless_mode: str | None = "packed"
                self._padless_plan = {"strategy": planner, "overlong": policy}
                self._padless_images = {"max_image_patches": max_image_patches}
            else:
                padding_free = args is not None and getattr(args, "padding_free", False)
                self._padless_mode = "padding_free" if padding_free else None
                self._padless_plan = {}
                self._padless_images = {}
                if max_image_patches is not None:
                    raise ValueError(
                        "max_image_patches bounds the images of a packed row; it needs SFTConfig(packing=True)"
                    )
                if balance != "tokens":
                    raise ValueError(
                        f"balance={balance!r} deals packed rows to the ranks; it needs SFTConfig("
                        "packing=True) (padding-free and padded batches follow TRL's own sampler)"
                    )
            if not isinstance(model, str):
                count_shifted_labels(model)  # before Trainer reads loss_type
            super().__init__(
                model, args, data_collator, train_dataset, eval_dataset, processing_class, *trl_args, **trl_kwargs
            )
            from padless.attention.adapters import base_model_of

            inner = base_model_of(self.model)  # peft_config=...: TRL wrapped the model in a PeftModel
            count_shifted_labels(inner)
            self._padless_balance = balance_options(inner, balance, cost_a)  # a model named by a string: loaded now
            if hasattr(self, "_loss_shifts_labels"):  # a model loaded by TRL from a name: read loss_type again
                self._loss_shifts_labels = shifts_labels(inner)
            self._rows: tuple[Any, Any, Any] | None = None
            self.padless_context = context_groups(context_parallel, context_layout, self.args)
            if self.padless_context is not None:
                if self._padless_mode != "packed":
                    raise ValueError(
                        f"context_parallel={context_parallel} splits packed rows over ranks; it needs SFTConfig(packing=True)"
                    )
                use_padless_attention(inner)  # the collator sends boundaries, not [R, 1, L, L] masks
            self.padless_guard = attach_guard(self, guard if self._padless_mode else False, "SFTTrainer")
            if self._padless_mode is None:
                return
            packed = self._padless_mode == "packed"
            self.data_collator = exact_collator(
                inner,
                self.args.max_length if packed else None,
                device=self.args.device,
                dtype=training_dtype(self.args),
                pad_token_id=self._tokenizer.pad_token_id,
                **self._padless_plan,
            )
            if self.padless_context is not None:
                prepare_model(inner, self.padless_context)
                self.model_accepts_loss_kwargs = True  # the cp loss is padless' own: Trainer counts the step's tokens
            if packed and self.train_dataset is not None:
                self._packed_rows()

    # ------------------------------------------------------------------ data

    def _rendered_images(self, dataset: Any, processor: Any, args: Any) -> tuple[Any, Any]:
        """A chat dataset with images, ``packing=True`` and a processor: every record rendered through
        the processor (:func:`padless.data.images.render_image_records`: images expanded into their
        placeholder tokens, assistant-only labels), handed to TRL as prepared features (TRL's own vision
        path refuses packing); the packed rows carry each document's images. Anything else: as given."""
        from padless.data.images import has_images, render_image_records

        if dataset is None or args is None or not getattr(args, "packing", False):
            return dataset, args
        first = next(iter(dataset), None)
        if not has_images(first):
            return dataset, args
        if getattr(processor, "image_processor", None) is None:
            raise ValueError(
                "SFTTrainer: train_dataset holds images; pass the model's processor as processing_class "
                "(AutoProcessor.from_pretrained(...)), not its tokenizer"
            )
        import dataclasses

        datasets = require("datasets")
        rendered = datasets.Dataset.from_list(render_image_records(dataset, processor))
        kwargs = {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}
        return rendered, dataclasses.replace(args, dataset_kwargs=kwargs)

    def _checked(self, dataset: Any, argument: str, args: Any, trl_kwargs: dict[str, Any]) -> Any:
        """``dataset`` after :func:`check_sft_records` (a list made a ``Dataset``), once per dataset; left
        to TRL where TRL reads other fields than those padless checks (a ``formatting_func``,
        ``skip_prepare_dataset``, images)."""
        if dataset is None or any(dataset is d for d in self._padless_checked):
            return dataset
        if self._padless_reads(dataset, args, trl_kwargs.get("formatting_func")):
            text_field = getattr(args, "dataset_text_field", "text") if args is not None else "text"
            dataset = check_sft_records(dataset, argument, text_field=text_field)
        self._padless_checked.append(dataset)
        return dataset

    @staticmethod
    def _padless_reads(dataset: Any, args: Any, formatting_func: Any) -> bool:
        """Whether padless checks and renders ``dataset``'s records: not where TRL reads other fields (a
        ``formatting_func``, ``skip_prepare_dataset``, images)."""
        skip = args is not None and (getattr(args, "dataset_kwargs", None) or {}).get("skip_prepare_dataset")
        return not (formatting_func or skip or {"image", "images"} & field_names(dataset))

    def _prepare_dataset(
        self, dataset: Any, processing_class: Any, args: Any, packing: bool, formatting_func: Any, dataset_name: str
    ) -> Any:
        """TRL's preparation without TRL's truncation and packing; then, for evaluation, padless'
        ``pack_dataset`` (training rows are planned per epoch by the sampler). A dataset not checked yet
        (given to ``evaluate``) is checked first (:func:`check_sft_records`)."""
        with trainer_words(SFT_WORDS):
            argument = (
                "train_dataset"
                if dataset_name == "train"
                else ("eval_dataset" if dataset_name == "eval" else f"eval_dataset[{dataset_name!r}]")
            )
            dataset = self._checked(dataset, argument, args, {"formatting_func": formatting_func})
            if self._padless_reads(dataset, args, formatting_func):  # padless' renderer: what padless stats previews
                text_field = getattr(args, "dataset_text_field", "text")
                dataset = render_sft_dataset(dataset, processing_class, args, argument, text_field)
            if not packing or self._padless_mode != "packed":
                return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)
            datasets = require("datasets")
            if not isinstance(dataset, datasets.Dataset):
                raise ValueError(
                    f"padless packing plans over a whole dataset and cannot take a "
                    f"{type(dataset).__name__} ({dataset_name}); pack a stream with padless.PackedStream, "
                    "or set SFTConfig(packing=False)"
                )
            with _no_max_length(args):
                dataset = super()._prepare_dataset(
                    dataset, processing_class, args, False, formatting_func, dataset_name
                )
            prepacked = "seq_lengths" in dataset.column_names  # rows packed beforehand stay as they are
            dataset = dataset.select_columns(["input_ids", "labels", *(["seq_lengths"] if prepacked else [])])
            if dataset_name == "train" or prepacked:
                return dataset
            return pack_dataset(
                dataset, args.max_length, args.packing_strategy, overlong=self._padless_plan["overlong"]
            )

    def _packed_rows(self) -> tuple[Any, Any]:
        if self._rows is None or self._rows[0] is not self.train_dataset:
            args = self.args
            replicas, replica = data_parallel_place(self.padless_context, args)
            sampler, view = packed_batches(
                self.train_dataset,
                args.max_length,
                args.per_device_train_batch_size,
                world_size=replicas,
                rank=replica,
                seed=args.data_seed if args.data_seed is not None else args.seed,
                pad_token_id=self._tokenizer.pad_token_id,
                **self._padless_plan,
                **self._padless_balance,
                **self._padless_images,
            )
            self._rows = (self.train_dataset, sampler, view)
        return self._rows[1], self._rows[2]

    @property
    def batch_sampler(self) -> Any:
        """The packed-row sampler of this rank (``packing=True``), else None."""
        return self._packed_rows()[0] if self._padless_mode == "packed" and self.train_dataset is not None else None

    def get_train_dataloader(self) -> Any:
        if self._padless_mode == "padding_free":  # TRL's loader drops the placements the guard reads
            return self.padless_guard.loader(self, super().get_train_dataloader)
        if self._padless_mode != "packed":
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("SFTTrainer: training requires a train_dataset")
        with trainer_words(SFT_WORDS):
            sampler, view = self._packed_rows()
        return loader_for(self, view, sampler)

    def start_line(self) -> str:
        """What :meth:`train` logs first (:func:`padless.integrations.transformers.start_line`)."""
        if self._padless_mode == "packed":
            with trainer_words(SFT_WORDS):
                sampler, _ = self._packed_rows()
            rows = f"{self.args.max_length}-token rows{balance_said({**self._padless_balance, **self._padless_images})}"
            planned, lost = plan_said(self.train_dataset, sampler, self.args.max_length)
            if self.padless_context is not None:
                self.padless_context, said = resolve_layout(
                    self.padless_context, self.train_dataset, sampler, self.args.max_length, self.model
                )
                planned = f"{planned}, {said}"
            documents = f"{planned}, {self.padless_guard.said()}{lost}"
            return start_line(self.model, self.data_collator, rows=rows, documents=documents)
        if self._padless_mode == "padding_free":
            return start_line(
                self.model,
                self.data_collator,
                rows="one row per micro-batch",
                documents=f"{self.args.per_device_train_batch_size} documents per row (per_device_train_batch_size), "
                f"{self.padless_guard.said()}",
            )
        return start_line(self.model, None, rows="TRL's padded batches", documents="1 document per row")

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's ``train``, after logging :meth:`start_line` (:func:`padless.integrations.transformers.announce`)."""
        if self._padless_mode == "packed" and self.train_dataset is None:
            raise ValueError("SFTTrainer: training requires a train_dataset")
        announce(self, self.start_line())
        with trainer_words(SFT_WORDS):
            return super().train(*args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        with trainer_words(SFT_WORDS):
            return super().evaluate(*args, **kwargs)

    def _prepare_inputs(self, inputs: Any) -> Any:
        """TRL's move to the device, the packed batch's placements kept (the guard reads them)."""
        return keep_placements(inputs, super()._prepare_inputs(inputs))

    # ------------------------------------------------------------------ metrics

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """TRL's loss. Only its ``num_tokens`` metric is recounted for padless batches: TRL reads it from a
        2D ``attention_mask`` or from the width of one flattened row; padless rows send a 4D mask or several
        rows. Counted as TRL counts its padding-free rows: every token fed, row-end padding included. A packed
        batch whose ``attention_mask`` cannot keep its documents apart is refused first."""
        if self._padless_mode is not None:
            from padless.attention.accept import check_attention_mask

            check_attention_mask(inputs)
        if self.padless_context is not None and model.training and not return_outputs:
            return context_step_loss(self, model, inputs, num_items_in_batch)
        before = getattr(self, "_total_train_tokens", None)
        out = guarded_loss(
            self.padless_guard,
            super().compute_loss,
            model,
            inputs,
            return_outputs,
            num_items_in_batch,
            has_logits=False,
        )
        if self._padless_mode is not None and before is not None and self.model.training:
            fed = torch.tensor(inputs["input_ids"].numel(), device=inputs["input_ids"].device)
            total = int(self.accelerator.gather_for_metrics(fed).sum().item())
            self._total_train_tokens = before + total // getattr(self, "_tp_size", 1)
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        return out


SFTTrainer = PackedSFTTrainer
"""The drop-in name: ``from padless.integrations.trl import SFTTrainer``."""

from padless.integrations.trl_rl import DPOTrainer, GRPOTrainer  # noqa: E402,F401  (the RL drop-ins, same import)
