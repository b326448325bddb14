"""FSDP2 on packed rows: two ranks under ``torchrun --nproc-per-node 2`` (gloo, CPU, fp32) shard a
tiny model with :func:`padless.models.fsdp.shard_model`, train the first optimiser step of
:class:`padless.DistributedPackedBatchSampler`'s plan (2 micro-batches per rank, gradients kept
local on the first) with the token-normalised loss, and end with the gradients and, after one SGD
step, the whole (unsharded) parameters of one process over both ranks' rows. The
examples/accelerate_loop.py ``--fsdp`` step and PackedTrainer's (each sharded by padless,
and by accelerate's FSDP2 plugin) are held to their padded one-process step the same way.

One ``torchrun`` launch serves every two-rank check of this file and of test_ddp.py (starting two
ranks costs seconds: Python, torch, transformers and TRL imported twice): its worker is this file's
``main`` (``python -m torch.distributed.run --nproc-per-node 2 tests/integrations/test_fsdp.py OUT
PAGE``), which runs the parts of :data:`PARTS` in one process group and saves what each rank saw; the
parent compares. Under pytest-xdist the first worker to need it launches it and the others read its
results (:func:`shared_launch`).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
import integrations_support as support  # noqa: E402
from conftest import make_features  # noqa: E402

LENGTHS = [37, 12, 50, 8, 23, 41, 5, 30, 17, 44, 9, 26, 14, 33, 6, 20, 3, 58, 11, 29]
MAX_LENGTH, ROWS, ACCUM, SEED, LR = 64, 2, 2, 4, 0.5
CASES = {  # name -> (model, attention backend, reshard after forward, LM head on trained tokens only)
    "gpt2-padless": ("tiny-gpt2", "padless", True, True),  # tied embeddings: one root group holds both
    "llama-sdpa": ("tiny-llama", "sdpa", False, False),  # a 4D block mask, grouped-query attention
}


# ----------------------------------------------------------------------------- the torchrun worker


def _loop_step(case: str) -> dict[str, Any]:
    """One optimiser step of a hand-written FSDP2 loop on this rank; what it saw, gathered whole."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.utils.data import DataLoader

    import padless
    from padless.models.fsdp import full_tensors, is_sharded, shard_model, sync_gradients

    name, attn, reshard, only = CASES[case]
    if attn == "padless":
        padless.register_padless_attention()
    model = padless.build_model(name, attn_implementation=attn, seed=0)
    full_numel = sum(p.numel() for p in model.parameters())
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    collator = padless.PackingCollator.for_model(model, max_length=MAX_LENGTH)  # before sharding
    shard_model(model, reshard_after_forward=reshard)
    local_numel = sum(p.to_local().numel() for p in model.parameters() if isinstance(p, DTensor))
    groups = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]  # one per layer, and the root
    sampler = padless.DistributedPackedBatchSampler(LENGTHS, MAX_LENGTH, ROWS, seed=SEED)  # rank from dist
    loader = DataLoader(
        padless.PackedRowView(make_features(LENGTHS, with_labels=True, seed=SEED)),
        batch_sampler=sampler,
        collate_fn=collator,
    )
    batches = iter(loader)
    micro = [next(batches) for _ in range(ACCUM)]
    world = dist.get_world_size()

    held: list[int] = []  # parameters holding a (reduced) gradient after each micro-batch

    def step_grads(num_items: Any, world_size: int) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        for i, batch in enumerate(micro):
            with sync_gradients(model, i == len(micro) - 1):
                padless.model_loss(model, batch, num_items, world_size=world_size, trained_logits_only=only).backward()
            held.append(sum(p.grad is not None for p in model.parameters()))
        return full_tensors(model, grads=True)

    local = padless.step_num_items(micro, all_ranks=False)
    naive = step_grads(local, 1)  # each rank's own mean, then FSDP averages: tokens weighed by rank
    num_items = padless.step_num_items(micro)  # all micro-batches, all ranks
    grads = step_grads(num_items, world)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    optimizer.step()
    return {
        "rank": dist.get_rank(),
        "world": world,
        "keys": list(sampler)[:ACCUM],
        "num_items": int(num_items),
        "local": int(local),
        "grads": grads,
        "naive": naive,
        "params": full_tensors(model),
        "numel": (full_numel, local_numel),
        "sharded": is_sharded(model),
        "held": held,
        "params_count": len(list(model.parameters())),
        "groups": groups,
        "layers": model.config.num_hidden_layers,
        "tied": tied,
        "still_tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
    }


