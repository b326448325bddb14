"""The exactness sweep over transformers' causal-LM mapping: tiny configs, one check per (architecture,
collator, backend), and the table for docs/integrations/exactness.md.

A configuration is one of:

- ``exact``: the batch was accepted (``for_model`` built it; a model-free collator was fitted by
  :func:`padless.check_collator` and its batch passed :func:`padless.check_batch`) and every
  document's packed logits equal the document alone (fp32, ``1e-5 + 1e-5 * max|logit|``);
- ``refused``: padless refused with a reason (``for_model`` / ``check_collator`` / ``check_batch``
  raised ``ValueError``);
- ``contaminated``: accepted, and some document's logits differ from the document alone. The sweep
  asserts there are none;
- ``crashed``: accepted, and the forward raised (loud, not silently wrong; the sweep asserts there
  are none either: a path padless cannot run is refused up front);
- ``unsupported``: transformers has no such attention implementation for the model.

Windows and chunks are set to :data:`WINDOW` tokens, shorter than most documents (:data:`LENGTHS`),
so a mask that lost a window shows as a difference. Each document alone runs with its position ids
stated (:func:`padless.attention.backend.packed_documents`): padless attention never guesses that an unmarked row is
one document.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections import Counter
from typing import Any

import numpy as np

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WINDOW, ROW = 256, 64, 4, 2, 16, 8, 32
LENGTHS = (20, 3, 13, 1, 17, 9, 6)
BACKENDS = ("sdpa", "eager", "padless")
COLLATORS = ("for_model", "plain", "plain_position_ids")
"""``for_model``; the model-free ``PackingCollator(max_length=...)`` (a 4D block mask); the model-free
collator with ``attention="position_ids"`` (restarted position ids alone). A model-free collator
collates only once :func:`padless.check_collator` fitted it to the model; its batches count as accepted
only when :func:`padless.check_batch` accepts them too."""
MAX_PARAMS = 3_000_000
"""A config left bigger than this after shrinking is reported as not built (the sweep stays fast)."""

SIZES: dict[str, Any] = {
    # vocabulary and widths
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "d_model": HIDDEN, "n_embd": HIDDEN, "n_embed": HIDDEN,
    "embed_dim": HIDDEN, "dim": HIDDEN, "word_embed_proj_dim": HIDDEN,
    "intermediate_size": 2 * HIDDEN, "ffn_dim": 2 * HIDDEN, "n_inner": 2 * HIDDEN, "d_ff": 2 * HIDDEN,
    "decoder_ffn_dim": 2 * HIDDEN, "encoder_ffn_dim": 2 * HIDDEN, "ffn_hidden_size": 2 * HIDDEN,
    "moe_intermediate_size": HIDDEN, "shared_expert_intermediate_size": HIDDEN, "expert_intermediate_size": HIDDEN,
    "mlp_hidden_size": 2 * HIDDEN,
    # depth
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
    "encoder_layers": 2,
    # heads
    "num_attention_heads": HEADS, "n_head": HEADS, "n_heads": HEADS, "decoder_attention_heads": HEADS,
    "encoder_attention_heads": HEADS, "num_heads": HEADS, "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM, "kv_channels": HEAD_DIM, "attention_head_size": HEAD_DIM,
    # latent attention (DeepSeek family)
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": HEAD_DIM,
    "qk_head_dim": 16, "index_head_dim": 16, "index_n_heads": 2,
    # experts
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "moe_topk": 2, "top_k": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0,
    # positions, windows, chunks
    "max_position_embeddings": 256, "n_positions": 256, "n_ctx": 256, "max_seq_len": 256,
    "attention_chunk_size": WINDOW,
    # state-space / linear attention widths
    "state_size": 16, "mamba_d_state": 16, "ssm_state_size": 16, "time_step_rank": 8, "mamba_n_groups": 1,
    "n_groups": 1, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "mamba_d_head": 32, "mamba_n_heads": 4, "mamba_head_dim": 32,
    "mamba_num_heads": 4, "lru_width": HIDDEN, "block_width": HIDDEN,
    # per-layer embeddings (Gemma 3n / 4), wide feed-forwards, big experts
    "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 8, "dim_ff": 2 * HIDDEN,
    "moe_hidden_size": HIDDEN,
}  # fmt: skip
"""Attribute -> tiny value, applied where a config has the attribute (its own default otherwise)."""

PATTERN_LAYERS = 4
"""Layers of a model with a layer pattern: enough for each of its layer kinds."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One (architecture, collator, backend)."""

    model_type: str
    collator: str
    backend: str
    status: str
    """exact | refused | contaminated | crashed | unsupported"""
    detail: str = ""
    max_diff: float | None = None
    raw: str | None = None
    """Model-free collators: what the same batch fed raw (``model_free=True``, no check) gives, judged the
    same way (``exact`` / ``contaminated`` / ``crashed``): the cases the refusal keeps out."""


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _pattern(values: list, n: int) -> list:
    """``n`` entries of a layer pattern that keep each distinct kind: the kinds in first-seen order,
    then the pattern again."""
    kinds = list(dict.fromkeys(values))
    out = (kinds + list(values))[: max(n, len(kinds))]
    return out


DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
TOKEN_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
              "cls_token_id", "mask_token_id", "image_token_id", "image_token_index", "video_token_id",
              "audio_token_id", "boi_token_id", "eoi_token_id", "boa_token_id", "eoa_token_id")  # fmt: skip
DROPOUTS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "dropout", "hidden_dropout", "activation_dropout")  # fmt: skip


def _overrides(config: Any, depth: int = 0) -> dict[str, Any]:
    """Constructor arguments that make ``config`` tiny, keeping its layer pattern (set through the
    constructor, so derived attributes such as ``head_dim`` or ``layer_types`` follow)."""
    own = {k: v for k, v in vars(config).items() if not k.startswith("_")}
    kw: dict[str, Any] = {}
    for key, value in SIZES.items():
        current = own.get(key, "absent")
        if current == "absent" or isinstance(current, bool) or (current is not None and not isinstance(current, int)):
            continue
        if current is None and key not in ("num_key_value_heads", "head_dim"):
            continue
        kw[key] = value
    if own.get("sliding_window") is not None:
        kw["sliding_window"] = WINDOW
    if isinstance(own.get("qk_rope_head_dim"), int) and "head_dim" in kw:  # latent attention: rope dims
        kw["head_dim"] = SIZES["qk_rope_head_dim"]
    if isinstance(own.get("kv_lora_rank"), int) and "num_key_value_heads" in kw:
        kw["num_key_value_heads"] = (
            HEADS  # latent attention expands keys to every head (real configs: kv heads == heads)
        )
    if isinstance(own.get("rotary_dim"), int):
        kw["rotary_dim"] = 8
    layers_key = next((k for k in DEPTH_KEYS if isinstance(own.get(k), int)), None)
    for key in ("layer_types", "layers_block_type", "block_types", "attn_type_list", "layer_type"):
        pattern = own.get(key)
        if isinstance(pattern, list | tuple) and pattern and layers_key:
            new = _pattern(list(pattern), PATTERN_LAYERS if len(set(map(str, pattern))) > 1 else 2)
            kw[key], kw[layers_key] = new, len(new)
    for key in ("hybrid_override_pattern", "layers_pattern", "block_pattern"):
        pattern = own.get(key)
        if isinstance(pattern, str) and pattern and layers_key:
            new = "".join(_pattern(list(pattern), PATTERN_LAYERS))
            kw[key], kw[layers_key] = new, len(new)
    patterned = any(k in kw for k in ("layer_types", "layers_block_type", "block_types", "attn_type_list"))
    for key in ("full_attn_idxs", "attn_layer_indices", "attention_layers"):
        idx = own.get(key)
        if isinstance(idx, list) and idx and all(isinstance(i, int) for i in idx) and layers_key and not patterned:
            kw[layers_key] = PATTERN_LAYERS
            kw[key] = [i for i in idx if i < PATTERN_LAYERS] or [PATTERN_LAYERS - 1]
    if "attn_layer_period" in own and layers_key:  # Jamba: one attention layer of each period
        kw.update(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1)
        kw[layers_key] = PATTERN_LAYERS
    if "attention_types" in own:  # GPT-Neo: [[kinds, repeats]] expands to one kind per layer
        kw["attention_types"] = [[["global", "local"], 1]]
    if isinstance(own.get("expand"), int) and "num_heads" in kw and "head_dim" in kw:  # Mamba2 heads tile the width
        kw["num_heads"] = HIDDEN * own["expand"] // kw["head_dim"]
    if "mamba_n_heads" in kw and "mamba_d_head" in kw:  # Falcon-H1: heads tile the Mamba width
        if own.get("mamba_d_ssm") is not None:
            kw["mamba_d_ssm"] = 2 * HIDDEN
        width = kw.get("mamba_d_ssm") or int(own.get("mamba_expand", 2) or 2) * HIDDEN
        kw["mamba_d_head"] = width // kw["mamba_n_heads"]
    for key in DROPOUTS:
        if isinstance(own.get(key), float):
            kw[key] = 0.0
    if "use_cache" in own:
        kw["use_cache"] = False
    if own.get("is_decoder") is False and depth == 0:  # BERT family: causal only as a decoder
        kw["is_decoder"] = True
    for key in TOKEN_KEYS:
        value = own.get(key)
        if isinstance(value, int) and value >= VOCAB - 16:
            kw[key] = VOCAB - 16 + TOKEN_KEYS.index(key)  # distinct ids inside the tiny vocabulary
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            kw[key] = [v if v < VOCAB - 16 else VOCAB - 16 + TOKEN_KEYS.index(key) for v in value]
    if depth < 2:
        for key, value in own.items():
            if _is_config(value):
                kw[key] = type(value)(**_overrides(value, depth + 1))
    return kw


