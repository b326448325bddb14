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

At the trainer boundary (shared with :mod:`padless.integrations.trl`): ``train`` first logs one line
saying what trains and whether it is exact (:func:`start_line`, :func:`shown`); the records are checked
before anything reads them (:func:`check_token_records`: a bad record is named with its number from 1
and the fields it has); and padless' errors raised inside say their arguments as the trainer takes
them (:func:`trainer_words`: ``max_length 16`` -> ``PackedTrainer(max_length=16)``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from padless._optional import require

require("accelerate", "transformers.Trainer")

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import Trainer  # noqa: E402

from padless.attention.transformers_compat import DISTRIBUTED_LOADING
from padless.batching.collate import PackingCollator
from padless.batching.rows import PackedRowView
from padless.batching.samplers import DistributedPackedBatchSampler
from padless.layout import IGNORE_INDEX  # noqa: E402
from padless.models.fsdp import compute_dtype, is_sharded
from padless.planning.balance import BALANCES, check_balance, cost_a_from_config
from padless.planning.checks import OVERLONG_DEFAULT, check_choice, check_int
from padless.planning.schedule import RowKey, check_choices

logger = logging.getLogger(__name__)
"""The trainers' start line (:func:`announce`) goes here, at INFO (shown by default: :func:`shown`)."""


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
    """Whether Trainer counts ``labels[..., 1:]`` for ``model`` (transformers' rule, read from
    :data:`padless.attention.transformers_compat.LOSS_UTILS`)."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    return LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss and not getattr(
        model.config, "is_encoder_decoder", False
    )


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
            return {
                "input_ids": np.array([self.pad_token_id]),
                "labels": np.array([IGNORE_INDEX]),
                "seq_lengths": np.array([1]),
            }
        if len(key) != 1 or key[0][1] != 0:
            raise ValueError(f"a pre-packed row is read whole, got the pieces {key}")
        from padless.batching.vision import ALL_VISION_KEYS

        row = self.dataset[int(key[0][0])]
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        labels = row.get("labels")
        return {
            "input_ids": ids,
            "labels": ids if labels is None else np.asarray(labels, dtype=np.int64),
            "seq_lengths": np.asarray(row["seq_lengths"], dtype=np.int64),
            # a row packed with its images (padless pack, pack_dataset) keeps them, in document order
            **{k: row[k] for k in ALL_VISION_KEYS if row.get(k) is not None},
        }


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
    overlong: str = OVERLONG_DEFAULT,
    remainder: str = "empty",
    pad_token_id: int = 0,
    balance: str = "tokens",
    cost_a: float | None = None,
    max_image_patches: int | None = None,
) -> tuple[DistributedPackedBatchSampler, Any]:
    """The batch sampler of this rank's packed rows and the view that turns its keys into rows.

    Sequences are planned into rows of ``max_length`` tokens (re-planned every epoch); a dataset packed
    beforehand keeps its rows (one per key, each at most ``max_length`` tokens). ``balance``/``cost_a``:
    what each step's deal to the ranks evens out (:func:`balance_options`). ``max_image_patches``: a
    second limit per row, the vision-encoder patches of its documents' images
    (:func:`dataset_image_patches`), so that one row does not collect every large image."""
    from padless.integrations.datasets import sequence_lengths

    lengths = sequence_lengths(dataset)
    common: dict[str, Any] = dict(num_replicas=world_size, rank=rank, seed=seed, remainder=remainder, balance=balance,
                                  cost_a=cost_a)  # fmt: skip
    if max_image_patches is not None:
        check_int(max_image_patches, "max_image_patches")
        if is_prepacked(dataset):
            raise ValueError(
                "max_image_patches plans rows; rows packed beforehand (seq_lengths) keep theirs: bound them when "
                "packing (padless.PackedRows(max_image_patches=...)) or pass the sequences unpacked"
            )
        common.update(costs=dataset_image_patches(dataset), max_cost=max_image_patches)
    if is_prepacked(dataset):
        if balance == "cost":  # the schedule sees one length per row: it would price a row as one document
            raise ValueError(
                "balance='cost' prices a row by its documents, and rows packed beforehand (seq_lengths) "
                "are dealt as one length each; pass the sequences unpacked (the trainer plans the "
                "rows), or balance='tokens'"
            )
        if lengths.size and int(lengths.max()) > max_length:
            row = int(np.argmax(lengths))
            raise ValueError(f"packed row {row} holds {int(lengths[row])} tokens, more than max_length={max_length}")
        sampler = DistributedPackedBatchSampler(lengths, max_length, rows_per_batch, max_per_row=1, **common)
        view: Any = PrepackedRows(dataset, pad_token_id=pad_token_id)
    else:
        sampler = DistributedPackedBatchSampler(
            lengths, max_length, rows_per_batch, strategy=strategy, overlong=overlong, **common
        )
        view = PackedRowView(dataset, pad_token_id=pad_token_id)
    sampler.schedule()  # plan now: an overlong sequence fails here, not at the first step
    return sampler, view


def dataset_image_patches(dataset: Any) -> np.ndarray:
    """``[n]`` int64: the vision-encoder patches of every sequence's images (0 for text), read from the
    ``image_grid_thw`` / ``video_grid_thw`` columns where a ``datasets.Dataset`` has them (no pixels read),
    else per feature (:func:`padless.batching.vision.image_patches`)."""
    from padless.batching.vision import image_patches

    columns = getattr(dataset, "column_names", None) or []
    grids = [c for c in ("image_grid_thw", "video_grid_thw") if c in columns]
    if grids:
        total = np.zeros(len(dataset), dtype=np.int64)
        for column in grids:
            for i, grid in enumerate(dataset[column]):
                if grid:
                    total[i] += int(np.asarray(grid, dtype=np.int64).reshape(-1, 3).prod(axis=1).sum())
        return total
    return np.fromiter((image_patches(dataset[i]) for i in range(len(dataset))), dtype=np.int64, count=len(dataset))


def balance_options(model: Any, balance: object, cost_a: Any) -> dict[str, Any]:
    """``balance`` and ``cost_a`` for :class:`padless.DistributedPackedBatchSampler`, checked
    (:func:`padless.planning.balance.check_balance`): ``"tokens"`` with no ``cost_a``, or ``"cost"`` with
    ``cost_a`` a number, else read once from ``model``'s config (``12 * hidden_size``:
    :func:`padless.planning.balance.cost_a_from_config`; a PEFT model's base model). ``ValueError`` names
    ``balance`` or ``cost_a``."""
    from padless.attention.adapters import base_model_of

    check_choice(balance, BALANCES, "balance")
    if balance == "cost" and cost_a is None:
        cost_a = cost_a_from_config(base_model_of(model).config)
    return {"balance": balance, "cost_a": check_balance(balance, cost_a)}


def balance_said(options: Mapping[str, Any]) -> str:
    """What the start line adds for :func:`balance_options`' ``options``: nothing for ``"tokens"`` (the
    default), else ``", ranks balanced by cost a*l + l**2 (a=768)"``; and ``", at most 1024 image patches
    per row"`` with ``max_image_patches``."""
    images = (
        f", at most {options['max_image_patches']:,} image patches per row" if options.get("max_image_patches") else ""
    )
    if options.get("balance", "tokens") == "tokens":
        return images
    return f", ranks balanced by cost a*l + l**2 (a={options['cost_a']:g}){images}"


