"""The multimodal sweep: packed rows of image-text documents (0, 1 and 2 images of different sizes)
against each document run alone, logits at every position and gradients of every parameter (vision
tower and projector included), fp32, 1e-5, on sdpa / eager / padless, for the families of
:data:`quick_vlms.QUICK` and the families of :data:`wide_vlms.WIDE` the rule accepts (always), and the
wide ones it refuses because they are not exact (with ``PADLESS_SWEEP=1``); every other image-text-to-text model type of transformers is refused for
images by the rule, with the reason (its text-only rows are judged by the text rule). 0 contaminated.

With ``PADLESS_SWEEP=1`` the table in docs/exactness-multimodal.md is rewritten from the run::

    PADLESS_SWEEP=1 OMP_NUM_THREADS=1 python -m pytest tests/multimodal/test_vlm_sweep.py -q
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quick_vlms  # noqa: E402
import wide_vlms  # noqa: E402
from quick_vlms import alone_inputs, document_loss, gradients  # noqa: E402

from padless.attention import multimodal  # noqa: E402
from padless.attention.accept import check_batch  # noqa: E402
from padless.attention.select import use_backend  # noqa: E402
from padless.batching.collate import PackingCollator  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "exactness-multimodal.md"
BACKENDS = ("sdpa", "eager", "padless")
ATOL = 1e-5
SWEEP = os.environ.get("PADLESS_SWEEP") == "1"
BUILDERS = {**quick_vlms.QUICK, **wide_vlms.WIDE}
SWEPT = [*quick_vlms.QUICK, *(t for t in wide_vlms.WIDE if SWEEP or t in multimodal.FAMILIES)]
"""The families this run sweeps: the quick ones and every wide one the rule accepts, always (every
accepted family is checked on every run); the refused wide ones too with ``PADLESS_SWEEP=1``."""


@dataclass
class Outcome:
    model_type: str
    backend: str
    status: str  # exact | refused | contaminated | unsupported (no such backend for it) | fails (tried only)
    detail: str = ""
    logits: float = 0.0
    grads: float = 0.0


UNSUPPORTED = "does not support an attention implementation"
"""What transformers says of a backend a model class does not implement (GOT-OCR2 has no sdpa)."""


def _built(model_type: str, backend: str):
    """The family's tiny model on ``backend``; for padless, built on sdpa (eager where transformers
    has no sdpa for the family), then swapped."""
    if backend != "padless":
        return BUILDERS[model_type](backend)
    try:
        return BUILDERS[model_type]("sdpa")
    except ValueError as err:
        if UNSUPPORTED not in str(err):
            raise
        return BUILDERS[model_type]("eager")


def run(model_type: str, backend: str) -> Outcome:
    try:
        model, docs = _built(model_type, backend)
    except ValueError as err:
        if UNSUPPORTED not in str(err):
            raise
        return Outcome(model_type, backend, "unsupported", str(err).split(".")[0])
    model.zero_grad()
    alone = []
    for d in docs:
        logits = model(**alone_inputs(d)).logits[0]
        document_loss(logits, d["labels"]).backward()
        alone.append(logits.detach())
    want = gradients(model)
    if backend == "padless":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.set_attn_implementation(use_backend("padless"))
    longest = max(len(d["input_ids"]) for d in docs)
    try:
        collator = PackingCollator.for_model(model, max_length=longest + 6)
        batch = collator(docs)
        check_batch(model, batch)
    except ValueError as err:
        return Outcome(model_type, backend, "refused", str(err))
    model.zero_grad()
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    total, worst = 0, 0.0
    for i, d in enumerate(docs):
        ((_, r, o, n),) = batch.placements.of_feature(i)
        worst = max(worst, (logits[r, o : o + n].detach() - alone[i]).abs().max().item())
        total = total + document_loss(logits[r, o : o + n], d["labels"])
    total.backward()
    got = gradients(model)
    scale = max(g.abs().max().item() for g in want.values())
    gworst = (
        max((got[n] - g).abs().max().item() for n, g in want.items()) / scale
        if got.keys() == want.keys()
        else float("inf")
    )
    rows = batch["input_ids"].shape[0]
    detail = f"{len(docs)} documents, {collator.totals['images']} images, {rows} rows"
    status = "exact" if worst <= ATOL and gworst <= ATOL and any("vis" in n for n in got) else "contaminated"
    return Outcome(model_type, backend, status, detail, worst, gworst)


@pytest.fixture(scope="module")
def outcomes():
    return [run(t, b) for t in SWEPT for b in BACKENDS]


def tried(model_type: str, backend: str) -> Outcome:
    """A wide family the rule refuses, run as if FAMILIES held the scheme it was tried with
    (:data:`wide_vlms.TRIED`): what keeps it out."""
    multimodal.FAMILIES[model_type] = wide_vlms.TRIED[model_type][0]
    try:
        return run(model_type, backend)
    except (ValueError, RuntimeError) as err:  # the packed forward itself fails
        return Outcome(model_type, backend, "fails", f"{type(err).__name__}: {str(err).split(';')[0]}")
    finally:
        del multimodal.FAMILIES[model_type]


def test_no_family_is_contaminated_and_every_one_is_exact_somewhere(outcomes):
    """Every family the rule accepts is exact wherever it is not refused; a wide family it does not
    accept is refused on every backend (or the backend does not exist for it)."""
    bad = [o for o in outcomes if o.status == "contaminated"]
    assert bad == [], bad
    for t in SWEPT:
        if t not in multimodal.FAMILIES:
            assert t in wide_vlms.TRIED, f"{t}: a wide family the rule refuses says why in wide_vlms.TRIED"
            for o in outcomes:
                if o.model_type == t:
                    assert o.status in ("refused", "unsupported"), o
            continue
        assert any(o.status == "exact" for o in outcomes if o.model_type == t), [
            o for o in outcomes if o.model_type == t
        ]


def test_the_sweep_knows_what_is_exact_and_what_is_refused(outcomes):
    """Guards the sweep itself: every family packs exactly on sdpa and eager; Gemma 3's bidirectional
    image blocks need a 4D mask, so padless attention is refused for its images, naming why; Qwen3.5
    (hybrid plus vision) is exact on every backend, padless attention included: its DeltaNet layers scan
    the row with the boundaries the batch is sent, which its code hands on to attention too."""
    status = {(o.model_type, o.backend): o for o in outcomes}
    for t in quick_vlms.QUICK:
        for backend in ("sdpa", "eager"):
            assert status[(t, backend)].status == "exact", status[(t, backend)]
        if t != "gemma3":
            assert status[(t, "padless")].status == "exact", status[(t, "padless")]
    gemma = status[("gemma3", "padless")]
    assert gemma.status == "refused" and "only a 4D mask carries" in gemma.detail


def test_the_wide_sweep_knows_what_is_exact_and_what_is_refused(outcomes):
    """The wide families the rule accepts are exact on sdpa, eager and padless, except Idefics2 on
    padless, refused naming its perceiver's cross-attention."""
    status = {(o.model_type, o.backend): o for o in outcomes}
    for t in wide_vlms.WIDE:
        if t in multimodal.FAMILIES:
            for backend in BACKENDS:
                o = status[(t, backend)]
                if (t, backend) == ("idefics2", "padless"):
                    assert o.status == "refused" and "perceiver resampler cross-attends" in o.detail, o
                else:
                    assert o.status == "exact", o
    assert set(wide_vlms.WIDE) == set(wide_vlms.TRIED) | (set(wide_vlms.WIDE) & set(multimodal.FAMILIES))


