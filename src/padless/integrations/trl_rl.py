"""TRL's ``GRPOTrainer`` and ``DPOTrainer`` whose log-prob passes run on padless' packed rows.

    from padless.integrations.trl import GRPOTrainer, DPOTrainer   # was: from trl import ...

The same classes, arguments and configs (``GRPOConfig``, ``DPOConfig``; TRL 1.16). What changes is
where the per-token log-probs come from. TRL scores rollouts and preference pairs on padded rows
``[prompt | completion]`` (GRPO left-pads the prompts, DPO right-pads the pairs), through a fused LM
head that divides the logits by the temperature. Here each pass reads the same tensors off packed rows:

* GRPO: every call of ``_get_per_token_logps_and_entropies`` (the policy, the old policy and the
  reference pass; the reference being the adapter disabled under PEFT, as in TRL) rebuilds each row's
  prompt and completion from TRL's masks, groups the rows that share prompt ids (:func:`_rollout_groups`),
  packs the groups with :class:`padless.RolloutCollator` for the model and returns TRL's ``(B, T)``
  log-probs and entropies (:func:`padless.objectives.rollouts.completion_token_stats`). Generation,
  rewards, advantages and the loss stay TRL's. A pass runs in forward chunks of at most TRL's
  ``batch_size`` completions, in TRL's order; ``balance="cost"`` (an argument of the trainer) deals the
  groups to as many chunks by cost ``a * l + l**2`` instead (:func:`_forward_chunks`, docs/balance.md),
  and each chunk's log-probs go back to their TRL rows, so the loss is the same.
* DPO: while TRL's ``compute_loss`` and ``compute_ref_log_probs`` run, the fused forward TRL put on
  the policy (and the reference model) answers ``model(..., labels=..., fused_lm_head=True)`` from
  pairs packed by :class:`padless.PreferenceCollator` (:meth:`PackedDPOTrainer._packed_forward`),
  with every per-token field TRL reads (log-probs, entropy, mean logits, top-1, the WPO term) in
  TRL's shifted ``(2B, L - 1)`` layout, so all of TRL's DPO losses and metrics run on top unchanged.

Layouts. ``share_prompt`` (an argument of both trainers): ``True`` puts each prompt once before its
completions (a tree: a 4D mask on sdpa/eager, tree kwargs on padless attention), ``False`` makes every
completion its own document; ``None`` (default) shares the prompt wherever the exactness rule accepts that
layout for the model's backend, else packs documents and says why in the start line. ``max_length``:
tokens per packed row; ``None`` (default) packs each forward chunk (TRL's ``batch_size`` rollouts, or a
DPO micro-batch) into one row, the cheapest form for padless attention; on sdpa/eager the 4D mask grows
with the row's square, so bound the row there. A group never splits across rows: a group longer than
``max_length`` raises.

Refused (``ValueError`` naming the argument), because packed rows could not compute them exactly yet:
images and other multimodal inputs (``pixel_values``, token type ids), a prompt-learning PEFT adapter,
the MoE load-balancing loss (``output_router_logits``), TRL's context-parallel ``shift_labels``, and DPO
prompts that TRL's ``truncation_mode="keep_end"`` cut differently for chosen and rejected. vLLM
generation and its importance sampling stay TRL's (they compare TRL's old log-probs, computed here).

``train`` first logs one line through the padless logger: the model, its attention backend, the row
layout, the rule's verdict and the layout chosen (:func:`padless.integrations.transformers.start_line`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from padless._optional import require

require("trl", "padless.integrations.trl")

import torch  # noqa: E402
import trl  # noqa: E402

from padless.attention.adapters import base_model_of, without_ddp  # noqa: E402
from padless.integrations.transformers import announce, start_line, trainer_words, training_dtype  # noqa: E402

GRPO_WORDS: dict[str, str] = {
    "max_length": "GRPOTrainer.max_length", "share_prompt": "GRPOTrainer.share_prompt",
    "balance": "GRPOTrainer.balance", "cost_a": "GRPOTrainer.cost_a",
    "backend": "attn_implementation='{backend}' when loading the model, or in GRPOConfig.model_init_kwargs",
}  # fmt: skip
"""Library argument -> where ``GRPOTrainer`` takes it (:func:`padless.integrations.transformers.in_trainer_words`)."""

DPO_WORDS: dict[str, str] = {
    "max_length": "DPOTrainer.max_length", "share_prompt": "DPOTrainer.share_prompt",
    "backend": "attn_implementation='{backend}' when loading the model, or in DPOConfig.model_init_kwargs",
}  # fmt: skip
"""Library argument -> where ``DPOTrainer`` takes it."""


# ------------------------------------------------------------------ TRL's rows -> padless features


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

    def _padless_setup(self, share_prompt: bool | None, max_length: int | None) -> None:
        """Fit the collator to the policy now: a backend the rule refuses fails at construction."""
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
            documents=layout,
        )

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's ``train``, after logging :meth:`start_line` (:func:`padless.integrations.transformers.announce`)."""
        announce(self, self.start_line())
        with trainer_words(self._padless_words):
            return super().train(*args, **kwargs)  # type: ignore[misc]

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


# ------------------------------------------------------------------------------------------ GRPO


class PackedGRPOTrainer(_PackedLogprobs, trl.GRPOTrainer):
    """``trl.GRPOTrainer`` whose log-prob passes run on packed rows (module docstring). Takes
    ``GRPOTrainer``'s arguments plus, keyword-only, ``share_prompt``, ``max_length``, ``balance``
    (``"tokens"``, default: forward chunks in TRL's order; ``"cost"``: groups dealt to the same number of
    chunks so that their costs are even, :func:`_forward_chunks`) and ``cost_a`` (``"cost"`` only;
    default ``12 * hidden_size`` of the policy's config)."""

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
            self._padless_setup(share_prompt, max_length)

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
            for name in outputs:
                pieces[name].append(stats[name])
            order.extend(rows[first[i] : first[i + 1]] for i in chunk)
        index = torch.from_numpy(np.concatenate(order)).to(input_ids.device)
        full = {
            name: torch.cat(p).new_zeros(input_ids.size(0), t).index_copy(0, index, torch.cat(p))
            for name, p in pieces.items()
        }
        return full["log_probs"], full.get("entropy"), None


# ------------------------------------------------------------------------------------------- DPO


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
    docstring). Takes ``DPOTrainer``'s arguments plus, keyword-only, ``share_prompt`` and ``max_length``."""

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
        **trl_kwargs: Any,
    ) -> None:
        from padless.batching.preference import PreferenceCollator

        self._padless_collator_type = PreferenceCollator
        self._padless_active = False
        self._padless_ready = False
        self._padless_pending = (share_prompt, max_length)
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
        stats = completion_token_stats(module, batch, outputs=fields)  # [2N, T]: chosen 2k, rejected 2k + 1
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


GRPOTrainer = PackedGRPOTrainer
"""The drop-in name: ``from padless.integrations.trl import GRPOTrainer``."""

DPOTrainer = PackedDPOTrainer
"""The drop-in name: ``from padless.integrations.trl import DPOTrainer``."""
