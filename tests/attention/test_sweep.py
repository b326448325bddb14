"""The exactness sweep: every causal LM transformers ships, as a tiny config, packed by ``for_model`` and
by the model-free collator, on sdpa / eager / padless. Every architecture that builds is exact on at
least one backend or refused with a reason; none is contaminated (accepted but wrong).

- The quick part (CI) runs :data:`QUICK`, a representative set: plain attention, sliding windows per
  layer type, soft-capping, sinks, chunked attention, offset positions, ALiBi, hybrids, a decoder
  without position ids, a multimodal-RoPE text stack.
- The whole sweep is marked ``sweep`` and skipped unless ``PADLESS_SWEEP=1``; it writes the table in
  docs/integrations/exactness.md (between the ``sweep:begin`` / ``sweep:end`` markers). Run before a
  release::

      PADLESS_SWEEP=1 OMP_NUM_THREADS=1 python -m pytest tests/attention/test_sweep.py -m sweep -q

The checks themselves live in ``sweep_support.py`` beside this file.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_support as S  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "exactness.md"
QUICK = (
    "llama", "gpt2", "mistral", "gemma2", "gemma3_text", "gpt_oss", "cohere2", "llama4_text", "roberta",
    "bloom", "mpt", "qwen3_next", "lfm2", "mamba", "bart", "qwen2", "phi3", "opt", "qwen3_5_text", "bamba",
    "deepseek_v32", "deepseek_v3", "doge",
)  # fmt: skip
"""About 20 architectures, one or more per rule of the exactness rule."""


@pytest.fixture(scope="module")
def quick():
    return S.sweep(list(QUICK))


def test_quick_sweep_no_configuration_is_contaminated(quick):
    outcomes, unbuilt = quick
    assert not unbuilt, unbuilt
    bad = [o for o in outcomes if o.status in ("contaminated", "crashed")]  # exact or refused, never a crash either
    assert bad == [], "\n".join(f"{o.model_type}/{o.collator}/{o.backend}: {o.status} {o.detail}" for o in bad)


def test_quick_sweep_every_architecture_is_exact_somewhere_or_refused_with_a_reason(quick):
    outcomes, _ = quick
    for model_type in QUICK:
        mine = [o for o in outcomes if o.model_type == model_type and o.collator == "for_model"]
        exact = [o for o in mine if o.status == "exact"]
        refused = [o for o in mine if o.status == "refused"]
        assert exact or (refused and all(o.detail for o in refused)), (model_type, mine)


def test_quick_sweep_knows_what_is_exact_and_what_is_refused(quick):
    """Guards the sweep itself: families padless packs must come out exact, those it cannot refused."""
    outcomes, _ = quick
    status = {(o.model_type, o.collator, o.backend): o for o in outcomes}
    for model_type in ("llama", "gpt2", "mistral", "gemma3_text", "qwen2"):
        assert status[(model_type, "for_model", "sdpa")].status == "exact", status[(model_type, "for_model", "sdpa")]
        assert status[(model_type, "for_model", "padless")].status == "exact"
    for model_type, needle in (
        ("roberta", "padding_idx + 1"),
        ("deepseek_v32", "mix tokens without"),
        ("bart", "no position_ids"),
        ("bloom", "ALiBi"),
    ):
        o = status[(model_type, "for_model", "eager")]  # every model has eager (BLOOM: no sdpa)
        assert o.status == "refused" and needle in o.detail, o
    # pure state-space models: restarted position_ids through **kwargs reach the per-document mixers
    for backend in ("eager", "padless"):
        assert status[("mamba", "for_model", backend)].status == "exact", status[("mamba", "for_model", backend)]
    # hybrids: for_model runs their token mixers on each document alone
    # (padless.attention.mixers.enable_per_document_mixers)
    for model_type in ("qwen3_5_text", "qwen3_next", "bamba", "lfm2"):
        assert status[(model_type, "for_model", "sdpa")].status == "exact", status[(model_type, "for_model", "sdpa")]
        assert status[(model_type, "for_model", "eager")].status == "exact"
    # chunked attention (Llama 4) is carried by restarted position_ids on sdpa; padless attention refuses it
    assert status[("llama4_text", "for_model", "sdpa")].status == "exact"
    assert "chunked attention" in status[("llama4_text", "for_model", "padless")].detail
    # the model-free batch: exact where a plain block mask is what the model computes, refused where not
    assert status[("llama", "plain", "sdpa")].status == "exact"
    assert status[("mistral", "plain", "sdpa")].status == "refused"
    assert "sliding window" in status[("mistral", "plain", "sdpa")].detail
    assert status[("mistral", "plain", "sdpa")].raw == "contaminated"  # what the refusal keeps out
    assert status[("llama", "plain", "sdpa")].raw == "exact"
    assert status[("mistral", "plain_position_ids", "sdpa")].status == "exact"  # transformers' masks keep the window
    # latent attention (DeepSeek-V3): exact everywhere; Doge's own dynamic mask: padless attention refused up front
    for backend in ("sdpa", "eager", "padless"):
        assert status[("deepseek_v3", "for_model", backend)].status == "exact", status[
            ("deepseek_v3", "for_model", backend)
        ]
    assert "mask of their own" in status[("doge", "for_model", "padless")].detail
    assert status[("doge", "for_model", "sdpa")].status == "exact"


def test_the_sweep_counts_a_wrong_batch_as_contaminated():
    """The measure can fail: a block mask without Mistral's window, fed straight to the model."""
    import torch

    from padless.batching.collate import PackingCollator

    model = S.build("mistral")
    model.set_attn_implementation("sdpa")
    feats = S.features(S.VOCAB)
    diff, tol = S._contamination(model, feats, PackingCollator(model_free=True, max_length=S.ROW)(feats))
    assert diff > 100 * tol
    assert torch.isfinite(torch.tensor(diff))