PARTS = ("ddp", "example", "fsdp", "docs", "plugins", "gpu_script")
"""What the shared launch runs, in this order on both ranks: the first step of PackedTrainer, padless'
SFTTrainer and the accelerate loop under DDP (test_ddp.py); examples/accelerate_loop.py's own ``main``;
the FSDP2 steps of :data:`CASES`, the accelerate loop and PackedTrainer sharded by padless; the
docs/integrations/fsdp.md snippet; the two sharded by accelerate's FSDP2 plugin (they switch the
process's accelerate state to FSDP: after every other accelerate user); benchmarks/fsdp.py."""

GPU_SCRIPT_ARGS = ("--device", "cpu", "--max-length", "128", "--steps", "1", "--documents", "120", "--rows", "1")


def _run_script(path: str | Path, *argv: str) -> None:
    """``path`` as ``python path argv...`` would run it, in this process (its process group is ours)."""
    import runpy

    saved = sys.argv
    sys.argv = [str(path), *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"{path} exited with status {exc.code}") from None
    finally:
        sys.argv = saved


def _example() -> None:
    """The example script's own entry point, as ``torchrun examples/accelerate_loop.py`` runs it."""
    status = support._load_example("accelerate_loop").main(
        ["--cpu", "--steps", "2", "--limit", "24", "--max-length", "192"]
    )
    if status:
        raise RuntimeError(f"examples/accelerate_loop.py main returned {status}")


