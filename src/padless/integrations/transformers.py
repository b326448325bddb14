"""``PackedTrainer``: ``transformers.Trainer`` training padless' planned packed rows.

    from padless.integrations.transformers import PackedTrainer
    trainer = PackedTrainer(model=model, args=args, train_dataset=dataset, max_length=1024)   # was Trainer(...)

``dataset`` holds ``input_ids`` (and optionally ``labels``) per example: a ``datasets.Dataset``, a list
of dicts, :meth:`padless.data.load.TokenizedCorpus.features`, or rows packed beforehand by
:func:`padless.pack_dataset` (with ``seq_lengths``: each is kept as it is). Three things connect
padless to Trainer (read from the sources of the transformers version
:mod:`padless.attention.transformers_compat` names):

1. Rows. Trainer builds its DataLoader from a *sampler* and ``per_device_train_batch_size``; the only
   batch sampler it accepts is its own ``BatchRebalanceSampler``. So ``get_train_dataloader`` (the
   hook Trainer documents for custom loading) returns a loader over a
   :class:`padless.DistributedPackedBatchSampler`: every rank plans the same rows from (lengths, seed,
   epoch) and trains its share, ``rows_per_batch`` rows per micro-batch (default
   ``per_device_train_batch_size``). The loader is not passed through accelerate's ``prepare``, which
   would deal the already rank-aware batches out a second time, and it skips Trainer's column removal,
   which would strip ``seq_lengths``. Trainer calls ``set_epoch`` on the loader every epoch; the
   sampler then re-plans (equal-length sequences meet new partners, rows go to new steps and ranks).
   ``balance="cost"`` deals each step's rows so that the ranks' costs ``sum(a * l + l**2)`` over their
   documents are even, not their tokens (``a = 12 * hidden_size`` from the model's config unless
   ``cost_a`` is given; :mod:`padless.planning.balance`, docs/balance.md). Either way every rank runs the
   same number of micro-batches and every row is trained once per epoch (``remainder="empty"``).
2. Attention. The model's attention backend must isolate documents for this model, device and dtype
   (:meth:`padless.PackingCollator.for_model` asks the exactness rule once, else ``ValueError`` naming one that
   can); the collator holds its verdict and sends what that backend needs: ``cu_seq_lens_q/k`` for
   ``padless``, a 4D block-causal mask for ``sdpa``/``eager``; the start line reads that verdict.
3. Loss. Trainer sums the trained tokens of an optimiser step over its micro-batches and ranks
   (``num_items_in_batch``, ``average_tokens_across_devices``) and scales each rank's loss by the
   world size, as padless' ``step_num_items`` and ``causal_lm_loss(world_size=W)`` do. It counts the
   shifted labels ``labels[..., 1:]`` only when the model's ``loss_type`` maps to ``ForCausalLMLoss``;
   ``GPT2LMHeadModel`` has ``loss_type=None``, so Trainer would count ``labels[..., 0]`` too: one token
   too many per padded sequence whose first token is trained. :func:`count_shifted_labels` sets
   ``loss_type="ForCausalLM"``, the loss GPT-2 falls back to anyway; use it for padded Trainer runs too.

Under FSDP2 nothing of this changes (FSDP2 averages gradients over ranks as DDP does); see
:class:`PackedTrainer` for the two ways to shard.

The first packed step is checked on the model: a few of its documents run alone against their packed
rows (:mod:`padless.integrations.first_step`; ``guard=False`` turns it off, an
:class:`padless.IsolationGuard` sets its period). ``train`` first logs one line: model, backend, layout,
the rule's verdict, rows, how full they are, what the plan truncated, split or dropped, and the guard;
right after the first step, a line with the guard's finding and its cost.

The rows, sampler, collator and loader live in :mod:`padless.integrations.trainer_rows`; the start line,
record checks and errors in the trainer's words in :mod:`padless.integrations.trainer_boundary` (shared
with :mod:`padless.integrations.trl`); both are importable from here as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from padless._optional import require

require("accelerate", "transformers.Trainer")

from torch.utils.data import DataLoader  # noqa: E402
from transformers import Trainer  # noqa: E402

from padless.attention.transformers_compat import DISTRIBUTED_LOADING  # noqa: E402
from padless.batching.collate import PackingCollator  # noqa: E402
from padless.batching.samplers import DistributedPackedBatchSampler  # noqa: E402
from padless.integrations.first_step import attach_guard, guarded_loss, keep_placements  # noqa: E402
from padless.integrations.trainer_boundary import (  # noqa: E402,F401  (re-exported: the trainers' boundary)
    LAYOUT_NAMES,
    announce,
    check_token_records,
    first_without,
    in_trainer_words,
    logger,
    naming_argument,
    present,
    record_fields,
    records,
    shown,
    start_line,
    trainer_words,
)
from padless.integrations.trainer_context import (  # noqa: E402
    context_groups,
    context_step_loss,
    data_parallel_place,
    prepare_model,
    resolve_layout,
    use_padless_attention,
)
from padless.integrations.trainer_rows import (  # noqa: E402,F401  (re-exported: the trainers' rows)
    EpochDataLoader,
    PrepackedRows,
    balance_options,
    balance_said,
    dataset_image_patches,
    exact_collator,
    is_prepacked,
    loader_for,
    packed_batches,
    pad_token_id_for,
    plan_said,
    planned_documents_per_row,
    training_dtype,
)
from padless.models.fsdp import compute_dtype, is_sharded  # noqa: E402
from padless.planning.checks import OVERLONG_DEFAULT, check_int  # noqa: E402
from padless.planning.schedule import check_choices  # noqa: E402


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
    """Whether Trainer counts ``labels[..., 1:]`` for ``model`` (transformers' rule, read from
    :data:`padless.attention.transformers_compat.LOSS_UTILS`)."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    return LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss and not getattr(
        model.config, "is_encoder_decoder", False
    )


