"""``PackedTrainer``: ``transformers.Trainer`` training padless' planned packed rows.

    from padless.integrations.transformers import PackedTrainer
    trainer = PackedTrainer(model=model, args=args, train_dataset=dataset, max_length=1024)   # was Trainer(...)

``dataset`` holds ``input_ids`` (and optionally ``labels``) per example: a ``datasets.Dataset``, a list
of dicts, :meth:`padless.TokenizedCorpus.features`, or rows packed beforehand by
:func:`padless.pack_dataset` (with ``seq_lengths``: each is kept as it is). Three things connect
padless to Trainer (transformers 5.24, read from its sources):

1. Rows. Trainer builds its DataLoader from a *sampler* and ``per_device_train_batch_size``; the only
   batch sampler it accepts is its own ``BatchRebalanceSampler``. So ``get_train_dataloader`` (the
   hook Trainer documents for custom loading) returns a loader over a
   :class:`padless.DistributedPackedBatchSampler`: every rank plans the same rows from (lengths, seed,
   epoch) and trains its share, ``rows_per_batch`` rows per micro-batch (default
   ``per_device_train_batch_size``). The loader is not passed through accelerate's ``prepare``, which
   would deal the already rank-aware batches out a second time, and it skips Trainer's column removal,
   which would strip ``seq_lengths``. Trainer calls ``set_epoch`` on the loader every epoch; the
   sampler then re-plans (equal-length sequences meet new partners, rows go to new steps and ranks).
2. Attention. The model's attention backend must isolate documents for this model, device and dtype
   (:func:`padless.resolve_backend` decides, else ``ValueError`` naming one that can); the collator
   (:meth:`padless.PackingCollator.for_model`) sends what that backend needs: ``cu_seq_lens_q/k``
   for ``padless``, a 4D block-causal mask for ``sdpa``/``eager``.
3. Loss. Trainer sums the trained tokens of an optimiser step over its micro-batches and ranks
   (``num_items_in_batch``, ``average_tokens_across_devices``) and scales each rank's loss by the
   world size, as padless' ``step_num_items`` and ``causal_lm_loss(world_size=W)`` do. It counts the
   shifted labels ``labels[..., 1:]`` only when the model's ``loss_type`` maps to ``ForCausalLMLoss``;
   ``GPT2LMHeadModel`` has ``loss_type=None``, so Trainer would count ``labels[..., 0]`` too: one token
   too many per padded sequence whose first token is trained. :func:`count_shifted_labels` sets
   ``loss_type="ForCausalLM"``, the loss GPT-2 falls back to anyway; use it for padded Trainer runs too.

Under FSDP2 nothing of this changes (FSDP2 averages gradients over ranks as DDP does); see
:class:`PackedTrainer` for the two ways to shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from padless._optional import require

require("accelerate", "transformers.Trainer")

from torch.utils.data import DataLoader  # noqa: E402
from transformers import Trainer  # noqa: E402

from padless.batching.collate import PackingCollator
from padless.batching.samplers import DistributedPackedBatchSampler
from padless.batching.rows import PackedRowView
from padless.planning.schedule import RowKey
from padless.layout import IGNORE_INDEX  # noqa: E402
from padless.models.fsdp import compute_dtype, is_sharded


class EpochDataLoader(DataLoader):
    """A DataLoader that passes ``set_epoch`` (Trainer calls it every epoch) to its batch sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