def main(out_dir: str, page: str) -> None:
    """torchrun worker: every part of :data:`PARTS` on this rank; each part's results, printed lines and
    (if it raised) traceback saved to ``OUT/rank{r}.pt``. A part that raises fails the tests that read
    it; the other parts still run."""
    import faulthandler

    import torch
    import torch.distributed as dist

    from padless.models.fsdp import init_distributed

    faulthandler.dump_traceback_later(int(os.environ.get("PADLESS_WORKER_TIMEOUT", "540")), exit=True)  # no hang
    torch.set_num_threads(1)
    device = init_distributed("cpu")
    rank = dist.get_rank()
    # one process group serves every part: accelerate's end_training and benchmarks/fsdp.py end it when
    # they finish, so ending it waits for the last part
    destroy, dist.destroy_process_group = dist.destroy_process_group, lambda group=None: None
    per_rank = -(-support.num_rows(support.examples()) // 2)  # one optimiser step holds every row
    sub = lambda name: os.path.join(out_dir, f"{name}{rank}")  # noqa: E731  a Trainer's output_dir
    parts = {
        "ddp": lambda: {
            "ddp-trainer": support.first_step("trainer-packed", "padless", sub("t"), rows_per_batch=per_rank),
            "ddp-sft": support.first_step("sft-packed", "sdpa", sub("s"), rows_per_batch=per_rank),
            "ddp-accelerate": support.accelerate_first_step("padless", rows_per_batch=1, grad_accum=2),
        },
        "example": _example,
        "fsdp": lambda: {
            **{case: _loop_step(case) for case in CASES},
            "accelerate": support.accelerate_first_step("padless", rows_per_batch=1, grad_accum=2, fsdp=True),
            "trainer": support.first_step("trainer-fsdp", "padless", sub("f"), rows_per_batch=per_rank),
        },
        "docs": lambda: _run_script(page),
        "plugins": lambda: {
            "trainer-plugin": support.first_step("trainer-fsdp-plugin", "padless", sub("p"), rows_per_batch=per_rank),
            "plugin": support.accelerate_first_step("padless", rows_per_batch=1, grad_accum=2, plugin=True),
        },
        "gpu_script": lambda: _run_script(support.ROOT / "benchmarks" / "fsdp.py", *GPU_SCRIPT_ARGS),
    }
    assert tuple(parts) == PARTS
    results: dict[str, Any] = {"device": str(device), "rank": rank, "stdout": {}, "errors": {}}
    for name, run in parts.items():
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                results.update(run() or {})
        except Exception:
            results["errors"][name] = traceback.format_exc()
        results["stdout"][name] = printed.getvalue()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    destroy()


# ----------------------------------------------------------------------------- the parent


_LAUNCHED: dict[str, list[dict[str, Any]]] = {}


def _torchrun(script: Path | str, *args: str, cwd: Path = support.ROOT) -> subprocess.CompletedProcess:
    """``script`` under ``torchrun --nproc-per-node 2`` on this machine's loopback, offline."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": os.pathsep.join([str(support.ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    if "GLOO_SOCKET_IFNAME" not in env and sys.platform == "linux":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # stay on the loopback interface
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def shared_launch(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's results of the one launch of :func:`main` (ranks 0 and 1): once per test session,
    and once per pytest-xdist run (the first worker to take the lock launches, the others read)."""
    if "ranks" in _LAUNCHED:
        return _LAUNCHED["ranks"]
    import torch
    from filelock import FileLock
    from test_docs import DOCS, UNDER_TORCHRUN, code_of

    assert "fsdp.md" in UNDER_TORCHRUN  # its snippet needs a process group: it runs here
    if os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.getbasetemp().parent / "padless-torchrun"  # one folder for the run's workers
        out.mkdir(exist_ok=True)
    else:
        out = tmp_path_factory.mktemp("padless-torchrun")
    failed = out / "failed.txt"
    with FileLock(str(out / "launch.lock")):
        if not failed.exists() and not (out / "rank1.pt").exists():
            page = out / "fsdp_page.py"
            page.write_text(code_of(DOCS / "fsdp.md"))
            done = _torchrun(__file__, str(out), str(page))
            if done.returncode != 0:
                failed.write_text(f"torchrun exited with {done.returncode}:\n{done.stderr[-4000:]}")
    if failed.exists():
        pytest.fail(failed.read_text())
    _LAUNCHED["ranks"] = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return _LAUNCHED["ranks"]


def part(ranks: list[dict[str, Any]], part_name: str, *keys: str) -> Any:
    """``keys`` of each rank's results (a list per key, rank by rank; one key: that list), or the part's
    traceback as the failure."""
    for r in ranks:
        if part_name in r["errors"]:
            pytest.fail(f"part {part_name!r} raised on rank {r['rank']}:\n{r['errors'][part_name]}")
    got = [[r[key] for r in ranks] for key in keys]
    return got[0] if len(keys) == 1 else got


def printed(ranks: list[dict[str, Any]], part_name: str) -> str:
    """What ``part_name`` printed on every rank (rank 0 first), after checking it did not raise."""
    part(ranks, part_name)
    return "".join(r["stdout"][part_name] for r in ranks)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each rank's results of the shared launch."""
    return shared_launch(tmp_path_factory)


def _one_process(case: str) -> dict[str, Any]:
    """The same step in one process: every row both ranks trained, in one micro-batch."""
    import torch

    import padless
    from padless.models.fsdp import full_tensors
    from padless.objectives.loss import trained_tokens
    from padless.planning.schedule import schedule_epoch

    name, attn, _, _ = CASES[case]
    if attn == "padless":
        padless.register_padless_attention()
    sched = schedule_epoch(LENGTHS, MAX_LENGTH, world_size=2, rows_per_batch=ROWS, seed=SEED)
    keys = [sched.rank_batches(r)[:ACCUM] for r in range(2)]
    model = padless.build_model(name, attn_implementation=attn, seed=0)
    view = padless.PackedRowView(make_features(LENGTHS, with_labels=True, seed=SEED))
    rows = [view[key] for rank in keys for micro in rank for key in micro]
    batch = padless.PackingCollator.for_model(model, max_length=MAX_LENGTH)(rows)
    total = trained_tokens(batch["labels"])
    padless.model_loss(model, batch, total).backward()
    grads = full_tensors(model, grads=True)
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return {"keys": keys, "num_items": int(total), "grads": grads, "params": full_tensors(model)}


def _assert_close(got: dict[str, Any], want: dict[str, Any]) -> None:
    import torch

    assert set(got) == set(want)
    scale = max(t.abs().max().item() for t in want.values())
    for name, t in want.items():
        torch.testing.assert_close(got[name], t, rtol=1e-5, atol=1e-6 * scale, msg=name)


def _gap(got: dict[str, Any], want: dict[str, Any]) -> float:
    return max((got[n] - t).abs().max().item() for n, t in want.items())


pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]