def tiny_config(model_type: str) -> Any:
    """A tiny config of ``model_type`` (see :data:`SIZES`), built through its constructor."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    return AutoConfig.for_model(model_type, **_overrides(default))


def build(model_type: str) -> Any:
    """A tiny randomly initialised causal LM of ``model_type`` (seed 0, eval mode, fp32), or raise."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    with torch.device("meta"):
        probe = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in probe.parameters())
    if params > MAX_PARAMS:
        raise ValueError(f"{params:,} parameters after shrinking (over {MAX_PARAMS:,})")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return model


def alone_error(model: Any) -> str | None:
    """Why the tiny model cannot run one document alone (a config problem, not a packing one), or None."""
    try:
        _alone(model, list(range(3, 3 + LENGTHS[0])))
    except Exception as error:  # noqa: BLE001
        return f"does not run one document alone: {_first_line(error)}"
    return None


def features(vocab: int) -> list[dict[str, list[int]]]:
    rng = np.random.default_rng(0)
    return [{"input_ids": rng.integers(3, vocab, n).tolist()} for n in LENGTHS]


def _alone(model: Any, ids: list[int]) -> Any:
    import torch

    from padless.attention.backend import packed_documents

    # padless attention never guesses that an unmarked row is one document: say so (kwargs that reach it win)
    with torch.no_grad(), packed_documents(position_ids=torch.arange(len(ids))[None]):
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def _contamination(model: Any, feats: list[dict], batch: Any) -> tuple[float, float]:
    """Largest |packed - alone| over every document and the tolerance it is judged against."""
    import torch

    from padless.batching.batch import forward_inputs

    with torch.no_grad():
        logits = model(**forward_inputs(batch)).logits.float()
    pl, worst, scale = batch.placements, 0.0, 0.0
    for j in range(pl.feature.size):
        r, o, n = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j])
        alone = _alone(model, feats[int(pl.feature[j])]["input_ids"])
        worst = max(worst, (logits[r, o : o + n] - alone).abs().max().item())
        scale = max(scale, alone.abs().max().item())
    return worst, 1e-5 + 1e-5 * scale


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".splitlines()[0]
    return text[:300]


