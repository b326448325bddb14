"""grpo_loss against TRL 1.16's own ``GRPOTrainer._compute_loss`` (run unbound on a stand-in holding the
attributes it reads): every loss type x importance-sampling level x KL setting, gradient accumulation,
per-token log-probs from packed rows (both layouts) against TRL's padded layout, and bad input. fp32."""

from __future__ import annotations

import contextlib
import inspect
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import padless
from padless.batching.preference import RolloutCollator
from padless.models.factory import build_model
from padless.objectives.grpo import LOSS_TYPES, GRPOLossConfig, grpo_loss
from padless.objectives.logprobs import sequence_logprobs

LENGTHS = (9, 5, 0, 7, 1, 8)
"""Completion lengths of the rollouts of one micro-batch (``T = 9``); rollout 2 has no trained token."""
MAX_COMPLETION_LENGTH = 12
TRL_WARNS = {
    ("luspo", "token"),
    ("vespo", "sequence"),
    *((t, "sequence") for t in ("bnpo", "dr_grpo", "dapo", "cispo")),
}
"""The (loss_type, importance_sampling_level) pairs GRPOTrainer.__init__ warns about (it trains anyway)."""


@pytest.fixture(scope="module")
def trainer_cls():
    pytest.importorskip("trl")
    from trl.trainer.grpo_trainer import GRPOTrainer

    return GRPOTrainer


def _rollouts(seed, lengths=LENGTHS, T=None, token_advantages=False):
    """Random rollouts in TRL's layout: ragged completions, a tool span masked out, old log-probs far
    enough from the current ones (per token and per rollout) that the clip bites on both sides at both
    importance-sampling levels, advantages of both signs. Values past each
    completion's end are random too (TRL reads them; its mask removes them)."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), T or max(lengths)
    completion_mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).int()  # [B, T]
    tool_mask = torch.ones(B, T, dtype=torch.int64)
    tool_mask[0, 2:4] = 0  # a tool's output inside rollout 0's completion: not trained
    tool_mask[3, 5] = 0
    logps = -3.0 * torch.rand(B, T, generator=g) - 1.0
    drift = torch.zeros(B, 1)
    drift[0], drift[1] = -0.8, 0.8  # rollout 0 (A > 0) gained probability since sampling, rollout 1 (A < 0) lost
    old = (logps + drift + 0.6 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    ref = (logps + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    adv = torch.randn((B, T) if token_advantages else (B,), generator=g)
    adv[0], adv[1] = adv[0].abs() + 0.1, -adv[1].abs() - 0.1
    return SimpleNamespace(logps=logps, old=old, ref=ref, adv=adv, completion_mask=completion_mask, tool_mask=tool_mask)


def _trl_args(loss_type, level="token", beta=0.0, bias=False, epsilon_high=None, delta=None, **extra):
    """The GRPOConfig fields _compute_loss and GRPOTrainer.__init__ read, at TRL's defaults otherwise."""
    if epsilon_high is None:
        epsilon_high = 2.0 if loss_type == "cispo" else 0.28  # cispo: an absolute cap on the ratio (biting here)
    fields = dict(
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=beta,
        epsilon=0.2,
        epsilon_high=epsilon_high,
        delta=delta,
        use_bias_correction_kl=bias,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        vespo_k_pos=2.0,
        vespo_lambda_pos=3.0,
        vespo_k_neg=3.0,
        vespo_lambda_neg=2.0,
        max_completion_length=MAX_COMPLETION_LENGTH,
        steps_per_generation=1,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        entropy_coef=0.0,
        use_adaptive_entropy=False,
    )
    return SimpleNamespace(**{**fields, **extra})


