"""Windowed language models inside every image-text-to-text wrapper whose text backbone can be swapped.

A wrapper whose ``text_config`` is any model type (``sub_configs["text_config"]`` is ``AutoConfig``)
holds its language model under a name of its own (``language_model``, ``text_model``, ...). The rule
must read the sliding windows that language model applies, whatever holds it: a 4D mask without the
window, fed to a windowed model, mixes tokens the window keeps apart.

For each wrapper of transformers' ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING`` with a swappable text
backbone, each windowed backbone of :data:`BACKBONES` (window :data:`WINDOW`, every document longer)
and each backend of sdpa / eager / padless: ``PackingCollator.for_model`` either refuses (a
``ValueError`` naming why) or the packed logits of every text-only document equal the document run
alone (fp32, :data:`ATOL`). 0 contaminated. A wrapper that cannot be built tiny and offline, or cannot
run a text-only document alone, is skipped with the reason.

    OMP_NUM_THREADS=1 python -m pytest tests/multimodal/test_windowed_backbones.py -q -rs
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "attention"))
import sweep_support  # noqa: E402

import padless  # noqa: E402
from padless.attention import rules  # noqa: E402
from padless.attention.backend import packed_documents  # noqa: E402
from padless.attention.select import check_exact  # noqa: E402
from padless.batching.batch import forward_inputs  # noqa: E402
from padless.batching.collate import PackingCollator  # noqa: E402

WINDOW, ROW, ATOL = 4, 20, 1e-5
LENGTHS = (11, 7, 9, 6)
"""Text-only documents, every one longer than :data:`WINDOW`, packed several per row of :data:`ROW`."""
BACKENDS = ("sdpa", "eager", "padless")
TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)  # fmt: skip
SLIDE_FULL = ["sliding_attention", "full_attention"]
SHRINK = dict(out_hidden_size=64, projection_dim=64, image_token_embed_dim=64, num_embeddings=64, base_channels=32,
              latent_channels=32, output_channels=32, mlp_dim=128, alignment_intermediate_size=128,
              projector_hidden_size=64)  # fmt: skip
"""Widths of vision towers, projectors and image generators that :func:`sweep_support._overrides` leaves
large (a text-only document never reads them; they only cost build time)."""


def _backbone(model_type: str) -> Any:
    if model_type == "mistral":  # a window on every layer, one mask for all
        return T.MistralConfig(**TEXT, sliding_window=WINDOW)
    if model_type == "gemma2":  # sliding and full layers alternate (layer_types)
        return T.Gemma2Config(**TEXT, sliding_window=WINDOW, layer_types=SLIDE_FULL, attn_logit_softcapping=None,
                              final_logit_softcapping=None)  # fmt: skip
    if model_type == "gemma3_text":
        return T.Gemma3TextConfig(**TEXT, sliding_window=WINDOW, layer_types=SLIDE_FULL)
    if model_type == "qwen2":  # layers from max_window_layers on slide
        return T.Qwen2Config(**TEXT, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    raise KeyError(model_type)


BACKBONES = ("mistral", "gemma2", "gemma3_text", "qwen2")


def swappable_wrappers() -> list[str]:
    """Image-text-to-text model types whose ``text_config`` may be of any model type."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    out = []
    for model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        if model_type in CONFIG_MAPPING:
            subs = getattr(CONFIG_MAPPING[model_type], "sub_configs", None) or {}
            if subs.get("text_config") is T.AutoConfig:
                out.append(model_type)
    return out


def _shrunk(config: Any, depth: int = 0) -> Any:
    for key, value in list(vars(config).items()):
        if key in SHRINK and isinstance(value, int) and not isinstance(value, bool) and value > SHRINK[key]:
            setattr(config, key, SHRINK[key])
        elif depth < 2 and key != "text_config" and hasattr(value, "to_dict") and hasattr(value, "__dict__"):
            _shrunk(value, depth + 1)
    return config