def check(model: Any, model_type: str, collator: str, backend: str) -> Outcome:
    """One configuration (see the module docstring)."""
    import padless
    from padless.batching.collate import FeatureSpec, PackingCollator

    try:
        model.set_attn_implementation(backend)
    except Exception as error:  # noqa: BLE001 (transformers' own refusal)
        return Outcome(model_type, collator, backend, "unsupported", _first_line(error))
    if model.config._attn_implementation != backend:  # transformers logs and keeps the old one
        return Outcome(model_type, collator, backend, "unsupported", "the model cannot switch attention implementation")
    vocab = int(getattr(model.config.get_text_config(), "vocab_size", VOCAB) or VOCAB)
    feats = features(min(vocab, VOCAB))
    plain = None
    try:
        if collator == "for_model":
            batch = PackingCollator.for_model(model, max_length=ROW)(feats)
        else:
            plain = PackingCollator(
                max_length=ROW,
                attention="position_ids" if collator == "plain_position_ids" else "mask4d",
                features=FeatureSpec(),
            )
            # what a user of a model-free collator does: fit it to the model; padless' consumers check each batch
            batch = padless.check_collator(model, plain)(feats)
            padless.check_batch(model, batch)
    except ValueError as error:
        # what the refusal prevents: the same batch fed raw (model_free=True, no check)
        raw = None if plain is None else _judge(model, feats, dataclasses.replace(plain, model_free=True)(feats))[0]
        return Outcome(model_type, collator, backend, "refused", str(error), raw=raw)
    status, detail, diff = _judge(model, feats, batch)
    # an accepted model-free batch is the raw batch itself: judged once
    return Outcome(model_type, collator, backend, status, detail, diff, raw=None if plain is None else status)


def _judge(model: Any, feats: list[dict], batch: Any) -> tuple[str, str, float | None]:
    """``exact`` / ``contaminated`` / ``crashed`` for a batch fed to ``model``, a detail and the difference."""
    try:
        diff, tol = _contamination(model, feats, batch)
    except Exception as error:  # noqa: BLE001
        return "crashed", _first_line(error), None
    if not math.isfinite(diff) or diff > tol:
        return "contaminated", f"max |logit diff| {diff:.3g} > {tol:.3g}", diff
    return "exact", "", diff


def sweep(model_types: list[str]) -> tuple[list[Outcome], dict[str, str]]:
    """Every configuration of ``model_types``; and the architectures that did not build, with why."""
    import padless

    padless.register_padless_attention()
    outcomes, unbuilt = [], {}
    for model_type in model_types:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = build(model_type)
            except Exception as error:  # noqa: BLE001
                unbuilt[model_type] = _first_line(error)
                continue
            broken = alone_error(model)  # with the attention the model was built with
            # model-free collators first: for_model patches a hybrid's token mixers in place
            mine = [check(model, model_type, c, b) for c in (*COLLATORS[1:], COLLATORS[0]) for b in BACKENDS]
            # a model that cannot run alone is judged only where padless refused it without running it
            if broken and any(o.status not in ("refused", "unsupported") for o in mine):
                unbuilt[model_type] = broken
                continue
            outcomes += mine
    return outcomes, unbuilt


def _reason_class(detail: str) -> str:
    """A short class for a refusal, for the counts."""
    rules = [
        ("prompt learning", "adapter: prompt learning"),
        ("mix tokens without", "recurrent / linear / conv / indexed layers"),
        ("carry state along the whole row", "token mixers not run per document"),
        ("padless cannot split by document", "token mixers of unknown kind"),
        ("value heads as large", "value heads unlike query heads"),
        ("takes no position_ids", "forward takes no position_ids"),
        ("padding_idx + 1", "positions start at padding_idx + 1"),
        ("ALiBi", "ALiBi"),
        ("both directions", "bidirectional attention"),
        ("chunked attention", "chunked attention"),
        ("sliding window", "sliding windows"),
        ("soft-capping", "logit soft-capping"),
        ("sinks", "attention sinks"),
        ("does not pass position_ids", "attention kwargs not passed"),
        ("does not support", "backend unsupported by the model"),
        ("carries", "batch form does not match the backend"),
    ]
    for needle, name in rules:
        if needle in detail:
            return name
    return "other"