def _named(eval_dataset: Any) -> list[tuple[str, Any]]:
    """``eval_dataset`` (one dataset, a dict of them or None) as (trainer argument, dataset) pairs."""
    if isinstance(eval_dataset, Mapping):
        return [(f"eval_dataset[{name!r}]", d) for name, d in eval_dataset.items()]
    return [] if eval_dataset is None else [("eval_dataset", eval_dataset)]


PACKED_TRAINER_WORDS: dict[str, str] = {
    "max_length": "PackedTrainer.max_length", "rows_per_batch": "PackedTrainer.rows_per_batch",
    "strategy": "PackedTrainer.strategy", "overlong": "PackedTrainer.overlong",
    "overlong policy": "PackedTrainer.overlong", "remainder": "PackedTrainer.remainder",
    "pad_token_id": "PackedTrainer.pad_token_id", "balance": "PackedTrainer.balance", "cost_a": "PackedTrainer.cost_a",
    "max_image_patches": "PackedTrainer.max_image_patches", "context_parallel": "PackedTrainer.context_parallel",
    "context_layout": "PackedTrainer.context_layout",
    "backend": "attn_implementation='{backend}' when loading the model",
}  # fmt: skip
"""Library argument -> ``PackedTrainer`` argument, for :func:`in_trainer_words`."""


def owns_its_sharding(model: Any) -> None:
    """Tell Trainer that ``model``, sharded by :func:`padless.models.fsdp.shard_model` before it was handed over,
    places its parameters and reduces its gradients itself: Trainer neither moves it nor wraps it in
    DDP, and prepares only the optimiser. That is Trainer's path
    (:data:`padless.attention.transformers_compat.DISTRIBUTED_LOADING`) for a model sharded at load time
    (``from_pretrained(distributed_config=...)``), which it reads from the model's
    ``is_distributed_loading_by_transformers``; the flag behind it is set here. Trainer
    refuses checkpoints with optimiser state for such a model: pass ``save_only_model=True`` or
    ``save_strategy="no"``. Its gradient accumulation (FSDP2's ``no_sync``) reads the model config's
    ``distributed_config`` as ``from_pretrained`` leaves it: one FSDP group over every rank, no replicas."""
    if not hasattr(type(model), DISTRIBUTED_LOADING):
        import transformers

        raise ValueError(
            f"transformers {transformers.__version__} has no path for a model sharded before Trainer "
            "gets it (is_distributed_loading_by_transformers); pass the unsharded model and "
            "TrainingArguments(fsdp=True, fsdp_config={'version': 2}) instead"
        )
    model._is_distributed_loading_by_transformers = True
    if getattr(model.config, "distributed_config", None) is None:  # Trainer's no_sync under accumulation reads it
        import torch.distributed as dist
        from transformers.distributed.configuration_utils import DistributedConfig

        world = dist.get_world_size() if dist.is_initialized() else 1
        model.config.distributed_config = DistributedConfig(fsdp_size=world, dp_replicate_size=1)
    if not model.is_distributed_loading_by_transformers:
        raise ValueError(
            f"{type(model).__name__}.is_distributed_loading_by_transformers does not follow its flag: "
            "pass the unsharded model and TrainingArguments(fsdp=True) instead"
        )