def count_shifted_labels(model: Any) -> Any:
    """Make Trainer count ``labels[..., 1:] != -100`` for a decoder-only causal LM whose class name
    transformers maps to no loss (e.g. ``GPT2LMHeadModel``); the model's loss is unchanged. Call it
    before constructing the Trainer (it reads ``loss_type`` once)."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    before = getattr(model, "loss_type", None)
    if before not in LOSS_MAPPING and not getattr(model.config, "is_encoder_decoder", False):
        model.loss_type = "ForCausalLM"
        if model.loss_function is not ForCausalLMLoss:  # a custom loss function was set on the model
            model.loss_type = before
            raise ValueError(f"{type(model).__name__} does not use ForCausalLMLoss; set its loss_type yourself")
    return model


def shifts_labels(model: Any) -> bool:
    """Whether Trainer counts ``labels[..., 1:]`` for ``model`` (the rule of transformers 5.24)."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    return LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss and not getattr(
        model.config, "is_encoder_decoder", False)  # fmt: skip


class PrepackedRows:
    """A dataset of rows packed beforehand (``input_ids``, ``labels``, ``seq_lengths`` per row) seen
    through row keys: key ``((i, 0, n),)`` is row ``i`` with its own documents; ``()`` is an empty row."""

    def __init__(self, dataset: Any, *, pad_token_id: int = 0) -> None:
        self.dataset = dataset
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: RowKey) -> dict[str, np.ndarray]:
        if not key:
            return {"input_ids": np.array([self.pad_token_id]), "labels": np.array([IGNORE_INDEX]),
                    "seq_lengths": np.array([1])}  # fmt: skip
        if len(key) != 1 or key[0][1] != 0:
            raise ValueError(f"a pre-packed row is read whole, got the pieces {key}")
        row = self.dataset[int(key[0][0])]
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        labels = row.get("labels")
        return {"input_ids": ids, "labels": ids if labels is None else np.asarray(labels, dtype=np.int64),
                "seq_lengths": np.asarray(row["seq_lengths"], dtype=np.int64)}  # fmt: skip


def is_prepacked(dataset: Any) -> bool:
    """Whether ``dataset`` holds packed rows (a ``seq_lengths`` column or key)."""
    if hasattr(dataset, "column_names"):
        return "seq_lengths" in dataset.column_names
    return len(dataset) > 0 and isinstance(dataset[0], Mapping) and "seq_lengths" in dataset[0]


def packed_batches(
    dataset: Any,
    max_length: int,
    rows_per_batch: int,
    *,
    world_size: int,
    rank: int,
    seed: int,
    strategy: str = "best_fit_decreasing",
    overlong: str = "error",
    remainder: str = "empty",
    pad_token_id: int = 0,
) -> tuple[DistributedPackedBatchSampler, Any]:
    """The batch sampler of this rank's packed rows and the view that turns its keys into rows.

    Sequences are planned into rows of ``max_length`` tokens (re-planned every epoch); a dataset packed
    beforehand keeps its rows (one per key, each at most ``max_length`` tokens)."""
    from padless.integrations.datasets import sequence_lengths

    lengths = sequence_lengths(dataset)
    common = dict(num_replicas=world_size, rank=rank, seed=seed, remainder=remainder)
    if is_prepacked(dataset):
        if lengths.size and int(lengths.max()) > max_length:
            row = int(np.argmax(lengths))
            raise ValueError(f"packed row {row} holds {int(lengths[row])} tokens, more than max_length={max_length}")
        sampler = DistributedPackedBatchSampler(lengths, max_length, rows_per_batch, max_per_row=1, **common)
        view: Any = PrepackedRows(dataset, pad_token_id=pad_token_id)
    else:
        sampler = DistributedPackedBatchSampler(lengths, max_length, rows_per_batch, strategy=strategy,
                                                overlong=overlong, **common)  # fmt: skip
        view = PackedRowView(dataset, pad_token_id=pad_token_id)
    sampler.schedule()  # plan now: an overlong sequence fails here, not at the first step
    return sampler, view


