"""Loss weighting (token / sequence / weights): the packed step equals the padded step and the
definition computed sequence by sequence, under gradient accumulation and over 2 gloo ranks."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch

from conftest import make_features
from padless.batching.collate import FeatureSpec, PackingCollator, PaddingCollator
from padless.layout import IGNORE_INDEX
from padless.models.factory import build_model
from padless.objectives.loss import LOSS_WEIGHTINGS, document_ids, model_loss, step_num_items, target_weights

LENGTHS = [5, 1, 17, 9, 3, 12, 2, 8, 20, 6]


def _features(seed=3, weighted=True):
    """Features with per-token weights under ``"w"`` (``weighted=False``: the same features without
    them; a collator not told ``loss_weights="w"`` refuses a key it would not carry)."""
    feats = make_features(LENGTHS, with_labels=True, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for f in feats:
        w = rng.uniform(0.0, 2.0, len(f["input_ids"])).tolist()
        if weighted:
            f["w"] = w
    return feats


def _fed(feats, mode):
    """What a collator of ``mode`` is given: the weights only when it reads them."""
    return feats if mode == "weights" else [{k: v for k, v in f.items() if k != "w"} for f in feats]


def _spec(mode):
    return FeatureSpec(loss_weights="w" if mode == "weights" else None)


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _step(model, micro_batches, mode):
    model.zero_grad(set_to_none=True)
    n = step_num_items(micro_batches, weighting=mode)
    total = 0.0
    for batch in micro_batches:
        loss = model_loss(model, batch, n, weighting=mode)
        loss.backward()
        total += loss.item()
    return total, _grads(model)


def _reference(model, feats, mode):
    """The definition, one sequence at a time (no packing, no padding)."""
    model.zero_grad(set_to_none=True)
    parts, norms = [], []
    for f in feats:
        labels = torch.tensor(f["labels"])
        t = torch.nonzero(labels[1:] != IGNORE_INDEX).squeeze(1) + 1  # trained targets
        if t.numel() == 0:
            continue
        logits = model(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0]
        ce = torch.nn.functional.cross_entropy(logits[t - 1].float(), labels[t], reduction="none")
        w = {
            "token": torch.ones_like(ce),
            "sequence": torch.full_like(ce, 1.0 / ce.numel()),
            "weights": torch.tensor(f["w"])[t],
        }[mode]
        parts.append((ce * w).sum())
        norms.append(w.sum() if mode != "sequence" else torch.tensor(1.0))
    loss = torch.stack(parts).sum() / torch.stack(norms).sum()
    loss.backward()
    return loss.item(), _grads(model)


@pytest.mark.parametrize("mode", LOSS_WEIGHTINGS)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_packed_equals_padded_equals_definition_under_accumulation(mode, family):
    model = build_model(f"tiny-{family}").eval()
    feats = _features()
    halves = [feats[:4], feats[4:]]
    ref_loss, ref_g = _reference(model, feats, mode)
    pad_loss, pad_g = _step(model, [PaddingCollator(features=_spec(mode))(_fed(h, mode)) for h in halves], mode)
    packer = PackingCollator.for_model(model, max_length=24, features=_spec(mode))
    pack_loss, pack_g = _step(model, [packer(_fed(h, mode)) for h in halves], mode)
    for loss, g in ((pad_loss, pad_g), (pack_loss, pack_g)):
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
        torch.testing.assert_close(g, ref_g, rtol=1e-5, atol=1e-7)
    if mode != "token":  # the modes really differ: the check could fail
        _, token_g = _reference(model, feats, "token")  # a near-uniform tiny model: compare gradients
        assert (token_g - ref_g).norm() > 1e-2 * ref_g.norm()


@pytest.mark.parametrize("mode", LOSS_WEIGHTINGS)
def test_trained_logits_only_gives_the_same_loss_and_gradients(mode):
    model = build_model("tiny-llama").eval()
    batch = PackingCollator.for_model(model, max_length=24, features=_spec(mode))(_fed(_features(seed=8), mode))
    n = step_num_items([batch], weighting=mode)
    out = []
    for only in (False, True):
        model.zero_grad(set_to_none=True)
        loss = model_loss(model, batch, n, weighting=mode, trained_logits_only=only)
        loss.backward()
        out.append((loss.detach(), _grads(model)))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-5, atol=1e-7)


def test_split_pieces_are_documents_of_their_own():
    """overlong="split": each piece is trained as its own document, so it counts as one."""
    feats = make_features([30, 7, 19], seed=9)  # every token trained
    batch = PackingCollator(model_free=True, max_length=12, overlong="split")(feats)
    pieces = batch.placements.feature.size
    assert pieces > len(feats)
    assert step_num_items([batch], weighting="sequence").item() == pieces  # every piece has >= 1 target
    w = target_weights(batch, "sequence")
    for j in range(pieces):
        r, o, n = (int(a[j]) for a in (batch.placements.row, batch.placements.offset, batch.placements.length))
        assert torch.allclose(w[r, o + 1 : o + n], torch.full((n - 1,), 1.0 / (n - 1)))


def test_shared_prompt_batches_are_refused():
    import numpy as np

    batch = PackingCollator(model_free=True, max_length=24)(make_features([4, 5], seed=10))
    p = batch.placements
    batch.placements = type(p)(
        p.feature, p.start, p.row, p.offset, p.length, p.num_features, prev_offset=np.array([-1, 1])
    )
    with pytest.raises(ValueError, match="use padless.sequence_logprobs"):
        step_num_items([batch])


def test_sequence_documents_survive_a_lost_placements_and_match():
    """Trainer rebuilds the batch as type(batch)(mapping): documents then come from position_ids."""
    model = build_model("tiny-llama").eval()
    batch = PackingCollator.for_model(model, max_length=24)(_features(weighted=False))
    plain = dict(batch)
    assert (document_ids(plain) >= 0).all()
    torch.testing.assert_close(target_weights(plain, "sequence"), target_weights(batch, "sequence"))
    assert step_num_items([plain], weighting="sequence") == step_num_items([batch], weighting="sequence")


def test_weights_never_reach_forward_and_choices_are_checked():
    model = build_model("tiny-gpt2").eval()
    batch = PackingCollator.for_model(model, max_length=24, features=_spec("weights"))(_features())
    assert batch["loss_weights"].shape == batch["labels"].shape
    calls = []
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(sorted(kwargs)), with_kwargs=True)
    model_loss(model, batch, step_num_items([batch], weighting="weights"), weighting="weights")
    assert "loss_weights" not in calls[0] and "labels" not in calls[0]
    with pytest.raises(ValueError, match="carries 'loss_weights' but weighting='token'"):
        model_loss(model, batch, 10)
    plain = PackingCollator.for_model(model, max_length=24)(_features(weighted=False))
    with pytest.raises(ValueError, match="needs 'loss_weights' in the batch"):
        step_num_items([plain], weighting="weights")
    with pytest.raises(ValueError, match="unknown weighting 'mean'"):
        model_loss(model, plain, 10, weighting="mean")


@pytest.mark.parametrize(
    "w,match",
    [([1.0, 2.0], r"shape \(2,\), expected one weight per token \(3,\)"), ([1.0, -1.0, 0.0], "non-negative"),
     ([1.0, float("nan"), 0.0], "finite"), (None, "has no 'w'")],
)  # fmt: skip
def test_bad_weights_are_refused(w, match):
    feature = {"input_ids": [1, 2, 3]} | ({"w": w} if w is not None else {})
    with pytest.raises(ValueError, match=match):
        PaddingCollator(features=FeatureSpec(loss_weights="w"))([feature])


def test_separator_weighs_as_the_token_before_it():
    spec = FeatureSpec(loss_weights="w", separator_id=9)
    padded = PaddingCollator(features=spec)(
        [{"input_ids": [1, 2, 3], "w": [0.5, 1.5, 2.5]}, {"input_ids": [4, 9], "w": [1.0, 3.0]}]
    )
    assert padded["loss_weights"].tolist() == [[0.5, 1.5, 2.5, 2.5], [1.0, 3.0, 0.0, 0.0]]
    packed = PackingCollator(model_free=True, max_length=8, features=spec)(
        [{"input_ids": [1, 2, 3], "w": [0.5, 1.5, 2.5]}]
    )
    assert packed["loss_weights"].tolist() == [[0.5, 1.5, 2.5, 2.5]]


# ----------------------------------------------------------------------------- 2 processes, gloo


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world_size, port, out_dir):
    """One rank holds half the features, packed in 2 micro-batches; DDP gradient per mode."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    try:
        model = build_model("tiny-gpt2", seed=0).eval()
        ddp = DistributedDataParallel(model)
        mine = _features()[rank::world_size]  # unequal token and document counts per rank
        out = {}
        for mode in LOSS_WEIGHTINGS:
            collate = PackingCollator.for_model(model, max_length=24, features=_spec(mode))
            fed = _fed(mine, mode)
            micro = [collate(fed[:2]), collate(fed[2:])]
            n = step_num_items(micro, weighting=mode)  # all-reduced over both ranks
            model.zero_grad(set_to_none=True)
            for batch in micro[:-1]:
                with ddp.no_sync():
                    model_loss(ddp, batch, n, world_size=world_size, weighting=mode).backward()
            model_loss(ddp, micro[-1], n, world_size=world_size, weighting=mode).backward()
            out[mode] = _grads(model).clone()
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_per_mode(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    model = build_model("tiny-gpt2", seed=0).eval()
    feats = _features()
    for mode in LOSS_WEIGHTINGS:
        _, ref = _step(model, [PaddingCollator(features=_spec(mode))(_fed(feats, mode))], mode)
        for d in ranks:
            torch.testing.assert_close(d[mode], ref, rtol=1e-5, atol=1e-7, msg=mode)