@pytest.mark.parametrize("case", list(CASES))
def test_fsdp2_step_on_two_ranks_equals_one_process_over_both_ranks_rows(ranks, case):
    want = _one_process(case)
    got = part(ranks, "fsdp", case)
    assert [(g["rank"], g["world"], g["keys"]) for g in got] == [(0, 2, want["keys"][0]), (1, 2, want["keys"][1])]
    assert got[0]["num_items"] == got[1]["num_items"] == want["num_items"] == got[0]["local"] + got[1]["local"]
    for g in got:
        full, local = g["numel"]
        assert g["sharded"] and full // 2 <= local < full  # each rank holds about half of every parameter
        layers = "transformer.h" if "gpt2" in case else "model.layers"
        assert g["groups"] == ["", *(f"{layers}.{i}" for i in range(g["layers"]))]
        _assert_close(g["grads"], want["grads"])  # the reduce-scattered shards, gathered: one process's gradient
        _assert_close(g["params"], want["params"])  # after one SGD step on the shards
    assert got[0]["numel"][1] + got[1]["numel"][1] == got[0]["numel"][0]
    assert all(g["tied"] == g["still_tied"] == (case == "gpt2-padless") for g in got)  # sharding keeps a tie
    # gradients stay local (nothing reduce-scattered) until the last micro-batch of the step
    assert all(g["held"] == [0, g["params_count"]] * 2 for g in got)
    # negative control: each rank's own mean is another gradient (the ranks hold different token counts)
    assert got[0]["local"] != got[1]["local"]
    scale = max(t.abs().max().item() for t in want["grads"].values())
    assert _gap(got[0]["naive"], want["grads"]) > 1e-2 * scale
    print(
        f"\n{case}: max |grad - one process| / max |grad|: FSDP2 {max(_gap(g['grads'], want['grads']) for g in got) / scale:.1e}, "
        f"per-rank mean {_gap(got[0]['naive'], want['grads']) / scale:.1e}; params after SGD "
        f"{max(_gap(g['params'], want['params']) for g in got):.1e}"
    )


@pytest.mark.parametrize("sharder", ["accelerate", "plugin"])
def test_accelerate_example_with_fsdp_equals_one_padded_process(ranks, sharder):
    """examples/accelerate_loop.py sharded by ``train(..., fsdp=True)`` (padless.models.fsdp.shard_model) or by
    accelerate's FSDP2 plugin in ``prepare``: step 1 of 2 micro-batches x 1 row per rank equals one
    process padding exactly those 4 rows' examples."""
    from test_transformers import assert_same_step

    want = support.padded_accelerate_step(world_size=2, micro_batches=2)
    got = part(ranks, "fsdp" if sharder == "accelerate" else "plugins", sharder)
    assert want["examples"] < want["of"] or want["all_rows"]
    assert got[0]["loss"] == got[1]["loss"]  # reduced over the ranks
    for g in got:
        assert g["sharded"]
        assert_same_step(g, want)


@pytest.mark.parametrize("sharder", ["trainer", "trainer-plugin"])
def test_packed_trainer_under_fsdp2_equals_one_padded_process(ranks, sharder, tmp_path):
    """PackedTrainer on a model sharded by padless.models.fsdp.shard_model, or by accelerate's FSDP2 plugin from
    ``TrainingArguments(fsdp=True, fsdp_config={"version": 2})``: one optimiser step over every packed
    row (half per rank) equals Trainer padding all the examples in one process."""
    from test_transformers import assert_same_step

    want = support.first_step("trainer-padded", "sdpa", str(tmp_path))
    got = part(ranks, "fsdp" if sharder == "trainer" else "plugins", sharder)
    assert [(g["rank"], g["world"], g["micro_batches"]) for g in got] == [(0, 2, 1), (1, 2, 1)]
    assert got[0]["num_items"] == got[1]["num_items"]  # all-reduced over the ranks
    for g in got:
        assert g["sharded"]
        assert_same_step({**g, "loss": sum(x["loss"] for x in got) / 2}, want)  # the ranks' losses average to it