def build(wrapper: str, backbone: str) -> Any:
    """The tiny wrapper of model type ``wrapper`` around the windowed ``backbone``, fp32, seeded, on sdpa
    (eager where the wrapper has no sdpa), or raise."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    kw = sweep_support._overrides(AutoConfig.for_model(wrapper))
    kw["text_config"] = _backbone(backbone).to_dict()
    config = _shrunk(AutoConfig.for_model(wrapper, **kw))
    cls = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[type(config)]
    with torch.device("meta"):  # a wrapper that cannot hold this backbone fails here, before any weight is drawn
        cls(config)
    for attn in ("sdpa", "eager"):
        config._attn_implementation = attn
        torch.manual_seed(0)
        try:
            return cls(config).eval()
        except ValueError as err:
            if attn == "eager" or "does not support" not in str(err):
                raise
    raise AssertionError("unreachable")


def documents(model: Any) -> list[dict[str, list[int]]]:
    """Text-only documents of :data:`LENGTHS`, of ids below 200 that are no special token of the model."""
    config = model.config
    special = set()
    for cfg in (config, config.get_text_config(decoder=True)):
        for key, value in vars(cfg).items():
            if ("token" in key or key.endswith("_index")) and isinstance(value, int):
                special.add(value)
    allowed = torch.tensor([i for i in range(3, 200) if i not in special])
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": allowed[torch.randint(len(allowed), (n,), generator=g)].tolist()} for n in LENGTHS]


def _alone(model: Any, ids: list[int]) -> torch.Tensor:
    # padless attention never guesses that an unmarked row is one document: say so
    with torch.no_grad(), packed_documents(position_ids=torch.arange(len(ids))[None]):
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


@dataclass(frozen=True)
class Outcome:
    wrapper: str
    backbone: str
    backend: str
    status: str  # exact | refused | contaminated | crashed | unsupported
    detail: str = ""
    diff: float = 0.0


def check(model: Any, wrapper: str, backbone: str, backend: str, docs: list[dict], alone: list) -> Outcome:
    """One (wrapper, backbone, backend): refused by ``for_model``, or every document judged against itself
    alone (``alone``: its logits on the backend the model was built with; backends agree to ~1e-7 there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model.set_attn_implementation(backend)
        except Exception as err:  # noqa: BLE001 (transformers' own refusal)
            return Outcome(wrapper, backbone, backend, "unsupported", sweep_support._first_line(err))
    try:
        batch = PackingCollator.for_model(model, max_length=ROW)(docs)
    except ValueError as err:
        return Outcome(wrapper, backbone, backend, "refused", str(err))
    try:
        with torch.no_grad():
            logits = model(**forward_inputs(batch)).logits.float()
        worst = 0.0
        for i, doc in enumerate(docs):
            ((_, r, o, n),) = batch.placements.of_feature(i)
            worst = max(worst, (logits[r, o : o + n] - alone[i]).abs().max().item())
    except Exception as err:  # noqa: BLE001 (accepted, then the forward fails: loud, yet not refused up front)
        return Outcome(wrapper, backbone, backend, "crashed", sweep_support._first_line(err))
    rows = int(batch["input_ids"].shape[0])
    status = "exact" if worst <= ATOL else "contaminated"
    return Outcome(wrapper, backbone, backend, status, f"{len(docs)} documents in {rows} rows", worst)


def run(wrapper: str) -> tuple[list[Outcome], dict[str, str]]:
    """Every backbone and backend of ``wrapper``; and the backbones it could not be built or run with, and why."""
    padless.register_padless_attention()
    outcomes, skipped = [], {}
    for backbone in BACKBONES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = build(wrapper, backbone)
                docs = documents(model)
                alone = [_alone(model, d["input_ids"]) for d in docs]
            except Exception as err:  # noqa: BLE001 (a wrapper that cannot hold this backbone, or needs images)
                skipped[backbone] = sweep_support._first_line(err)
                continue
        outcomes += [check(model, wrapper, backbone, b, docs, alone) for b in BACKENDS]
    return outcomes, skipped


WRAPPERS = swappable_wrappers()
NAMED = ("idefics2", "idefics3", "smolvlm")
"""Wrappers that keep their language model at ``text_model``: a rule that looked it up by the name
``language_model`` built their 4D masks without the window (0.2-0.6 off on these documents)."""


def test_the_sweep_enumerates_the_swappable_wrappers():
    assert len(WRAPPERS) >= 40
    assert {*NAMED, "llava", "mistral3", "paligemma", "internvl"} <= set(WRAPPERS)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_windowed_backbone_in_the_wrapper_is_exact_or_refused(wrapper):
    """Exact or refused with a reason on every backend, never contaminated, never accepted and then failing."""
    outcomes, skipped = run(wrapper)
    if not outcomes:
        pytest.skip(f"{wrapper} not built with a windowed backbone: {'; '.join(sorted(set(skipped.values())))}")
    bad = [o for o in outcomes if o.status in ("contaminated", "crashed") or (o.status == "refused" and not o.detail)]
    assert bad == [], bad
    for o in outcomes:
        if wrapper in NAMED and o.status != "unsupported":
            assert o.status == "exact", o
        if wrapper in ("got_ocr2", "pp_chart2table") and o.backend == "padless":
            # only its language model switches: a batch for the wrapper's backend would reach another one
            assert o.status == "refused" and "its language model" in o.detail, o
        if (wrapper, o.backbone, o.backend) == ("paligemma", "gemma3_text", "sdpa"):
            # PaliGemma builds the mask itself and passes on a 4D tensor, never a dict of them
            assert o.status == "refused" and "no 4D mask per layer type" in o.detail, o


def test_the_rule_knows_which_backends_take_one_batch():
    from padless.attention.backend_table import BACKENDS

    assert rules.MASK_BACKENDS == {name for name, spec in BACKENDS.items() if spec.inputs == "mask4d"}


def test_a_mask_without_the_window_shows_in_the_sweep():
    """Guards the sweep: the same documents packed with a 4D mask that lost the window differ from the
    documents alone, so a rule that dropped it would be caught."""
    model = build("idefics3", "mistral")
    docs = documents(model)
    alone = [_alone(model, d["input_ids"]) for d in docs]
    assert check(model, "idefics3", "mistral", "sdpa", docs, alone).status == "exact"
    blind = PackingCollator(max_length=ROW, attention="mask4d", windows=None, model_free=True)(docs)
    with torch.no_grad():
        logits = model(**forward_inputs(blind)).logits
    worst = max((logits[r, o : o + n] - alone[i]).abs().max().item() for i, (_, r, o, n) in
                enumerate(blind.placements.of_feature(j)[0] for j in range(len(docs))))  # fmt: skip
    assert worst > 1e3 * ATOL


def _llava(backbone: str = "mistral") -> Any:
    model = build("llava", backbone)
    return model, model.model.language_model


def test_the_language_model_is_found_by_its_config_whatever_attribute_holds_it():
    model, lm = _llava()
    del model.model.language_model
    model.model.decoder_stack = lm  # a name no rule foresaw
    assert rules.text_model(model) is lm
    read = rules.attention_rules(model)
    assert read.text_model == "MistralModel" and read.mask_windows(ROW) == WINDOW
    lm.config = copy.deepcopy(lm.config)  # not the wrapper's text config object: found by its class
    assert rules.text_model(model) is lm and rules.attention_rules(model).mask_windows(ROW) == WINDOW


def test_the_language_model_is_found_by_its_attention_layers():
    model, lm = _llava()
    lm.config = T.LlamaConfig(**TEXT)  # neither the text config nor its class
    assert rules.text_model(model) is lm


def test_a_wrapper_whose_language_model_cannot_be_found_is_refused():
    """Its text config names a window; with no language model to read, which windows apply is unknown."""
    model, lm = _llava()

    class Stack(torch.nn.Module):  # decoder layers outside any PreTrainedModel
        pass

    stack = Stack()
    stack.layers = lm.layers
    del model.model.language_model
    model.model.stack = stack
    assert rules.text_model(model) is None
    for backend in ("sdpa", "eager"):
        with pytest.raises(ValueError, match="found no language model in LlavaForConditionalGeneration"):
            check_exact(model, backend, max_length=ROW)


def test_a_bare_config_reads_the_class_its_text_config_maps_to():
    config = build("idefics3", "qwen2").config
    read = rules.attention_rules(config)
    assert read.text_model == "Qwen2Model"
    assert read.mask_windows(ROW) == {"full_attention": None, "sliding_attention": WINDOW}


def table() -> tuple[str, Counter]:
    """The markdown table of the whole sweep (one row per wrapper and backbone) and the counts."""
    lines = ["| wrapper | backbone | sdpa | eager | padless |", "|---|---|---|---|---|"]
    counts: Counter = Counter()
    for wrapper in WRAPPERS:
        outcomes, skipped = run(wrapper)
        for backbone, why in skipped.items():
            counts["not built"] += 1
            lines.append(f"| {wrapper} | {backbone} | not built: {why[:90]} | | |")
        by = {(o.backbone, o.backend): o for o in outcomes}
        for backbone in BACKBONES:
            if backbone in skipped:
                continue
            cells = []
            for b in BACKENDS:
                o = by[(backbone, b)]
                counts[o.status] += 1
                if o.status in ("exact", "contaminated"):
                    cells.append(f"{o.status} ({o.diff:.1e})")
                else:
                    cells.append(f"{o.status}: {o.detail[:90]}".replace("|", "/"))
            lines.append(f"| {wrapper} | {backbone} | {' | '.join(cells)} |")
    return "\n".join(lines), counts


if __name__ == "__main__":
    text, counts = table()
    print(text)
    print(dict(counts))