def exact_collator(
    model: Any, max_length: int | None, *, device: Any, pad_token_id: int, dtype: Any = None, **kwargs: Any
) -> PackingCollator:
    """A :class:`padless.PackingCollator` fitted to ``model`` (:meth:`padless.PackingCollator.for_model`:
    the exactness rule asked once, its verdict held as the collator's ``verdict``, else ``ValueError`` naming
    a backend that is exact) for the device training runs on, its compute ``dtype`` (``None``: the
    model's, an FSDP2 model's ``param_dtype`` included: :func:`padless.devices.compute_target`; see
    :func:`training_dtype`) and the row length. The model may still sit on the CPU in fp32: what
    counts is where the step runs."""
    return PackingCollator.for_model(
        model, device=device, dtype=dtype, max_length=max_length, pad_token_id=pad_token_id, **kwargs
    )


def training_dtype(args: Any) -> Any:
    """The compute dtype of a Trainer step: bf16 or fp16 autocast over the weights when ``args.bf16`` or
    ``args.fp16`` is set (fp32 master weights train in the half dtype), else ``None`` (the model's)."""
    if getattr(args, "bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False):
        return torch.float16
    return None


def pad_token_id_for(model: Any, processing_class: Any = None) -> int:
    """An id to fill row ends with (never attended to, never trained): the tokenizer's or the model's
    pad token, else its EOS, else 0."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(model.config, "pad_token_id", None),
        getattr(model.config, "eos_token_id", None),
    ):
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
        view,
        batch_sampler=sampler,
        collate_fn=trainer.data_collator,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
    )


LAYOUT_NAMES: dict[str, str] = {"mask4d": "4d-mask", "varlen": "varlen", "position_ids": "position-ids"}
"""How the start line names a collator's attention inputs (:data:`padless.attention.select.AttentionInputs`)."""


def start_line(model: Any, collator: PackingCollator | None, *, rows: str, documents: str) -> str:
    """The line a padless trainer logs when training starts: the model, its attention backend, the row
    layout the collator sends, the rule's verdict (the collator was fitted to this model by
    ``for_model`` or :func:`padless.check_collator`, which raise otherwise), the ``rows`` and the
    ``documents`` per row::

        padless: GPT2LMHeadModel, attention sdpa, layout 4d-mask, exact (padless rule), 160-token rows,
        2.7 documents per row (planned rows)

    ``collator=None``: padded batches (nothing packed, so nothing to isolate)."""
    from padless.attention.adapters import base_model_of

    inner = base_model_of(model)
    name = type(inner).__name__ if inner is model else f"{type(model).__name__}({type(inner).__name__})"
    parts = [f"padless: {name}", f"attention {inner.config._attn_implementation}"]
    if collator is None:
        parts += ["layout padded", "exact (padded: nothing packed)"]
    else:
        layout = LAYOUT_NAMES.get(collator.attention, collator.attention)
        windows = collator.windows
        if isinstance(windows, Mapping):  # one mask per layer type: name the windows it carries
            windows = ", ".join(map(str, sorted({w for w in windows.values() if w is not None}))) or None
        if windows is not None:
            layout += f" with sliding window {windows}"
        verdict = "exact (padless rule)" if collator.verdict is not None else "not checked by padless' rule"
        parts += [f"layout {layout}", verdict]
        v = collator.verdict
        if v is not None and v.vision is not None:
            parts.append(f"images packed with their documents ({v.vision.family})")
        elif v is not None and v.images_reason is not None and "no vision tower" not in v.images_reason:
            parts.append("images refused (text-only rows)")
    return ", ".join([*parts, rows, documents])


def planned_documents_per_row(dataset: Any, sampler: DistributedPackedBatchSampler) -> float:
    """Mean documents per row of ``sampler``'s current plan, every rank's rows (a piece of a split
    sequence trains as a document and counts as one); for rows packed beforehand, their ``seq_lengths``."""
    from padless.integrations.datasets import sequence_lengths

    if is_prepacked(dataset):
        docs = sequence_lengths(dataset, "seq_lengths")
        return float(docs.mean()) if docs.size else 0.0
    plan = sampler.schedule().plan
    return plan.index.size / max(plan.num_rows, 1)


def shown(log: logging.Logger) -> logging.Logger:
    """``log``, visible by default. Trainer logs its own start-up lines at INFO, which transformers'
    default verbosity (WARNING) hides; the start line says whether the run is exact, so it must reach
    the user, yet it is no warning. So, as PyTorch Lightning and DeepSpeed do for their start-up lines
    (and as transformers gives its library logger a stderr handler): where the application has set up
    no logging (no handler up to the root, no level on ``padless``), ``log`` gets a stderr handler at
    INFO; a setup of its own (``logging.basicConfig``, a level on ``logging.getLogger("padless")``)
    is left alone. Silence it with ``logging.getLogger("padless").setLevel(logging.WARNING)`` first."""
    if not log.hasHandlers() and all(x.level == logging.NOTSET for x in (log, logging.getLogger("padless"))):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


def announce(trainer: Trainer, line: str) -> None:
    """Log the start ``line`` at INFO through :data:`logger` (:func:`shown`), on the main process only."""
    if trainer.is_world_process_zero():
        shown(logger).info(line)


def present(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record``'s fields that hold a value: a ``datasets.Dataset`` gives every record every column,
    ``None`` where the record had no such field (inside messages too)."""
    return {k: v for k, v in record.items() if v is not None}


def records(dataset: Any, columns: list[str] | None = None) -> Iterator[tuple[int, Any]]:
    """``(record number from 1, record)`` of a ``datasets.Dataset`` (read in batches of 1,000, only
    ``columns`` if given; :func:`present` fields) or of any iterable of records."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "iter"):
        view = dataset
        if columns is not None:
            columns = [c for c in columns if c in view.column_names]
            if not columns:  # none of them: every record is empty of them
                yield from ((n, {}) for n in range(1, len(view) + 1))
                return
            view = view.select_columns(columns)
        number = 0
        for batch in view.with_format("arrow").iter(batch_size=1000):
            for record in batch.to_pylist():
                number += 1
                yield number, present(record)
        return
    for number, record in enumerate(dataset, 1):
        yield number, present(record) if isinstance(record, Mapping) else record


def record_fields(dataset: Any, number: int) -> Any:
    """Record ``number`` (from 1) of ``dataset`` with every field it has (:func:`present`)."""
    record = dataset.with_format(None)[number - 1] if hasattr(dataset, "with_format") else dataset[number - 1]
    return present(record) if isinstance(record, Mapping) else record


def first_without(dataset: Any, field: str) -> int | None:
    """The number (from 1) of the first record of ``dataset`` without ``field``, else None; a
    ``datasets.Dataset`` is answered from its columns and their missing values, without decoding rows."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "with_format"):
        if not len(dataset):
            return None
        if field not in dataset.column_names:
            return 1
        column = dataset.with_format("arrow", columns=[field])[:][field]
        if not column.null_count:
            return None
        return int(np.argmax(column.is_null().to_numpy(zero_copy_only=False))) + 1
    for number, record in records(dataset):
        if not isinstance(record, Mapping) or record.get(field) is None:
            return number
    return None


def check_token_records(dataset: Any, argument: str = "train_dataset", trainer: str = "PackedTrainer") -> None:
    """Raise ``ValueError`` naming the first record of ``dataset`` without ``input_ids``: its number
    (from 1) and its fields, by padless' record check (:func:`padless.data.records.record_kind`), before
    anything reads the dataset and fails on a raw ``KeyError``."""
    from padless.data.records import RecordError, record_kind, where

    number = first_without(dataset, "input_ids")
    if number is None:
        return
    at = where(number)
    with naming_argument(argument):
        kind = record_kind(record_fields(dataset, number), at)  # raises: none of the fields padless knows
        raise RecordError(
            "not_tokens",
            f"{at}: a {kind!r} record without 'input_ids': {trainer} trains token ids; "
            "tokenize it first (padless.load_corpus), or train text and chats with "
            "padless.integrations.trl.SFTTrainer",
        )


@contextmanager
def naming_argument(argument: str) -> Iterator[None]:
    """Record errors raised inside name the trainer argument that holds the records (``train_dataset:``)."""
    from padless.data.records import RecordError

    try:
        yield
    except RecordError as err:
        err.args = (f"{argument}: {err}", *err.args[1:])
        raise


def in_trainer_words(message: str, words: Mapping[str, str]) -> str:
    """A padless message in the words of a trainer, as the CLI puts messages in its flags
    (``padless.cli._shared.as_flags``). ``words``: library argument -> where the trainer takes it, as
    ``Owner.field``; ``{"overlong": "SFTTrainer.overlong", "seq_length": "SFTConfig.max_length"}`` turns

    * ``overlong='truncate'`` into ``SFTTrainer(overlong='truncate')``,
    * ``longer than max_length 16`` / ``seq_length=16`` into ``SFTConfig(max_length=16)``,
    * ``unknown overlong policy 'x'`` (key ``"overlong policy"``) into ``unknown SFTTrainer(overlong='x')``,
    * ``dropped by overlong`` / ``max_length must`` into ``dropped by SFTTrainer(overlong=...)`` /
      ``SFTConfig(max_length=...) must``;

    key ``"backend"``: a note after ``use backend 'x'`` (``{backend}`` is the backend's name)."""
    value = r"""(?P<v>'[^']*'|"[^"]*"|[^\s,;:)]+)"""
    for name in sorted((w for w in words if w != "backend"), key=len, reverse=True):
        owner, field = words[name].rsplit(".", 1)
        said = lambda m: f"{owner}({field}={m['v']})"  # noqa: B023,E731
        message = re.sub(rf"(?<=unknown ){re.escape(name)} {value}", said, message)
        message = re.sub(rf"(?<![\w.(]){re.escape(name)}={value}", said, message)
        message = re.sub(rf"(?<![\w.(]){re.escape(name)} (?P<v>\d+)\b", said, message)
        message = re.sub(rf"(?<=by ){re.escape(name)}\b(?![=(\w])", f"{owner}({field}=...)", message)
        message = re.sub(rf"(?<![\w.(]){re.escape(name)}(?= must\b)", f"{owner}({field}=...)", message)
    if "backend" in words:
        note = words["backend"]
        message = re.sub(r"use backend '(?P<b>[\w-]+)'", lambda m: f"{m[0]} ({note.format(backend=m['b'])})", message)
    return message


@contextmanager
def trainer_words(words: Mapping[str, str]) -> Iterator[None]:
    """A ``ValueError`` raised inside, by padless code, says its arguments as the trainer takes them
    (:func:`in_trainer_words`); other libraries' errors pass as they are."""
    try:
        yield
    except ValueError as err:
        if _raised_by_padless(err) and err.args and isinstance(err.args[0], str):
            err.args = (in_trainer_words(err.args[0], words), *err.args[1:])
        raise


def _raised_by_padless(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("padless.")


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
    "max_image_patches": "PackedTrainer.max_image_patches",
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
    ``save_strategy="no"``."""
    if not hasattr(type(model), DISTRIBUTED_LOADING):
        import transformers

        raise ValueError(
            f"transformers {transformers.__version__} has no path for a model sharded before Trainer "
            "gets it (is_distributed_loading_by_transformers); pass the unsharded model and "
            "TrainingArguments(fsdp=True, fsdp_config={'version': 2}) instead"
        )
    model._is_distributed_loading_by_transformers = True
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
    the plan). ``data_collator`` may be a
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
            sampler, view = packed_batches(
                self.train_dataset,
                self.max_length,
                self.rows_per_batch,
                world_size=args.world_size,
                rank=args.process_index,
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
        per_row = planned_documents_per_row(self.train_dataset, sampler)
        rows = f"{self.max_length}-token rows{balance_said(self.plan_options)}"
        return start_line(
            self.model, self.data_collator, rows=rows, documents=f"{per_row:.1f} documents per row (planned rows)"
        )

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
        return prepared

    def _set_signature_columns_if_needed(self) -> None:
        """Keep ``seq_lengths`` through Trainer's column removal (evaluation loaders): without it a row
        packed beforehand would reach the collator as one document."""
        super()._set_signature_columns_if_needed()
        if "seq_lengths" not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, "seq_lengths"]