def summary(outcomes: list[Outcome], unbuilt: dict[str, str]) -> dict[str, Any]:
    """The counts the README and the doc lead with."""
    by_type: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_type.setdefault(o.model_type, []).append(o)
    exact_for_model = sorted(
        t for t, os in by_type.items() if any(o.collator == "for_model" and o.status == "exact" for o in os)
    )
    refused = sorted(t for t in by_type if t not in exact_for_model)
    reasons = Counter()
    for t in refused:
        details = [o.detail for o in by_type[t] if o.collator == "for_model" and o.status == "refused"]
        reasons[_reason_class(details[0]) if details else "crashed or unsupported"] += 1
    contaminated = sorted({f"{o.model_type}/{o.collator}/{o.backend}" for o in outcomes if o.status == "contaminated"})
    plain_exact = sorted(
        t for t, os in by_type.items() if any(o.collator != "for_model" and o.status == "exact" for o in os)
    )
    raw = {
        c: sorted(t for t, os in by_type.items() if any(o.collator == c and o.raw == "contaminated" for o in os))
        for c in COLLATORS[1:]
    }
    return {
        "types": len(by_type) + len(unbuilt),
        "built": len(by_type),
        "exact": len(exact_for_model),
        "refused": len(refused),
        "refused_by_reason": dict(reasons.most_common()),
        "contaminated": contaminated,
        "plain_exact": len(plain_exact),
        "raw_contaminated": len(set().union(*raw.values())),
        "raw_contaminated_by_collator": {c: len(ts) for c, ts in raw.items()},
        "configurations": len(outcomes),
        "statuses": dict(Counter(o.status for o in outcomes).most_common()),
    }


def table(outcomes: list[Outcome], unbuilt: dict[str, str]) -> str:
    """The markdown section: counts, then one row per architecture."""
    import transformers

    s = summary(outcomes, unbuilt)
    by_type: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_type.setdefault(o.model_type, []).append(o)
    reasons = ", ".join(f"{k} {v}" for k, v in s["refused_by_reason"].items())
    lines = [
        f"transformers {transformers.__version__}: {s['types']} causal-LM types, {s['built']} built as tiny configs; "
        f"**{s['exact']} exact on at least one backend** with `for_model`, **{s['refused']} refused** "
        f"({reasons}), **{len(s['contaminated'])} contaminated**. A model-free `PackingCollator(max_length=...)` "
        f'(a 4D block mask, or `attention="position_ids"`) collates only once fitted to the model; fitted with '
        f"`padless.check_collator`, it is exact on at least one backend for {s['plain_exact']} architectures "
        f"and refused by `check_collator` / `check_batch` everywhere else; fed raw (`model_free=True`, no check), "
        f"the same batches would be contaminated on {s['raw_contaminated']} architectures "
        f"({s['raw_contaminated_by_collator']['plain']} with the 4D block mask, "
        f"{s['raw_contaminated_by_collator']['plain_position_ids']} with position ids alone). "
        f"{s['configurations']} configurations (architecture x collator x backend): "
        + ", ".join(f"{k} {v}" for k, v in s["statuses"].items())
        + ".",
        "",
        "| architecture | `for_model`: exact on | `for_model`: refused or crashed elsewhere (why) | model-free, fitted: exact on | model-free fed raw: contaminated on |",
        "|---|---|---|---|---|",
    ]
    for t in sorted(by_type):
        os = by_type[t]
        exact = [o.backend for o in os if o.collator == "for_model" and o.status == "exact"]
        named = lambda o: o.backend + ("" if o.collator == "plain" else " (position_ids)")  # noqa: E731
        plain = [named(o) for o in os if o.collator != "for_model" and o.status == "exact"]
        raw = [named(o) for o in os if o.raw == "contaminated"]
        why = sorted(
            {
                _clean(o.detail)
                for o in os
                if o.collator == "for_model" and o.status != "exact" and o.status != "unsupported"
            }
        )
        cells = [
            f"`{t}`",
            ", ".join(exact) or "-",
            "; ".join(why) or "-",
            ", ".join(plain) or "-",
            ", ".join(raw) or "-",
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    if unbuilt:
        lines += [
            "",
            f"Not built as a tiny config ({len(unbuilt)}): "
            + "; ".join(f"`{t}` ({_clean(why)[:80]})" for t, why in sorted(unbuilt.items()))
            + ".",
        ]
    return "\n".join(lines) + "\n"


def _clean(detail: str) -> str:
    detail = re.sub(r"attention backend '[^']+' cannot guarantee isolated packed documents here: ", "", detail)
    detail = re.sub(r"; (use backend|no attention backend).*$", "", detail)
    return detail.strip()[:160]