def _config_of(model_type: str):
    from transformers import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]()
    except Exception as err:  # noqa: BLE001 (a config that needs arguments: its class name still says the family)
        return err


def verdicts() -> list[tuple[str, str]]:
    """Every image-text-to-text model type: what the rule says of its images."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    rows = []
    for model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        config = _config_of(model_type)
        if isinstance(config, Exception):
            rows.append((model_type, f"not judged: its default config does not build ({type(config).__name__})"))
            continue
        scheme, reason = multimodal.vision_scheme(config)
        if scheme is not None:
            rows.append((model_type, "packed with images"))
        else:
            assert reason is not None, model_type  # a model type mapped to image-text-to-text reads images
            rows.append((model_type, "refused for images: not verified by this sweep"))
    return rows


def test_every_image_text_model_type_is_exact_or_refused_with_a_reason():
    rows = verdicts()
    assert len(rows) >= 100
    packed = {t for t, v in rows if v == "packed with images"}
    assert packed == set(multimodal.FAMILIES) & {t for t, _ in rows}
    assert packed <= set(BUILDERS), "a family the rule accepts must be in the sweep"


@pytest.mark.skipif(not SWEEP, reason="writes the docs table; PADLESS_SWEEP=1")
def test_write_the_table(outcomes):
    by = {(o.model_type, o.backend): o for o in outcomes}
    cell = lambda o: f"{o.status} ({max(o.logits, o.grads):.1e})" if o.status in ("exact", "contaminated") else o.status  # noqa: E731
    lines = ["| model type | sdpa | eager | padless | documents |", "|---|---|---|---|---|"]
    for t in SWEPT:
        cells = []
        for b in BACKENDS:
            o = by[(t, b)]
            if t in wide_vlms.TRIED:  # refused; what it would be if the rule accepted it
                cells.append(f"{o.status}; if accepted: {cell(tried(t, b))}")
            else:
                cells.append(cell(o))
        detail = next((o.detail for b in BACKENDS if (o := by[(t, b)]).status == "exact"), "")
        if t in wide_vlms.TRIED:
            detail = f"not accepted: {wide_vlms.TRIED[t][1]}"
        lines.append(f"| {t} | {' | '.join(cells)} | {detail} |")
    lines += ["", "| model type | images |", "|---|---|"] + [f"| {t} | {v} |" for t, v in verdicts()]
    text = DOC.read_text()
    begin, end = "<!-- sweep:begin -->", "<!-- sweep:end -->"
    head, rest = text.split(begin, 1)
    DOC.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1])