class PackedTrainer(Trainer):
    """``Trainer`` whose training micro-batches are padless' planned packed rows (module docstring).

    Takes Trainer's arguments plus, keyword-only: ``max_length`` (tokens per row), ``rows_per_batch``
    (rows per micro-batch; default ``args.per_device_train_batch_size``), ``strategy`` and ``overlong``
    (:func:`padless.plan_packs`), ``remainder`` (:data:`padless.planning.schedule.REMAINDERS`) and
    ``pad_token_id`` (default: :func:`pad_token_id_for`), ``balance`` (``"tokens"``, default, or ``"cost"``:
    each step's rows dealt so that the ranks' costs ``sum(a * l + l**2)`` are even, docs/balance.md) and
    ``cost_a`` (``"cost"`` only; default ``12 * hidden_size`` of the model's config), ``max_image_patches``
    (a vision-language dataset: the most vision-encoder patches a row's images may hold, a second limit of
    the plan), ``guard`` (``True``, default: the first packed step checked on the model; ``False``; or an
    :class:`padless.IsolationGuard` with its period: :mod:`padless.integrations.first_step`),
    ``context_parallel`` (ranks each row is split over under ``torchrun``, data parallel over the rest) and
    ``context_layout`` (``"auto"``, ``"contiguous"``, ``"zigzag"`` or ``"striped"``: :mod:`padless.integrations.trainer_context`). ``data_collator`` may be a
    :class:`padless.PackingCollator` (default: one for the model's backend); evaluation batches go
    through it too. The plan's seed is ``args.data_seed`` or ``args.seed``.

    FSDP2: either hand over the model unsharded with ``TrainingArguments(fsdp=True,
    fsdp_config={"version": 2, ...})`` (accelerate shards it in ``prepare``; it does so on GPUs only,
    a CPU run is DDP), or shard it first with :func:`padless.models.fsdp.shard_model` (any device, gloo included;
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
        overlong: str = OVERLONG_DEFAULT,
        remainder: str = "empty",
        pad_token_id: int | None = None,
        balance: str = "tokens",
        cost_a: float | None = None,
        max_image_patches: int | None = None,
        guard: Any = True,
        context_parallel: int = 1,
        context_layout: str = "auto",
        **trainer_kwargs: Any,
    ) -> None:
        with trainer_words(PACKED_TRAINER_WORDS):
            if model is None:
                raise ValueError("PackedTrainer needs a model (model_init is not supported)")
            check_int(max_length, "max_length")  # before Trainer's set-up: a bad argument fails at once
            if rows_per_batch is not None:
                check_int(rows_per_batch, "rows_per_batch")
            check_choices(strategy, overlong, remainder)
            balanced = balance_options(model, balance, cost_a)
            if data_collator is not None and not isinstance(data_collator, PackingCollator):
                raise ValueError(
                    f"PackedTrainer(data_collator=...) must be a padless PackingCollator (or None), got "
                    f"{type(data_collator).__name__}: another collator cannot place planned rows exactly"
                )
            for argument, dataset in _named(eval_dataset):  # train_dataset: in _packed_rows
                check_token_records(dataset, argument)
            count_shifted_labels(model)  # before Trainer reads loss_type
            if is_sharded(model):
                owns_its_sharding(model)
            super().__init__(
                model,
                args,
                data_collator,
                train_dataset,
                eval_dataset,
                processing_class,
                *trainer_args,
                **trainer_kwargs,
            )
            self.padless_context = context_groups(context_parallel, context_layout, self.args)
            if self.padless_context is not None:  # the collator sends what padless attention reads
                use_padless_attention(model)
            self.max_length = max_length
            self.rows_per_batch = rows_per_batch or self.args.per_device_train_batch_size
            self.plan_options = dict(
                strategy=strategy,
                overlong=overlong,
                remainder=remainder,
                max_image_patches=max_image_patches,
                **balanced,
            )
            self.pad_token_id = pad_token_id_for(model, processing_class) if pad_token_id is None else pad_token_id
            if data_collator is not None:  # the user's collator may not know the model: its batches must fit it
                from padless.batching.rowformat import check_collator

                data_collator = check_collator(
                    model, data_collator, device=self.args.device, dtype=training_dtype(self.args)
                )
            self.data_collator = data_collator or exact_collator(
                model,
                max_length,
                device=self.args.device,
                dtype=training_dtype(self.args) or compute_dtype(model),
                pad_token_id=self.pad_token_id,
                strategy=strategy,
                overlong=overlong,
            )
            self.padless_guard = attach_guard(self, guard, "PackedTrainer")
            if self.padless_context is not None:
                prepare_model(model, self.padless_context)
                self.model_accepts_loss_kwargs = True  # the cp loss is padless' own: Trainer counts the step's tokens
            self.batch_sampler: DistributedPackedBatchSampler | None = None
            self._rows: tuple[Any, DistributedPackedBatchSampler, Any] | None = None
            if train_dataset is not None:
                self._packed_rows()

    def _packed_rows(self) -> tuple[DistributedPackedBatchSampler, Any]:
        """The sampler and row view of the current ``train_dataset`` (built once per dataset)."""
        if self._rows is None or self._rows[0] is not self.train_dataset:
            args = self.args
            seed = args.data_seed if args.data_seed is not None else args.seed
            check_token_records(self.train_dataset, "train_dataset")
            replicas, replica = data_parallel_place(self.padless_context, args)
            sampler, view = packed_batches(
                self.train_dataset,
                self.max_length,
                self.rows_per_batch,
                world_size=replicas,
                rank=replica,
                seed=seed,
                pad_token_id=self.pad_token_id,
                **self.plan_options,
            )
            self._rows = (self.train_dataset, sampler, view)
            self.batch_sampler = sampler
        return self._rows[1], self._rows[2]

    def start_line(self) -> str:
        """What :meth:`train` logs first (:func:`start_line`): model, backend, layout, verdict, rows."""
        with trainer_words(PACKED_TRAINER_WORDS):
            sampler, _ = self._packed_rows()
        rows = f"{self.max_length}-token rows{balance_said(self.plan_options)}"
        planned, lost = plan_said(self.train_dataset, sampler, self.max_length)
        if self.padless_context is not None:
            self.padless_context, said = resolve_layout(
                self.padless_context, self.train_dataset, sampler, self.max_length, self.model
            )
            planned = f"{planned}, {said}"
        documents = f"{planned}, {self.padless_guard.said()}{lost}"
        return start_line(self.model, self.data_collator, rows=rows, documents=documents)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """Trainer's ``train``, after logging :meth:`start_line` (:func:`announce`)."""
        if self.train_dataset is None:
            raise ValueError("PackedTrainer: training requires a train_dataset")
        announce(self, self.start_line())
        with trainer_words(PACKED_TRAINER_WORDS):
            return super().train(*args, **kwargs)

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError("PackedTrainer: training requires a train_dataset")
        with trainer_words(PACKED_TRAINER_WORDS):
            sampler, view = self._packed_rows()
        return loader_for(self, view, sampler)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        """Trainer's evaluation loader, after the records of the dataset it reads are checked."""
        chosen = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(chosen, str):  # evaluate() over a dict of datasets asks for each by name
            named = [(f"eval_dataset[{chosen!r}]", self.eval_dataset[chosen])]
        else:
            named = _named(chosen)
        for argument, dataset in named:
            check_token_records(dataset, argument)
        return super().get_eval_dataloader(eval_dataset)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        with trainer_words(PACKED_TRAINER_WORDS):
            return super().evaluate(*args, **kwargs)

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Trainer's move to ``args.device``, remembering the boundary tensors' host copies (the collator
        made them on the CPU), so the padless attention reads them without a device sync. A batch whose
        ``attention_mask`` cannot keep its documents apart (a collator that adds a 2D mask to packed rows)
        is refused first."""
        from padless.attention.accept import check_attention_mask
        from padless.attention.host import remember_moved

        check_attention_mask(inputs)
        prepared = super()._prepare_inputs(inputs)
        remember_moved(inputs, prepared)
        return keep_placements(inputs, prepared)

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """Trainer's loss; on the guarded step, the guard runs on its logits first (:mod:`padless.integrations.first_step`).
        With ``context_parallel``: this rank's share of a training step over its shard of the rows
        (:mod:`padless.integrations.trainer_context`; evaluation runs whole rows)."""
        if self.padless_context is not None and model.training and not return_outputs:
            return context_step_loss(self, model, inputs, num_items_in_batch)
        return guarded_loss(self.padless_guard, super().compute_loss, model, inputs, return_outputs, num_items_in_batch)

    def _set_signature_columns_if_needed(self) -> None:
        """Keep ``seq_lengths`` through Trainer's column removal (evaluation loaders): without it a row
        packed beforehand would reach the collator as one document."""
        super()._set_signature_columns_if_needed()
        if "seq_lengths" not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, "seq_lengths"]