def _stand_in(trainer_cls, args, logps, *, grad_accum=1, num_processes=1):
    """An object with what ``GRPOTrainer._compute_loss`` reads, set from ``args`` as
    ``GRPOTrainer.__init__`` sets it; its forward returns ``logps`` (our leaf) and zero entropies."""

    class StandIn:
        get_gamma_weights = staticmethod(trainer_cls.get_gamma_weights)
        get_off_policy_mask = staticmethod(trainer_cls.get_off_policy_mask)

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
            assert logits_to_keep == logps.shape[1]
            return logps, torch.zeros_like(logps), None

    s = StandIn()
    s.args, s.loss_type, s.beta, s.importance_sampling_level = (
        args,
        args.loss_type,
        args.beta,
        args.importance_sampling_level,
    )
    s.epsilon_low = args.epsilon
    s.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    s.max_completion_length = args.max_completion_length
    s.use_vllm, s.vllm_importance_sampling_correction = args.use_vllm, args.vllm_importance_sampling_correction
    s.top_entropy_quantile, s.off_policy_mask_threshold = args.top_entropy_quantile, args.off_policy_mask_threshold
    s._entropy_bonus_enabled = args.entropy_coef != 0.0 or args.use_adaptive_entropy
    s.aux_loss_enabled = False
    s.current_gradient_accumulation_steps = grad_accum
    s.accelerator = SimpleNamespace(
        num_processes=num_processes, gather=lambda t: t.reshape(-1), reduce=lambda t, reduction="sum": t
    )  # one process: its own values  #
    s.model = SimpleNamespace(training=True)
    s._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return s


def _trl_inputs(r, rows=slice(None), num_items=None):
    B, T = r.completion_mask[rows].shape
    mask = r.completion_mask * r.tool_mask
    return {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": r.completion_mask[rows],
        "tool_mask": r.tool_mask[rows],
        "advantages": r.adv[rows],
        "old_per_token_logps": r.old[rows],
        "ref_per_token_logps": r.ref[rows],
        "num_items_in_batch": mask.sum() if num_items is None else num_items,
    }


def _trl_loss(trainer_cls, args, r, rows=slice(None), **kw):
    """TRL's loss of ``r[rows]``, its gradient w.r.t. the log-probs of all of ``r``, and its metrics."""
    leaf = r.logps.clone().requires_grad_()
    s = _stand_in(trainer_cls, args, leaf[rows], **{k: v for k, v in kw.items() if k != "num_items"})
    loss = trainer_cls._compute_loss(s, None, _trl_inputs(r, rows, kw.get("num_items")))
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad, s._metrics["train"]


def _ours(r, rows=slice(None), **kw):
    leaf = r.logps.clone().requires_grad_()
    out = grpo_loss(
        leaf[rows],
        r.adv[rows],
        r.completion_mask[rows],
        old_per_token_logps=r.old[rows],
        ref_per_token_logps=r.ref[rows],
        tool_mask=r.tool_mask[rows],
        **kw,
    )
    (grad,) = torch.autograd.grad(out.loss, leaf)
    return out, grad


def _settings(args):
    """grpo_loss's keywords for the settings in ``args``, spelled out."""
    names = [
        f for f in GRPOLossConfig.__dataclass_fields__ if f not in ("num_processes", "gradient_accumulation_steps")
    ]
    return {f: getattr(args, f) for f in names if hasattr(args, f)}


def _close(got, want, what):
    scale = max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * scale, msg=what)


def _warns(loss_type, level):
    return pytest.warns(UserWarning, match=loss_type) if (loss_type, level) in TRL_WARNS else contextlib.nullcontext()


def test_every_loss_type_has_its_objective_and_reduction():
    from padless.objectives import grpo

    assert tuple(grpo._LOSSES) == LOSS_TYPES  # the settings' LossType and the loss table name the same types
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        GRPOLossConfig(loss_type="ppo")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- one micro-batch

KL = {"no-kl": (0.0, False), "kl": (0.04, False), "kl-bias-corrected": (0.04, True)}