def test_the_docs_lead_with_the_tables_counts():
    """The sweep figures of docs/exactness.md and docs/limits.md are the committed table's (docs/integrations/exactness.md),
    not typed from memory: regenerating the table and forgetting that page fails here."""
    doc = DOC.read_text()
    lead = re.search(
        r"transformers [\d.]+: (\d+) causal-LM types, (\d+) built.*?\*\*(\d+) exact on at least one backend\*\* with "
        r"`for_model`, \*\*(\d+) refused\*\*.*?\*\*(\d+) contaminated\*\*.*?for (\d+) architectures.*?"
        r"contaminated on (\d+) architectures \((\d+) with the 4D block mask, (\d+) with position ids alone\)",
        doc,
    )
    assert lead, "the table's summary line changed shape"
    types, built, exact, refused, contaminated, fitted, raw, raw_mask, raw_positions = lead.groups()
    rows = [line.split("|") for line in doc.splitlines() if line.startswith("| `") and line.count("|") == 6]
    on = {b: sum(b in [x.strip() for x in r[2].split(",")] for r in rows) for b in S.BACKENDS}
    readme = " ".join(" ".join((DOC.parents[1] / page).read_text() for page in ("exactness.md", "limits.md")).split())
    for needle in (
        f"of {types} causal-LM types, {built} build",
        f"**{exact} are exact on at least one of sdpa / eager / padless**",
        f"**{refused} are refused with the reason**",
        f"**{contaminated} contaminated**",
        f"exact for {fitted} architectures",
        f"contaminated on {raw}:",
        f"contaminated on {raw} of the {built} architectures the sweep builds ({raw_mask} with the 4D mask, "
        f"{raw_positions} with position ids alone)",
        f"exact for {on['sdpa']} architectures on sdpa, {on['eager']} on eager and {on['padless']} on padless attention",
        f"CI runs {len(QUICK)} representative architectures",
    ):
        assert needle in readme, needle


def _write_doc(section: str) -> None:
    text = DOC.read_text()
    block = f"<!-- sweep:begin -->\n{section.rstrip()}\n<!-- sweep:end -->"
    if "<!-- sweep:begin -->" in text:
        text = re.sub(r"<!-- sweep:begin -->\n.*?<!-- sweep:end -->", lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + SWEEP_INTRO + "\n" + block + "\n"
    DOC.write_text(text)


SWEEP_INTRO = """## Every causal LM of transformers: the sweep

`tests/attention/test_sweep.py` builds every type of transformers' causal-LM mapping as a tiny random
config (hidden 64, 2 layers, or 4 for a layer pattern so each kind of layer is present; vocabulary 256;
sliding windows and attention chunks of 8 tokens, shorter than most of the 7 documents of up to 20
tokens; rows of 32), and for each of `sdpa`, `eager` and `padless` packs the documents with
`PackingCollator.for_model(model)` and with the model-free `PackingCollator(max_length=32)`, both its
4D block mask and `attention="position_ids"` (a model-free collator refuses to collate until
`padless.check_collator(model, collator)` fits it; its batch counts as accepted only if
`padless.check_batch(model, batch)` accepts it too). An accepted batch is **exact** when every
document's packed logits equal the document alone (fp32, `1e-5 + 1e-5 x max|logit|`), **contaminated**
otherwise; **refused** means padless raised with the reason shown; **crashed** means the model raised
on an accepted batch (loud, never silent; the sweep asserts there are none);
**unsupported**: transformers has no such attention implementation for the model. A config that
cannot run one document alone is listed as not built. Regenerate (minutes) with
`PADLESS_SWEEP=1 OMP_NUM_THREADS=1 python -m pytest tests/attention/test_sweep.py -m sweep -q`.
"""


@pytest.mark.sweep
@pytest.mark.skipif(not os.environ.get("PADLESS_SWEEP"), reason="the whole sweep runs with PADLESS_SWEEP=1")
def test_whole_sweep_writes_the_table_and_finds_nothing_contaminated():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    outcomes, unbuilt = S.sweep(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    _write_doc(S.table(outcomes, unbuilt))
    summary = S.summary(outcomes, unbuilt)
    assert summary["contaminated"] == [], summary["contaminated"]
    crashed = [f"{o.model_type}/{o.collator}/{o.backend}: {o.detail}" for o in outcomes if o.status == "crashed"]
    assert crashed == [], crashed
    for model_type in {o.model_type for o in outcomes}:  # exact somewhere, or refused with a reason
        mine = [o for o in outcomes if o.model_type == model_type and o.collator == "for_model"]
        assert any(o.status == "exact" for o in mine) or any(o.status == "refused" and o.detail for o in mine), mine
