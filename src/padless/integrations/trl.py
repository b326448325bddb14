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
has, not with a ``KeyError`` from inside ``datasets.map``. padless' errors raised inside name the
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
from padless.integrations.transformers import (  # noqa: E402
    announce,
    balance_options,
    balance_said,
    count_shifted_labels,
    exact_collator,
    first_without,
    loader_for,
    naming_argument,
    packed_batches,
    plan_said,
    record_fields,
    records,
    shifts_labels,
    start_line,
    trainer_words,
    training_dtype,
)

SFT_WORDS: dict[str, str] = {
    "max_length": "SFTConfig.max_length", "seq_length": "SFTConfig.max_length",
    "strategy": "SFTConfig.packing_strategy", "overlong": "SFTTrainer.overlong",
    "overlong policy": "SFTTrainer.overlong", "rows_per_batch": "SFTConfig.per_device_train_batch_size",
    "truncation_mode": "SFTConfig.truncation_mode", "balance": "SFTTrainer.balance", "cost_a": "SFTTrainer.cost_a",
    "max_image_patches": "SFTTrainer.max_image_patches",
    "backend": "attn_implementation='{backend}' when loading the model, or in SFTConfig.model_init_kwargs",
}  # fmt: skip
"""Library argument -> where ``SFTTrainer`` takes it (``SFTConfig`` field or trainer argument), for
:func:`padless.integrations.transformers.in_trainer_words`."""

CHAT_FIELDS = ("messages", "conversations", "prompt", "completion")
"""Fields TRL reads chats from (``conversations``: ShareGPT's ``from``/``value``, converted by TRL)."""


def _present_deep(value: Any) -> Any:
    """``value`` with every ``None`` field dropped, inside lists too (a ``datasets`` struct gives each
    message every field any message has)."""
    if isinstance(value, Mapping):
        return {k: _present_deep(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_present_deep(v) for v in value]
    return value


def _sharegpt(chat: Any) -> bool:
    """A ShareGPT chat (``from``/``value``), which TRL converts to roles itself."""
    return isinstance(chat, list) and bool(chat) and isinstance(chat[0], Mapping) and "from" in chat[0]


def _sft_kind(record: Any, at: str, text_field: str) -> str:
    """Which of TRL's record kinds ``record`` (its fields with a value) is, after padless' checks of it:
    ``tokens``, ``prompt-completion``, ``messages`` or ``text``; else :class:`RecordError` naming the
    record and the fields it has."""
    from padless.data.chat import check_messages
    from padless.data.records import RecordError, check_text, fields_hint, record_kind

    if not isinstance(record, Mapping):
        record_kind(record, at)  # raises: not an object with fields
    if "input_ids" in record:  # TRL takes the tokens as they are; the collator checks them
        return "tokens"
    if "prompt" in record or "completion" in record:
        for have, need in (("prompt", "completion"), ("completion", "prompt")):
            if need not in record:
                raise RecordError("missing_field", f"{at}: {have!r} without {need!r} ({fields_hint(record, [need])})")
        chat = record["prompt"], record["completion"]
        if all(isinstance(c, list) for c in chat) and not _sharegpt(chat[0] + chat[1]):
            check_messages(chat[0] + chat[1], at)
        return "prompt-completion"
    chat = record.get("messages", record.get("conversations"))
    if chat is not None:
        if not _sharegpt(chat):
            check_messages(chat, at)
        return "messages"
    if text_field in record:
        try:
            check_text({"text": record[text_field]}, at)
        except RecordError as err:
            err.args = (str(err).replace("'text'", repr(text_field)),)
            raise
        return "text"
    try:
        record_kind(record, at)  # no field padless knows: raises naming the fields there are
    except RecordError as err:
        err.args = (f"{err}; SFTTrainer also reads 'prompt' with 'completion', or a formatting_func",)
        raise
    raise RecordError(
        "missing_field",
        f"{at}: no {text_field!r} field, which SFTConfig(dataset_text_field="
        f"{text_field!r}) reads ({fields_hint(record, [text_field])})",
    )


def _field_names(dataset: Any) -> set[str]:
    """The columns of a ``datasets`` dataset, else the fields of its first record."""
    names = getattr(dataset, "column_names", None)
    if names is not None:
        return set(names)
    first = next(iter(dataset), None)
    return set(first) if isinstance(first, Mapping) else set()


def check_sft_records(dataset: Any, argument: str = "train_dataset", *, text_field: str = "text") -> Any:
    """``dataset`` as TRL's ``SFTTrainer`` takes it (a list of dicts becomes a ``datasets.Dataset``),
    after padless' record checks (:mod:`padless.data.records`, :func:`padless.data.chat.check_messages`)
    of every record: one of TRL's kinds (``input_ids``; ``prompt`` with ``completion``; ``messages``;
    the ``text_field`` text), the same kind throughout (TRL reads the kind off the first record), and a
    well-formed chat or text. A bad record raises :class:`padless.data.records.RecordError` naming
    ``argument``, the record (from 1), the field and the fields it has, before TRL or ``datasets``
    read it. An ``IterableDataset`` is checked by its first record."""
    from padless.data.records import RecordError, fields_hint, where

    datasets = require("datasets")
    if isinstance(dataset, datasets.IterableDataset):
        with naming_argument(argument):
            _sft_kind(_present_deep(next(iter(dataset), {})), where(1), text_field)
        return dataset
    with naming_argument(argument):
        columns = getattr(dataset, "column_names", None)
        if columns is not None and "input_ids" in columns:  # TRL trains the tokens and reads nothing else
            number = first_without(dataset, "input_ids")
            if number is not None:
                record = record_fields(dataset, number)
                raise RecordError(
                    "missing_field",
                    f"{where(number)}: no 'input_ids', which the other records have "
                    f"({fields_hint(record, ['input_ids'])})",
                )
            return dataset
        first = None
        fields = None if columns is None else [text_field, *CHAT_FIELDS]
        for number, record in records(dataset, fields):
            if isinstance(record, Mapping):
                record = _present_deep(record) if record else record_fields(dataset, number)
            kind = _sft_kind(record, where(number), text_field)
            if first is None:
                first = kind
            elif kind != first:
                raise RecordError(
                    "mixed_kinds",
                    f"{where(number)}: a {kind!r} record, and record 1 is a {first!r} "
                    "one; SFTTrainer trains one kind per dataset",
                )
    if columns is None:  # every field of every record (from_list would keep the first record's only)
        names = list(dict.fromkeys(k for r in dataset for k in r))
        dataset = datasets.Dataset.from_dict({k: [r.get(k) for r in dataset] for k in names})
    return dataset


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
    :class:`padless.IsolationGuard` with its period)."""

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
        skip = args is not None and (getattr(args, "dataset_kwargs", None) or {}).get("skip_prepare_dataset")
        if not (trl_kwargs.get("formatting_func") or skip or {"image", "images"} & _field_names(dataset)):
            text_field = getattr(args, "dataset_text_field", "text") if args is not None else "text"
            dataset = check_sft_records(dataset, argument, text_field=text_field)
        self._padless_checked.append(dataset)
        return dataset

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
            sampler, view = packed_batches(
                self.train_dataset,
                args.max_length,
                args.per_device_train_batch_size,
                world_size=args.world_size,
                rank=args.process_index,
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