@pytest.mark.parametrize("kl", KL)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_gradient_and_diagnostics_equal_trls(trainer_cls, loss_type, level, kl):
    beta, bias = KL[kl]
    args = _trl_args(loss_type, level, beta, bias)
    r = _rollouts(0)
    want_loss, want_grad, metrics = _trl_loss(trainer_cls, args, r)
    with _warns(loss_type, level):
        got, grad = _ours(r, **_settings(args))
    _close(got.loss, want_loss, "loss")
    _close(grad, want_grad, "gradient")
    assert grad.abs().max() > 0 and torch.isfinite(grad).all()
    assert grad[2].abs().max() == 0 and got.empty_rollouts == 1  # rollout 2 has no trained token
    assert got.trained_tokens == int((r.completion_mask * r.tool_mask).sum())
    if beta:
        assert got.kl is not None and got.kl.item() == pytest.approx(metrics["kl"][0], rel=1e-5)
    else:
        assert got.kl is None
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        for ours, theirs in (("low", "low_mean"), ("high", "high_mean"), ("region", "region_mean")):
            assert getattr(got, f"clip_ratio_{ours}").item() == pytest.approx(
                metrics[f"clip_ratio/{theirs}"][0], rel=1e-6
            )
        if loss_type == "grpo":  # the clip really bites on these rollouts, on both sides
            assert got.clip_ratio_low > 0 and got.clip_ratio_high > 0
    elif loss_type == "cispo":
        assert got.clip_ratio_high.item() == pytest.approx(metrics["cispo_clip_ratio"][0], rel=1e-6)
        assert got.clip_ratio_low is None and got.clip_ratio_region is None
        if level == "token":
            assert got.clip_ratio_high > 0  # some ratios exceed the cap of 2
    elif loss_type == "vespo":
        assert got.phi_mean.item() == pytest.approx(metrics["vespo/phi_seq_mean"][0], rel=1e-5)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "luspo"])
def test_two_sided_clip_delta_equals_trls_and_changes_the_loss(trainer_cls, loss_type):
    level = "sequence" if loss_type == "luspo" else "token"
    args = _trl_args(loss_type, level, delta=1.3)
    r = _rollouts(4)
    want_loss, want_grad, _ = _trl_loss(trainer_cls, args, r)
    got, grad = _ours(r, **_settings(args))
    _close(got.loss, want_loss, "loss")
    _close(grad, want_grad, "gradient")
    plain, _ = _ours(r, **{**_settings(args), "delta": None})
    assert abs(plain.loss.item() - got.loss.item()) > 1e-3  # ratios above 1.3 with A < 0 were capped


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo", "sapo", "vespo"])
def test_per_token_advantages_and_on_policy_equal_trls(trainer_cls, loss_type):
    """Advantages ``[B, T]`` (TRL keeps them as given), and no old log-probs (on-policy: TRL uses the
    detached current ones, so every ratio is 1)."""
    args = _trl_args(loss_type)
    r = _rollouts(5, token_advantages=True)
    want_loss, want_grad, _ = _trl_loss(trainer_cls, args, r)
    got, grad = _ours(r, **_settings(args))
    _close(got.loss, want_loss, "loss")
    _close(grad, want_grad, "gradient")

    leaf = r.logps.clone().requires_grad_()
    s = _stand_in(trainer_cls, args, leaf)
    inputs = {k: v for k, v in _trl_inputs(r).items() if k != "old_per_token_logps"}
    (want,) = torch.autograd.grad(trainer_cls._compute_loss(s, None, inputs), leaf)
    leaf2 = r.logps.clone().requires_grad_()
    out = grpo_loss(leaf2, r.adv, r.completion_mask, tool_mask=r.tool_mask, **_settings(args))
    (got_grad,) = torch.autograd.grad(out.loss, leaf2)
    _close(got_grad, want, "on-policy gradient")
    if loss_type in ("grpo", "dapo"):
        assert out.clip_ratio_region == 0


def test_config_reads_a_trl_grpo_config_and_explicit_keywords_win(trainer_cls, tmp_path):
    import warnings

    from trl import GRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' own deprecations inside TrainingArguments
        args = GRPOConfig(
            output_dir=str(tmp_path),
            loss_type="grpo",
            beta=0.04,
            epsilon_high=0.28,
            delta=1.5,
            max_completion_length=MAX_COMPLETION_LENGTH,
            per_device_train_batch_size=6,
            num_generations=3,
            report_to="none",
            use_cpu=True,
        )
    assert args.use_bias_correction_kl is True  # TRL's default, which grpo_loss's own keyword does not share
    r = _rollouts(6)
    want_loss, want_grad, _ = _trl_loss(trainer_cls, args, r)  # the stand-in reads the real GRPOConfig
    got, grad = _ours(r, config=args)
    _close(got.loss, want_loss, "loss")
    _close(grad, want_grad, "gradient")
    spelled, _ = _ours(r, loss_type="grpo", beta=0.04, epsilon_high=0.28, delta=1.5, use_bias_correction_kl=True)
    _close(spelled.loss, got.loss, "config vs keywords")
    dapo_args = _trl_args("dapo", beta=0.04, bias=True, epsilon_high=0.28, delta=1.5)
    want_dapo, _, _ = _trl_loss(trainer_cls, dapo_args, r)
    overridden, _ = _ours(r, config=args, loss_type="dapo")
    _close(overridden.loss, want_dapo, "loss_type given over config")
    assert abs(overridden.loss.item() - got.loss.item()) > 1e-4
    no_kl, _ = _ours(r, config=args, beta=0.0)
    assert no_kl.kl is None and got.kl is not None
    packed_cfg = GRPOLossConfig.from_trl(args, num_processes=1)
    assert (packed_cfg.loss_type, packed_cfg.epsilon_upper, packed_cfg.max_completion_length) == ("grpo", 0.28, 12)
    _close(_ours(r, config=packed_cfg)[0].loss, got.loss, "GRPOLossConfig as config")