def exact_collator(
    model: Any, max_length: int | None, *, device: Any, pad_token_id: int, dtype: Any = None, **kwargs: Any
) -> PackingCollator:
    """A :class:`padless.PackingCollator` for ``model``, after :func:`padless.resolve_backend` has
    accepted the model's attention backend for the device training runs on, its compute ``dtype``
    (``None``: the model's; see :func:`training_dtype`) and the row length. The model may still sit
    on the CPU in fp32: what counts is where the step runs."""
    from padless.attention.select import resolve_backend

    resolve_backend(model.config._attn_implementation, device=device, dtype=dtype, config=model,
                    max_length=max_length)  # fmt: skip
    return PackingCollator.for_model(model, device=device, dtype=dtype, max_length=max_length,
                                     pad_token_id=pad_token_id, **kwargs)  # fmt: skip


def training_dtype(args: Any) -> Any:
    """The compute dtype of a Trainer step: bf16 or fp16 autocast over the weights when ``args.bf16`` or
    ``args.fp16`` is set (fp32 master weights train in the half dtype), else ``None`` (the model's)."""
    import torch

    if getattr(args, "bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False):
        return torch.float16
    return None


def pad_token_id_for(model: Any, processing_class: Any = None) -> int:
    """An id to fill row ends with (never attended to, never trained): the tokenizer's or the model's
    pad token, else its EOS, else 0."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(model.config, "pad_token_id", None),
                      getattr(model.config, "eos_token_id", None)):
        if isinstance(candidate, list):
            candidate = candidate[0] if candidate else None
        if isinstance(candidate, int):
            return candidate
    return 0


def loader_for(trainer: Trainer, view: Any, sampler: DistributedPackedBatchSampler) -> EpochDataLoader:
    """The training loader over ``sampler``'s rows with the trainer's collator and worker settings."""
    args = trainer.args
    workers = args.dataloader_num_workers
    return EpochDataLoader(
        view, batch_sampler=sampler, collate_fn=trainer.data_collator, num_workers=workers,
        pin_memory=args.dataloader_pin_memory, persistent_workers=args.dataloader_persistent_workers and workers > 0,
    )  # fmt: skip


def owns_its_sharding(model: Any) -> None:
    """Tell Trainer that ``model``, sharded by :func:`padless.shard_model` before it was handed over,
    places its parameters and reduces its gradients itself: Trainer neither moves it nor wraps it in
    DDP, and prepares only the optimiser. That is Trainer's path (transformers 5.24) for a model
    sharded at load time (``from_pretrained(distributed_config=...)``), which it reads from the
    model's ``is_distributed_loading_by_transformers``; the flag behind it is set here. Trainer
    refuses checkpoints with optimiser state for such a model: pass ``save_only_model=True`` or
    ``save_strategy="no"``."""
    if not hasattr(type(model), "is_distributed_loading_by_transformers"):
        import transformers

        raise ValueError(f"transformers {transformers.__version__} has no path for a model sharded before Trainer "
                         "gets it (is_distributed_loading_by_transformers); pass the unsharded model and "
                         "TrainingArguments(fsdp=True, fsdp_config={'version': 2}) instead")  # fmt: skip
    model._is_distributed_loading_by_transformers = True
    if not model.is_distributed_loading_by_transformers:
        raise ValueError(f"{type(model).__name__}.is_distributed_loading_by_transformers does not follow its flag: "
                         "pass the unsharded model and TrainingArguments(fsdp=True) instead")  # fmt: skip


class PackedTrainer(Trainer):
    """``Trainer`` whose training micro-batches are padless' planned packed rows (module docstring).

    Takes Trainer's arguments plus, keyword-only: ``max_length`` (tokens per row), ``rows_per_batch``
    (rows per micro-batch; default ``args.per_device_train_batch_size``), ``strategy`` and ``overlong``
    (:func:`padless.plan_packs`), ``remainder`` (:data:`padless.planning.schedule.REMAINDERS`) and
    ``pad_token_id`` (default: :func:`pad_token_id_for`). ``data_collator`` may be a
    :class:`padless.PackingCollator` (default: one for the model's backend); evaluation batches go
    through it too. The plan's seed is ``args.data_seed`` or ``args.seed``.

    FSDP2: either hand over the model unsharded with ``TrainingArguments(fsdp=True,
    fsdp_config={"version": 2, ...})`` (accelerate shards it in ``prepare``; it does so on GPUs only,
    a CPU run is DDP), or shard it first with :func:`padless.shard_model` (any device, gloo included;
    see :func:`owns_its_sharding`). Either way the packed rows and the token-normalised loss give the
    gradient of one process over every rank's rows (tests/integrations/test_fsdp.py).
    """

    def __init__(
        self,
        model: Any = None,
        args: Any = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        *trainer_args: Any,
        max_length: int,
        rows_per_batch: int | None = None,
        strategy: str = "best_fit_decreasing",
        overlong: str = "error",
        remainder: str = "empty",
        pad_token_id: int | None = None,
        **trainer_kwargs: Any,
    ) -> None:
        if model is None:
            raise ValueError("PackedTrainer needs a model (model_init is not supported)")
        if data_collator is not None and not isinstance(data_collator, PackingCollator):
            raise ValueError(f"data_collator must be a padless PackingCollator (or None), got "
                             f"{type(data_collator).__name__}: another collator cannot place planned rows exactly")
        count_shifted_labels(model)  # before Trainer reads loss_type
        if is_sharded(model):
            owns_its_sharding(model)
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, processing_class, *trainer_args,
                         **trainer_kwargs)  # fmt: skip
        self.max_length = max_length
        self.rows_per_batch = rows_per_batch or self.args.per_device_train_batch_size
        self.plan_options = dict(strategy=strategy, overlong=overlong, remainder=remainder)
        self.pad_token_id = pad_token_id_for(model, processing_class) if pad_token_id is None else pad_token_id
        if data_collator is not None:  # the user's collator may not know the model: its batches must fit it
            from padless.batching.rowformat import check_collator

            data_collator = check_collator(model, data_collator, device=self.args.device, dtype=training_dtype(self.args))
        self.data_collator = data_collator or exact_collator(
            model, max_length, device=self.args.device, dtype=training_dtype(self.args) or compute_dtype(model),
            pad_token_id=self.pad_token_id,
            strategy=strategy, overlong=overlong,
        )  # fmt: skip
        self.batch_sampler: DistributedPackedBatchSampler | None = None
        self._rows: tuple[Any, DistributedPackedBatchSampler, Any] | None = None
        if train_dataset is not None:
            self._packed_rows()

    def _packed_rows(self) -> tuple[DistributedPackedBatchSampler, Any]:
        """The sampler and row view of the current ``train_dataset`` (built once per dataset)."""
        if self._rows is None or self._rows[0] is not self.train_dataset:
            args = self.args
            seed = args.data_seed if args.data_seed is not None else args.seed
            sampler, view = packed_batches(
                self.train_dataset, self.max_length, self.rows_per_batch, world_size=args.world_size,
                rank=args.process_index, seed=seed, pad_token_id=self.pad_token_id, **self.plan_options,
            )  # fmt: skip
            self._rows = (self.train_dataset, sampler, view)
            self.batch_sampler = sampler
        return self._rows[1], self._rows[2]

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError("PackedTrainer: training requires a train_dataset")
        sampler, view = self._packed_rows()
        return loader_for(self, view, sampler)

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Trainer's move to ``args.device``, remembering the boundary tensors' host copies (the collator
        made them on the CPU), so the padless attention reads them without a device sync."""
        from padless.attention.host import remember_moved

        prepared = super()._prepare_inputs(inputs)
        remember_moved(inputs, prepared)
        return prepared

    def _set_signature_columns_if_needed(self) -> None:
        """Keep ``seq_lengths`` through Trainer's column removal (evaluation loaders): without it a row
        packed beforehand would reach the collator as one document."""
        super()._set_signature_columns_if_needed()
        if "seq_lengths" not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, "seq_lengths"]
