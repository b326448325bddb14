"""Which packing is exact on which attention backend: TRL's paths, transformers' DataCollatorWithFlattening
and padless', each collator's own batch fed to tiny models and checked by padless.isolation.audit
(every document's logits in the batch == the document alone; no target across a boundary).

The test measures the table and holds docs/integrations/exactness.md to it, so the page cannot drift
from what TRL 1.16 / transformers 5.24 do. ``python tests/integrations/test_exactness.py`` prints it.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integrations_support import ROOT, offline_hub  # noqa: E402

pytest.importorskip("trl")

DOC = ROOT / "docs" / "integrations" / "exactness.md"
LENGTHS = (5, 9, 3, 7, 12, 4, 6, 11)
ROW = 24
BACKENDS = ("sdpa", "eager", "padless")
MODELS = {"GPT-2": "tiny-gpt2", "Llama": "tiny-llama", "Mistral, window 4": "tiny-mistral-window"}
PATHS = {
    "trl-bfd": "TRL `packing=True` (bfd): `pack_dataset` + its padding-free collator",
    "trl-wrapped": 'TRL `packing=True, packing_strategy="wrapped"`: its default collator',
    "trl-wrapped-pf": 'TRL `packing_strategy="wrapped", padding_free=True`',
    "trl-padding-free": "TRL `padding_free=True` (no packing)",
    "hf-flattening": "transformers `DataCollatorWithFlattening` under Trainer (`use_cache=False`)",
    "hf-flattening-cache": "transformers `DataCollatorWithFlattening`, plain loop (`use_cache=True`)",
    "padless-rows-trl": "`padless.pack_dataset` rows + TRL's padding-free collator",
    "padless": "`padless.pack_dataset` rows + `PackingCollator.for_model` (padless' trainers)",
}


def _model(name: str, attn: str):
    import torch
    from transformers import AutoModelForCausalLM

    from padless.models.factory import build_model, tiny_config

    if name != "tiny-mistral-window":
        return build_model(name, attn_implementation=attn, seed=0)
    config = tiny_config("mistral")
    config.sliding_window, config.use_cache = 4, False  # a window shorter than most documents
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def _features():
    rng = np.random.default_rng(0)
    return [{"input_ids": rng.integers(1, 500, n).tolist(), "doc": [i] * n} for i, n in enumerate(LENGTHS)]


def _spans_from_doc_ids(doc_rows, offsets=None):
    """(row, offset, length) of each run of one document id; rows may be flattened into one."""
    spans = []
    for r, docs in enumerate(doc_rows):
        base = 0 if offsets is None else offsets[r]
        row = 0 if offsets is not None else r
        start = 0
        for t in range(1, len(docs) + 1):
            if t == len(docs) or docs[t] != docs[start]:
                spans.append((row, base + start, t - start))
                start = t
    return spans


def _batch(path: str, model):
    """(batch, spans, forward kwargs) exactly as the path's trainer would feed ``model``."""
    from datasets import Dataset
    from transformers import DataCollatorWithFlattening
    from trl import pack_dataset as trl_pack
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    import padless
    from padless.batching.collate import PackingCollator

    feats = _features()
    ds = Dataset.from_dict({"input_ids": [f["input_ids"] for f in feats], "doc": [f["doc"] for f in feats]})
    no_cache = {"use_cache": False}
    if path in ("hf-flattening", "hf-flattening-cache", "trl-padding-free"):
        rows = [{"input_ids": f["input_ids"]} for f in feats]
        collator = (
            DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
            if path == "trl-padding-free"
            else DataCollatorWithFlattening()
        )
        batch = collator(rows)
        offsets = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]]).tolist()
        spans = _spans_from_doc_ids([f["doc"] for f in feats], offsets)
        if path == "hf-flattening-cache":
            model.config.use_cache = True
            return batch, spans, {}
        return batch, spans, no_cache
    if path.startswith("trl"):
        packed = trl_pack(ds, ROW, "wrapped" if "wrapped" in path else "bfd")
    else:
        packed = padless.pack_dataset(ds, ROW)
    rows = packed.to_list()
    features = [{k: v for k, v in r.items() if k != "doc"} for r in rows]
    if path == "padless":
        collator = PackingCollator.for_model(model, max_length=ROW)
        return collator(features), _spans_from_doc_ids([r["doc"] for r in rows]), {}
    flat = path != "trl-wrapped"
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=flat)(features)
    if flat:
        offsets = np.concatenate([[0], np.cumsum([len(r["doc"]) for r in rows])[:-1]]).tolist()
        return batch, _spans_from_doc_ids([r["doc"] for r in rows], offsets), no_cache
    return batch, _spans_from_doc_ids([r["doc"] for r in rows]), no_cache