# ----------------------------------------------------------------------------- accumulation


@pytest.mark.parametrize(("grad_accum", "steps_per_generation"), [(2, 2), (3, 3), (2, 4)])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_accumulated_micro_batches_equal_trls(trainer_cls, loss_type, grad_accum, steps_per_generation):
    """A generation batch of 12 rollouts split into ``steps_per_generation`` micro-batches, ``grad_accum``
    of them per optimiser step (``(2, 4)``: one generation serves 2 steps); ``num_items_in_batch`` counts
    the whole generation batch, as ``_generate_and_score_completions`` does."""
    level = "sequence" if loss_type == "luspo" else "token"
    args = _trl_args(loss_type, level, beta=0.04, steps_per_generation=steps_per_generation)
    r = _rollouts(7, lengths=(8, 3, 6, 0, 5, 8, 2, 7, 4, 1, 8, 6))
    num_items = (r.completion_mask * r.tool_mask).sum()
    size = 12 // steps_per_generation
    parts = [slice(i * size, (i + 1) * size) for i in range(steps_per_generation)]
    want = [_trl_loss(trainer_cls, args, r, p, grad_accum=grad_accum, num_items=num_items) for p in parts]
    got = [
        _ours(r, p, **_settings(args), num_items_in_batch=num_items, gradient_accumulation_steps=grad_accum)
        for p in parts
    ]
    _close(sum(g.loss for g, _ in got), sum(w[0] for w in want), "summed loss")
    _close(sum(g for _, g in got), sum(w[1] for w in want), "summed gradient")
    if loss_type == "dapo" and grad_accum == steps_per_generation:  # token-normalised: the split changes nothing
        whole, whole_grad = _ours(r, **{**_settings(args), "steps_per_generation": 1}, num_items_in_batch=num_items)
        _close(sum(g.loss for g, _ in got), whole.loss, "dapo: accumulated vs one batch")
        _close(sum(g for _, g in got), whole_grad, "dapo: accumulated vs one batch gradient")


# ----------------------------------------------------------------------------- packed rows

GROUPS_SEED, VOCAB = 11, 512


def _groups():
    """3 prompts x 4 rollouts of different lengths (1 to 9 tokens)."""
    g = torch.Generator().manual_seed(GROUPS_SEED)
    lengths = [(3, 9, 1, 6), (7, 2, 5, 4), (8, 1, 3, 9)]
    return [
        {
            "prompt_ids": torch.randint(1, VOCAB, (p,), generator=g).tolist(),
            "completion_ids": [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in ls],
        }
        for p, ls in zip((5, 3, 7), lengths)
    ]


def _pad_rows(tokens, T):
    """Per-token log-prob lists -> ``[B, T]`` (right-padded with 0) and the completion mask."""
    out = torch.stack([torch.nn.functional.pad(t, (0, T - t.numel())) for t in tokens])
    mask = torch.stack([torch.arange(T) < t.numel() for t in tokens]).int()
    return out, mask


def _trl_padded_logps(model, groups, pad_id=0):
    """TRL's layout: left-padded prompts, right-padded completions, one attention mask, the completion's
    log-probs from ``log_softmax`` over the logits that predict them."""
    rows = [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]
    P, T = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    ids = torch.tensor([[pad_id] * (P - len(p)) + p + c + [pad_id] * (T - len(c)) for p, c in rows])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)) for p, c in rows])
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, P - 1 : P - 1 + T]
    logps = logits.float().log_softmax(-1).gather(-1, ids[:, P:, None]).squeeze(-1)  # [B, T]
    return logps, mask[:, P:]


