"""The first packed step checked on the user's own model, in every padless trainer.

``PackedTrainer``, ``SFTTrainer``, ``GRPOTrainer`` and ``DPOTrainer`` run an
:class:`padless.IsolationGuard` on their first packed forward by default: a few documents of that
batch run alone and their logits are compared with their place in the packed rows, judged against
padding's own noise (:mod:`padless.isolation.guard`). The exactness rule decides from what the model
is; the guard measures what it does, on the user's model, data, device and dtype, before the first
optimiser step. A model that no sweep foresaw then stops here, naming the documents, instead of
training on documents that see each other.

* ``guard=True`` (default): :func:`default_guard`, the first packed forward only, its cost bounded by
  :data:`DEFAULT_BUDGET` of the batch's tokens.
* ``guard=False``: no check.
* ``guard=IsolationGuard(...)``: its period and options (``every=100``: every 100th packed forward;
  ``documents``, ``budget``, ``on_failure``, ``tolerance``).

Where the guard reads the step's logits (``PackedTrainer``: the training forward's own, unless dropout is
on) it adds only the runs alone and the padded reference; TRL's trainers build no full logits
(``SFTTrainer``'s fused LM head; ``GRPOTrainer`` and ``DPOTrainer`` keep the trained positions' only), so
their guard runs each checked document in a window of its row instead (one forward of a few dozen tokens
each, without gradients: :func:`padless.isolation.guard.IsolationGuard.check`). Its cost is measured, the guard's time against the whole first step's (Trainer's
``on_step_begin`` to ``on_step_end``), and logged right after the first step::

    padless: isolation guard, step 1: 2 documents (64 tokens) run alone match their packed rows (max |diff|
    1.9e-06, padding's noise 1.2e-06, limit 3.0e-04, float32); the guard took 0.21 s, 1.8% of the step (11.7 s)

A model sharded by FSDP runs every forward on all ranks together; a rank running documents alone by
itself would wait for the others, so the guard is off there (the start line says so).
"""

from __future__ import annotations

import time
from typing import Any

from padless._optional import require

require("accelerate", "padless' trainers")

from transformers import TrainerCallback  # noqa: E402

from padless.isolation.guard import GuardCheck, IsolationError, IsolationGuard, dropout_active  # noqa: E402

DEFAULT_BUDGET = 0.05
"""The default guard's bound: its runs alone and padded hold at most this share of the checked batch's
tokens (:attr:`padless.IsolationGuard.budget`), against a step's forward and backward of all of them."""


def default_guard() -> IsolationGuard:
    """The guard a trainer runs when ``guard=True``: the first call only, 2 documents, :data:`DEFAULT_BUDGET`."""
    return IsolationGuard(every=None, documents=2, budget=DEFAULT_BUDGET)


class FirstStepGuard:
    """One trainer's guard: whether it runs on a forward, its timing, and what the trainer says of it.

    ``guard``: the trainer's ``guard=`` argument (``True``, ``False`` or an :class:`padless.IsolationGuard`);
    ``trainer``: its name for messages (``"PackedTrainer"``); ``off``: why it cannot run (a sharded
    model), or None."""

    def __init__(self, guard: Any, trainer: str, off: str | None = None) -> None:
        if guard is True:
            guard = default_guard()
        elif guard is False or guard is None:
            guard = None
        elif not isinstance(guard, IsolationGuard):
            raise ValueError(
                f"{trainer}(guard=...) must be True (check the first packed step), False or a "
                f"padless.IsolationGuard, got {type(guard).__name__}"
            )
        self.trainer = trainer
        self.off = off if guard is not None else None
        self.guard: IsolationGuard | None = None if off is not None else guard
        self.checks: list[tuple[GuardCheck, float]] = []
        """Every check run, with its seconds."""
        self.step_seconds: float | None = None
        """The first training step's seconds, guard included (None until it ends)."""
        self._remembered: list[tuple[bytes, Any]] = []

    def said(self) -> str:
        """What the start line says of the guard."""
        if self.off is not None:
            return f"isolation guard off ({self.off})"
        if self.guard is None:
            return "isolation guard off (guard=False)"
        if self.guard.every is None:
            return "isolation guard on step 1"
        return f"isolation guard on step 1 and every {self.guard.every} packed forwards"

    def due(self, model: Any) -> bool:
        """Whether the next training forward of ``model`` is checked."""
        return self.guard is not None and bool(getattr(model, "training", False)) and self.guard.due()

    def tick(self) -> None:
        """Count a training forward that is not checked (the guard's period counts every packed forward)."""
        if self.guard is not None:
            self.guard.calls += 1

    def wants_logits(self, model: Any) -> bool:
        """Whether the step's own logits may be compared (no dropout on in training mode)."""
        return not dropout_active(model)

    def __call__(self, model: Any, batch: Any, logits: Any = None) -> GuardCheck | None:
        """Run the guard on ``batch`` (``logits``: the step's, or None to re-run the batch), timed;
        a failure raises :class:`padless.IsolationError` saying what to do."""
        import torch

        from padless.attention.adapters import without_ddp

        if self.guard is None:
            return None
        model = without_ddp(model)
        cuda = batch["input_ids"].is_cuda
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            check = self.guard(model, batch, logits)
        except IsolationError as err:
            raise IsolationError(
                f"{self.trainer}: the isolation guard stopped training before this step's update: {err}\n"
                "What to do: load the model with an attention backend that `padless verify` (or "
                "padless.verify_isolation(model)) finds exact for it, on this device and dtype, and report the "
                f"model to padless (its rule accepted this backend); {self.trainer}(guard=False) trains without "
                "the check, and its documents are then not isolated."
            ) from None
        if cuda:
            torch.cuda.synchronize()
        if check is not None:
            self.checks.append((check, time.perf_counter() - start))
        return check

    def remembering(self, collate: Any) -> Any:
        """``collate`` that also remembers the placements of the batches it makes while the guard is due,
        by their token ids: a loader that rebuilds each batch dict on its way to the device (accelerate's,
        behind Trainer's own ``get_train_dataloader``) drops them (:meth:`placements_of` finds them again)."""

        def collate_and_remember(features: Any) -> Any:
            batch = collate(features)
            placements = getattr(batch, "placements", None)
            if placements is not None and self.guard is not None and self.guard.due():
                self._remembered = [*self._remembered[-15:], (_ids_key(batch["input_ids"]), placements)]
            return batch

        return collate_and_remember

    def loader(self, trainer: Any, build: Any) -> Any:
        """``build()`` (Trainer's own ``get_train_dataloader``) with ``trainer.data_collator``
        :meth:`remembering` while it builds the loader (as is, with no guard)."""
        if self.guard is None:
            return build()
        collator = trainer.data_collator
        trainer.data_collator = self.remembering(collator)
        try:
            return build()
        finally:
            trainer.data_collator = collator

    def placements_of(self, inputs: Any) -> Any:
        """``inputs``' placements, or those :meth:`remembering` kept for the same token ids (else None)."""
        placements = getattr(inputs, "placements", None)
        if placements is None and self._remembered and "input_ids" in inputs:
            key = _ids_key(inputs["input_ids"])
            placements = next((p for k, p in reversed(self._remembered) if k == key), None)
        return placements

    def report(self) -> str | None:
        """The line logged after the first step: the first check and its cost against the step (None: no check ran)."""
        if not self.checks:
            return None
        check, seconds = self.checks[0]
        if not check.pieces:
            what = f"nothing to run alone ({check.image_documents} documents hold images)"
        else:
            n = len(check.pieces)
            verdict = "match their packed rows" if check.passed else "DIFFER from their packed rows (on_failure='warn')"
            what = (
                f"{n} document{'s' * (n != 1)} ({check.tokens} tokens) run alone {verdict} (max |diff| "
                f"{check.max_logit_diff:.2g}, padding's noise {check.noise or 0:.2g}, limit {check.tolerance:.2g}, "
                f"{check.dtype})"
            )
        cost = f"the guard took {_duration(seconds)}"
        if self.step_seconds is not None:
            rest = max(self.step_seconds - seconds, 1e-9)
            cost += f", {100 * seconds / rest:.1f}% of the step ({_duration(rest)} without it)"
        return f"padless: isolation guard, step {check.step}: {what}; {cost}"

    def callback(self, trainer: Any) -> TrainerCallback:
        """A Trainer callback that times the first step and logs :meth:`report` after it."""
        return _FirstStepTiming(self, trainer)