def measure(path: str, backend: str, name: str) -> str:
    """``exact``, ``contaminated``, ``cross-targets`` (isolated attention, but a token trained to
    predict the next document) or ``refused`` (padless refuses the backend for this model)."""
    import torch

    from padless.attention.backend import register_padless_attention
    from padless.attention.select import resolve_backend
    from padless.isolation.audit import audit_batch

    register_padless_attention()
    model = _model(name, backend)
    if path == "padless":
        try:
            resolve_backend(backend, device="cpu", dtype=torch.float32, config=model, max_length=ROW)
        except ValueError:
            return "refused"
    batch, spans, kwargs = _batch(path, model)
    audit = audit_batch(model, batch, spans, forward_kwargs=kwargs)
    if audit.max_logit_diff > audit.logit_tolerance:
        return "contaminated"
    return "cross-targets" if audit.cross_document_targets else "exact"


@cache
def table() -> str:
    """The markdown table: one row per path, one column per backend; a cell lists what is not exact."""
    offline_hub()
    lines = ["| path | " + " | ".join(f"`{b}`" for b in BACKENDS) + " |", "|---" * (len(BACKENDS) + 1) + "|"]
    for path, title in PATHS.items():
        cells = []
        for backend in BACKENDS:
            verdicts = {label: measure(path, backend, name) for label, name in MODELS.items()}
            bad = {label: v for label, v in verdicts.items() if v != "exact"}
            if not bad:
                cells.append("exact")
            elif len(set(bad.values())) == 1 and len(bad) == len(MODELS):
                cells.append(next(iter(bad.values())))
            else:
                cells.append("exact; " + ", ".join(f"{label}: {v}" for label, v in bad.items()))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _doc_table() -> str:
    text = DOC.read_text()
    match = re.search(r"<!-- measured:begin -->\n(.*?)\n<!-- measured:end -->", text, flags=re.S)
    assert match, f"{DOC} has no measured table markers"
    return match.group(1).strip()


@pytest.mark.slow
def test_the_exactness_table_in_the_docs_is_what_the_libraries_do():
    measured = table()
    assert _doc_table() == measured, f"docs/integrations/exactness.md is out of date; the measured table:\n{measured}"


def test_the_measure_tells_exact_from_contaminated():
    """The two ends of the scale on GPT-2/sdpa: TRL's wrapped rows (documents see each other) and padless'."""
    assert measure("trl-wrapped", "sdpa", "tiny-gpt2") == "contaminated"
    assert measure("padless", "sdpa", "tiny-gpt2") == "exact"
    assert measure("padless", "sdpa", "tiny-mistral-window") == "exact"  # the 4D mask carries the window


def test_a_target_across_a_boundary_is_counted_even_when_attention_is_isolated():
    from padless.batching.collate import PackingCollator
    from padless.isolation.audit import audit_batch

    model = _model("tiny-gpt2", "sdpa")
    batch = PackingCollator.for_model(model)([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9, 10, 11]}])
    spans = [(0, 0, 3), (0, 3, 4)]
    assert audit_batch(model, batch, spans).isolated
    batch["labels"][0, 3] = 8  # token 7 (end of the first document) now learns to predict 8
    audit = audit_batch(model, batch, spans)
    assert audit.cross_document_targets == 1 and audit.max_logit_diff <= audit.logit_tolerance
    assert not audit.isolated


if __name__ == "__main__":
    print(table())