@pytest.mark.parametrize(("share_prompt", "backend"), [(False, "sdpa"), (True, "sdpa"), (True, "padless")])
def test_packed_rollouts_train_like_trls_padded_batch(share_prompt, backend):
    """Rollouts packed by RolloutCollator.for_model on the model's own backend, their per-token log-probs
    padded to ``[B, T]``, against TRL's padded batch through the same weights on sdpa."""
    if backend == "padless":
        padless.register_padless_attention()
    model = build_model("tiny-llama", attn_implementation=backend, seed=0).eval()
    padded_model = model if backend == "sdpa" else build_model("tiny-llama", attn_implementation="sdpa", seed=0).eval()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    padded_params = [dict(padded_model.named_parameters())[n] for n in names]
    assert all(torch.equal(a, b) for a, b in zip(params, padded_params))
    groups = _groups()
    padded, completion_mask = _trl_padded_logps(padded_model, groups)
    B, T = padded.shape
    g = torch.Generator().manual_seed(1)
    old = (padded.detach() + 0.5 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    ref = (padded.detach() + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g)

    batch = RolloutCollator.for_model(model, max_length=64, share_prompt=share_prompt)(groups)
    assert batch["input_ids"].shape[0] < B  # the 12 rollouts share rows
    _, tokens = sequence_logprobs(model, batch, per_token=True)
    packed, packed_mask = _pad_rows(tokens, T)
    assert torch.equal(packed_mask, completion_mask)
    trained = completion_mask.bool()
    _close(packed.detach()[trained], padded.detach()[trained], "per-token log-probs")
    for loss_type in ("grpo", "dapo"):
        kw = dict(
            old_per_token_logps=old,
            ref_per_token_logps=ref,
            loss_type=loss_type,
            beta=0.04,
            epsilon_high=0.28,
            use_bias_correction_kl=True,
        )
        want = grpo_loss(padded, adv, completion_mask, **kw)
        got = grpo_loss(packed, adv, packed_mask, **kw)
        assert want.clip_ratio_region > 0
        _close(got.loss, want.loss, f"{loss_type} loss")
        want_grads = torch.autograd.grad(want.loss, padded_params, retain_graph=True)
        got_grads = torch.autograd.grad(got.loss, params, retain_graph=True)
        for name, a, b in zip(names, got_grads, want_grads):
            _close(a, b, f"{loss_type} gradient of {name}")
        assert max(a.abs().max().item() for a in got_grads) > 0


# ----------------------------------------------------------------------------- properties, bad input


def test_untrained_positions_are_never_read():
    """NaN and -inf past each completion's end and under the tool mask change nothing."""
    r = _rollouts(8)
    dirty = SimpleNamespace(**vars(r))
    untrained = (r.completion_mask * r.tool_mask) == 0
    for name in ("logps", "old", "ref"):
        setattr(dirty, name, getattr(r, name).masked_fill(untrained, float("nan")))
    dirty.logps = dirty.logps.masked_fill(untrained & (torch.arange(9) % 2 == 0), float("-inf"))
    for loss_type in LOSS_TYPES:
        level = "sequence" if loss_type == "luspo" else "token"
        kw = dict(loss_type=loss_type, importance_sampling_level=level, beta=0.04, max_completion_length=12)
        clean, clean_grad = _ours(r, **kw)
        got, grad = _ours(dirty, **kw)
        assert torch.isfinite(got.loss) and torch.isfinite(grad).all(), loss_type
        _close(got.loss, clean.loss, loss_type)
        _close(grad, clean_grad, loss_type)


def test_low_precision_inputs_are_computed_in_float32():
    r = _rollouts(9)
    low = r.logps.to(torch.bfloat16)
    out = grpo_loss(low, r.adv, r.completion_mask, old_per_token_logps=r.old.to(torch.bfloat16))
    want = grpo_loss(low.float(), r.adv, r.completion_mask, old_per_token_logps=r.old.to(torch.bfloat16).float())
    assert out.loss.dtype == torch.float32
    _close(out.loss, want.loss, "bf16 inputs vs their float32 values")


def test_every_rollout_empty_gives_zero_not_nan():
    for loss_type in LOSS_TYPES:
        logps = torch.randn(3, 4, requires_grad=True)
        out = grpo_loss(
            logps,
            torch.randn(3),
            torch.zeros(3, 4),
            loss_type=loss_type,
            max_completion_length=4,
            importance_sampling_level="sequence" if loss_type == "luspo" else "token",
        )
        assert out.loss.item() == 0.0 and out.empty_rollouts == 3, loss_type
        (grad,) = torch.autograd.grad(out.loss, logps, allow_unused=True)
        assert grad is None or (grad == 0).all()


def test_public_names():
    assert padless.grpo_loss is grpo_loss
    defaults = {n: p.default for n, p in inspect.signature(grpo_loss).parameters.items()}
    assert (repr(defaults["loss_type"]), repr(defaults["epsilon"])) == ("'dapo'", "0.2")  # help() shows TRL's defaults


def _bad(**kw):
    r = _rollouts(10)
    base = dict(per_token_logps=r.logps, advantages=r.adv, completion_mask=r.completion_mask)
    args = {**base, **kw}
    return grpo_loss(args.pop("per_token_logps"), args.pop("advantages"), args.pop("completion_mask"), **args)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"advantages": torch.zeros(5)}, r"advantages has shape \(5,\) but per_token_logps has \(6, 9\): expected \(6,\)"),
        ({"advantages": torch.zeros(6, 8)}, r"advantages has shape \(6, 8\).*or \(6, 9\) \(one per token\)"),
        ({"completion_mask": torch.ones(6, 8)}, r"completion_mask has shape \(6, 8\) but per_token_logps has \(6, 9\)"),
        ({"tool_mask": torch.ones(9, 6)}, r"tool_mask has shape \(9, 6\) but per_token_logps has \(6, 9\)"),
        ({"old_per_token_logps": torch.zeros(6, 7)},
         r"old_per_token_logps has shape \(6, 7\) but per_token_logps has \(6, 9\): log-probs from another batch\?"),
        ({"ref_per_token_logps": torch.zeros(4, 9), "beta": 0.1},
         r"ref_per_token_logps has shape \(4, 9\) but per_token_logps has \(6, 9\): log-probs from another batch\?"),
        ({"per_token_logps": torch.zeros(6)}, r"per_token_logps must be a float \[B, T\] tensor"),
        ({"loss_type": "ppo"}, r"unknown loss_type 'ppo'; choose one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo"),
        ({"importance_sampling_level": "batch"}, r"unknown importance_sampling_level 'batch'; choose token or sequence"),
        ({"beta": 0.04}, r"beta=0.04 needs ref_per_token_logps .* or set beta=0.0"),
        ({"loss_type": "dr_grpo"}, r"loss_type='dr_grpo' divides by B \* max_completion_length; pass max_completion_length="),
        ({"gradient_accumulation_steps": 2}, r"loss_type='dapo' divides by num_items_in_batch.*pass it"),
        ({"num_processes": 0}, r"num_processes must be a positive int, got 0"),
        ({"loss_type": "sapo", "sapo_temperature_neg": 0.0}, r"sapo temperatures must be > 0"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        _bad(**kw)


@pytest.mark.parametrize(("field", "value"), [("top_entropy_quantile", 0.8), ("entropy_coef", 0.01),
                                              ("off_policy_mask_threshold", 0.5)])  # fmt: skip
def test_a_trl_config_with_a_term_grpo_loss_does_not_compute_is_refused(field, value):
    args = _trl_args("dapo", **{})
    setattr(args, field, value)
    with pytest.raises(ValueError, match=rf"config.{field}={value}: grpo_loss does not compute TRL's"):
        _bad(config=args)
    vllm = _trl_args("dapo")
    vllm.use_vllm, vllm.vllm_importance_sampling_correction = True, True
    with pytest.raises(ValueError, match="vllm_importance_sampling_correction=True"):
        _bad(config=vllm)
    vllm.vllm_importance_sampling_correction = False
    _bad(config=vllm)  # vLLM generation without the correction: the same loss