def test_the_docs_page_snippet_runs_on_two_ranks(ranks):
    """docs/integrations/fsdp.md's python block, as one script in the shared launch
    (tests/integrations/test_docs.py runs the other pages in-process)."""
    import re

    out = printed(ranks, "docs")
    assert len(re.findall(r"^step 2: \d+ trained tokens$", out, flags=re.M)) == 1, out[-2000:]  # rank 0 prints


def test_the_gpu_script_checks_and_trains_on_two_cpu_ranks(ranks):
    """benchmarks/fsdp.py (the FSDP step of benchmarks/gpu.sh) on gloo: its exactness check passes
    and its timed run trains; so the script cannot rot before a GPU runs it."""
    import re

    out = printed(ranks, "gpu_script")
    gap = re.search(r"^fsdp exactness \(fp32\): max \|grad - one process\| / max \|grad\| = (\S+) ", out, flags=re.M)
    assert gap and float(gap.group(1)) < 1e-5, out[-2000:]
    assert re.search(r"^fsdp: 2 rank\(s\) on cpu \(gloo\)", out, flags=re.M)
    assert re.search(r"^fsdp training \(auto\): median step \S+ s, [\d,]+ real tokens/s", out, flags=re.M), out[-2000:]


# ----------------------------------------------------------------------------- one process