def _ids_key(input_ids: Any) -> bytes:
    return repr(tuple(input_ids.shape)).encode() + input_ids.detach().cpu().numpy().tobytes()


def _duration(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


class _FirstStepTiming(TrainerCallback):
    def __init__(self, run: FirstStepGuard, trainer: Any) -> None:
        self.run, self.trainer, self.start = run, trainer, None
        self.reported = False

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.reported or self.start is None:
            return
        self.run.step_seconds = time.perf_counter() - self.start
        self.reported = True
        line = self.run.report()
        if line is not None:
            from padless.integrations.trainer_boundary import announce

            announce(self.trainer, line)


def attach_guard(trainer: Any, guard: Any, name: str) -> FirstStepGuard:
    """The :class:`FirstStepGuard` of ``trainer`` for its ``guard=`` argument, its timing callback added
    (off for a model sharded by FSDP: see the module docstring)."""
    from padless.attention.adapters import base_model_of
    from padless.models.fsdp import is_sharded

    sharded = getattr(trainer, "is_fsdp_enabled", False) or is_sharded(base_model_of(trainer.model))
    run = FirstStepGuard(guard, name, off="FSDP runs every forward on all ranks together" if sharded else None)
    if run.guard is not None:
        trainer.add_callback(run.callback(trainer))
    return run


def keep_placements(inputs: Any, prepared: Any) -> Any:
    """``prepared`` (Trainer's copy of ``inputs`` on the device, rebuilt as ``type(inputs)(...)``) with
    ``inputs``' placements, which the guard reads."""
    placements = getattr(inputs, "placements", None)
    if placements is not None and getattr(prepared, "placements", placements) is None:
        prepared.placements = placements
    return prepared


def guarded_loss(
    run: FirstStepGuard,
    compute: Any,
    model: Any,
    inputs: Any,
    return_outputs: bool,
    num_items_in_batch: Any,
    *,
    has_logits: bool = True,
) -> Any:
    """Trainer's ``compute_loss`` (``compute``), with the guard run on a due training forward, on that
    forward's logits (re-run when dropout is on or the logits are not the whole rows'). ``has_logits=False``:
    the loss builds no logits (TRL's fused LM head; asking for them would re-run the batch and warn), so the
    guard runs windows of its checked documents itself."""
    placements = run.placements_of(inputs) if run.due(model) else None
    if placements is None:
        if run.guard is not None and getattr(model, "training", False):
            run.tick()
        return compute(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
    from padless.batching.batch import PackedBatch

    if not has_logits:
        out = compute(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        run(model, PackedBatch(inputs, placements))
        return out
    loss, outputs = compute(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
    logits = outputs.get("logits") if isinstance(outputs, dict) else getattr(outputs, "logits", None)
    whole = logits is not None and tuple(logits.shape[:2]) == tuple(inputs["input_ids"].shape)
    run(model, PackedBatch(inputs, placements), logits.detach() if whole and run.wants_logits(model) else None)
    return (loss, outputs) if return_outputs else loss