@pytest.fixture
def one_rank():
    """A gloo process group of one rank in this process, torn down after the test."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_one_sharded_rank_trains_like_the_model_itself(one_rank):
    """World size 1: the sharded model's loss and gradients are the plain model's (same batch)."""
    import torch

    import padless
    from padless.models.fsdp import full_tensors, is_sharded, shard_model
    from padless.objectives.loss import trained_tokens

    plain, sharded = (padless.build_model("tiny-llama", seed=0) for _ in range(2))
    batch = padless.PackingCollator.for_model(plain, max_length=MAX_LENGTH)(make_features([20, 31, 9, 44], seed=1))
    shard_model(sharded)
    assert is_sharded(sharded) and not is_sharded(plain)
    after = padless.PackingCollator.for_model(sharded, max_length=MAX_LENGTH)(make_features([20, 31, 9, 44], seed=1))
    same = [torch.equal(v, batch[k]) if torch.is_tensor(v) else v == batch[k] for k, v in after.items()]
    assert set(after) == set(batch) and all(same)  # sharding keeps what the exactness rule reads
    n = trained_tokens(batch["labels"])
    losses = [padless.model_loss(m, batch, n) for m in (plain, sharded)]
    for loss in losses:
        loss.backward()
    assert losses[0].item() == pytest.approx(losses[1].item(), rel=1e-6)
    _assert_close(full_tensors(sharded, grads=True), full_tensors(plain, grads=True))
    assert set(full_tensors(sharded)) == {n for n, _ in plain.named_parameters()}
    with pytest.raises(ValueError, match="sharded already"):
        shard_model(sharded)
    with pytest.raises(ValueError, match="no decoder layers in Sequential"):
        shard_model(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="on the CPU already: leave cpu_offload off"):
        shard_model(padless.build_model("tiny-gpt2", seed=0), cpu_offload=True)
    split = padless.build_model("tiny-llama", seed=0)
    split.lm_head.to("meta")
    with pytest.raises(ValueError, match=r"every parameter on one device, found \['cpu', 'meta'\]"):
        shard_model(split)


@pytest.mark.parametrize("attn", ["sdpa", "padless"])
def test_mixed_precision_computes_in_bfloat16_over_float32_shards(one_rank, attn):
    """``param_dtype=bfloat16, reduce_dtype=float32``: the forward runs in bf16 (the loss moves off the
    fp32 one, by bf16 rounding only), the shards and their gradients stay fp32; a collator built on the
    fp32 model serves the bf16 compute."""
    import torch

    import padless
    from padless.models.fsdp import compute_dtype, full_tensors, shard_model
    from padless.objectives.loss import trained_tokens

    padless.register_padless_attention()
    plain, sharded = (padless.build_model("tiny-llama", attn_implementation=attn, seed=0) for _ in range(2))
    batch = padless.PackingCollator.for_model(plain, max_length=MAX_LENGTH)(make_features([20, 31, 9, 44], seed=1))
    shard_model(sharded, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert (compute_dtype(sharded), compute_dtype(plain), sharded.dtype) == (torch.bfloat16, None, torch.float32)
    n = trained_tokens(batch["labels"])
    full, half = padless.model_loss(plain, batch, n), padless.model_loss(sharded, batch, n)
    half.backward()
    assert half.item() != full.item() and half.item() == pytest.approx(full.item(), rel=1e-2)
    grads = full_tensors(sharded, grads=True)
    assert {g.dtype for g in grads.values()} == {p.dtype for p in full_tensors(sharded).values()} == {torch.float32}
    assert set(grads) == {name for name, _ in plain.named_parameters()}


def test_packed_trainer_judges_a_sharded_model_in_its_compute_dtype(one_rank, monkeypatch, tmp_path):
    """A model sharded with bf16 mixed precision (fp32 shards) is judged in bf16, what it computes in."""
    import torch
    from transformers import TrainingArguments

    from padless.integrations import transformers as integration
    from padless.models.fsdp import shard_model

    seen = []
    real = integration.exact_collator
    monkeypatch.setattr(integration, "exact_collator", lambda *a, **kw: seen.append(kw["dtype"]) or real(*a, **kw))
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, save_strategy="no")
    for param_dtype in (torch.bfloat16, None):
        model = shard_model(support.model("sdpa"), param_dtype=param_dtype)
        integration.PackedTrainer(model=model, args=args, max_length=support.MAX_LENGTH)
    assert seen == [torch.bfloat16, None]  # None: the model's own dtype


def test_without_torchrun_nothing_is_joined_and_sharding_is_refused(monkeypatch):
    import torch
    import torch.distributed as dist

    import padless
    from padless.models.fsdp import init_distributed, shard_model

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed("cpu") == torch.device("cpu") and not dist.is_initialized()
    with pytest.raises(ValueError, match="launch with torchrun and call padless.models.fsdp.init_distributed"):
        shard_model(padless.build_model("tiny-gpt2", seed=0))
    with pytest.raises(ValueError, match="torch.nn.Module"):
        shard_model("gpt2")


def test_packed_trainer_refuses_a_sharded_model_where_transformers_has_no_path_for_it():
    from padless.integrations.transformers import owns_its_sharding

    class OldModel:  # a model class without is_distributed_loading_by_transformers (transformers < 5.x)
        pass

    with pytest.raises(ValueError, match="pass the unsharded model and TrainingArguments"):
        owns_its_sharding(OldModel())
    model = support.model("sdpa")
    owns_its_sharding(model)
    assert model.is_distributed_loading_by_transformers


@pytest.mark.parametrize(
    "device,local_rank,gpus,want",
    [
        ("auto", "1", 2, "cuda:1"),  # one process per GPU: cuda:LOCAL_RANK
        ("cuda", "3", 1, "cuda:0"),  # the launcher binds one visible GPU per process
        ("cuda:1", "0", 2, "cuda:1"),  # named: as named
        ("auto", "1", 0, "cpu"),  # no GPU: gloo on the CPU
    ],
)
def test_each_rank_takes_its_gpu_and_nccl_on_cuda(monkeypatch, device, local_rank, gpus, want):
    """The CUDA path without a GPU: torch.cuda and init_process_group stand-ins record what would run."""
    import torch
    import torch.distributed as dist

    from padless.models.fsdp import init_distributed

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: calls.append(("init", backend)))
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert str(init_distributed(device)) == want
    on_gpu = want.startswith("cuda")
    assert calls == [("set_device", want)] * on_gpu + [("init", "nccl" if on_gpu else "gloo")]  # device first
    with pytest.raises(ValueError, match="this machine has 2 CUDA device"):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        init_distributed("cuda:2")


def test_sync_gradients_keeps_ddp_gradients_local_and_leaves_a_plain_model_alone():
    from padless.models.fsdp import sync_gradients

    calls = []

    class Wrapper:  # what DistributedDataParallel offers
        def no_sync(self):
            calls.append("no_sync")
            return contextlib.nullcontext()

    with sync_gradients(Wrapper(), False):
        pass
    with sync_gradients(Wrapper(), True):
        pass
    with sync_gradients(object(), False):
        pass
    assert calls == ["no_sync"]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
