"""``PackedTrainer(context_parallel=cp)`` and padless' ``SFTTrainer(context_parallel=cp)`` under ``torchrun``
(gloo, CPU, fp32) train 3 optimiser steps to the parameters one process reaches on the same packed rows
(rel 1e-5): 2 ranks as one cp = 2 group; 4 ranks as one cp = 4 group, as two cp = 2 groups (data
parallel x context parallel), both layouts, and under FSDP2 (the model sharded over all 4 ranks).

Each launch's worker is this file's ``main`` (``python -m torch.distributed.run --nproc-per-node N
tests/integrations/test_trainer_context.py OUT N``): it runs every case of :data:`CASES` for its world
size and saves, per rank, the whole rows of every micro-step (before the split) and the final
parameters; the parent replays those rows in one process (padless attention, the token-normalised
loss over each step's rows of every replica, SGD) and compares. The controls run the same way and must
miss: the loss normalised per rank, and rows dealt to all ranks as if cp were data parallel.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
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

LENGTHS = [37, 12, 50, 8, 23, 41, 5, 30, 17, 44, 9, 26, 14, 33, 6, 20, 3, 58, 11, 29, 40, 7, 19, 25]
MAX_LENGTH, ROWS, ACCUM, SEED, LR, STEPS = 64, 1, 2, 4, 0.5, 3
HYBRID = "qwen3.5-hybrid"
"""A tiny Qwen3.5 text model: a gated DeltaNet layer (4 value heads over 2 key heads), then attention."""
CASES: dict[int, dict[str, dict[str, Any]]] = {  # world size -> case -> how it trains
    2: {
        "cp2": dict(cp=2, layout="auto"),
        "cp2-sft": dict(cp=2, layout="contiguous", sft=True, model="gpt2-2layer"),  # the GPT-2 tokenizer's model
        "cp2-per-rank-loss": dict(cp=2, layout="contiguous", fault="per rank"),
        "cp2-hybrid": dict(cp=2, layout="auto", model=HYBRID),  # gated DeltaNet layers run head-parallel
    },
    4: {
        "cp4": dict(cp=4, layout="contiguous"),
        "cp4-striped": dict(cp=4, layout="striped"),
        "dp2xcp2": dict(cp=2, layout="zigzag"),
        "dp2xcp2-fsdp": dict(cp=2, layout="contiguous", fsdp=True),
        "dp2xcp2-rows-per-rank": dict(cp=2, layout="contiguous", fault="rows per rank"),  # must be refused
    },
}


# ----------------------------------------------------------------------------- the torchrun worker


def _build(name: str, attn: str) -> Any:
    """``padless.build_model(name)``, or the tiny hybrid :data:`HYBRID` (seeded the same way)."""
    import torch

    import padless

    if name != HYBRID:
        return padless.build_model(name, attn_implementation=attn, seed=0)
    import transformers as T

    config = T.Qwen3_5TextConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], head_dim=8,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def _features() -> list[dict[str, Any]]:
    return make_features(LENGTHS, vocab_size=256, with_labels=True, seed=SEED)


def _args(out_dir: str, **extra: Any) -> dict[str, Any]:
    return dict(
        output_dir=out_dir, max_steps=STEPS, per_device_train_batch_size=ROWS, gradient_accumulation_steps=ACCUM,
        learning_rate=LR, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
        report_to="none", save_strategy="no", use_cpu=True, dataloader_pin_memory=False, disable_tqdm=True,
        seed=0, ddp_find_unused_parameters=False, logging_steps=1, **extra,
    )  # fmt: skip


def _train(case: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """One case on this rank: the rows of every micro-step and the parameters after :data:`STEPS` steps."""
    import torch
    import torch.distributed as dist

    from padless.integrations import trainer_context
    from padless.models.fsdp import full_tensors, shard_model

    model = _build(case.get("model", "tiny-llama"), "sdpa")
    if case.get("fsdp"):
        shard_model(model)
    cp = case["cp"]
    from padless.integrations import transformers as packed_trainer

    saved = trainer_context.context_loss, packed_trainer.data_parallel_place
    if case.get("fault") == "per rank":  # each rank normalised by its own micro-batch's trained tokens

        def per_rank(trainer, ctx, model, inputs, num_items_in_batch):
            loss = saved[0](trainer, ctx, model, inputs, num_items_in_batch)
            return loss * (num_items_in_batch / ctx.cp) / float((inputs["labels"][:, 1:] != -100).sum())

        trainer_context.context_loss = per_rank
    elif case.get("fault") == "rows per rank":  # the plan dealt to every process, as data parallel would
        packed_trainer.data_parallel_place = lambda ctx, args: (int(args.world_size), int(args.process_index))
    try:
        if case.get("sft"):
            from trl import SFTConfig

            from padless.integrations.trl import SFTTrainer

            support.offline_hub()
            args = SFTConfig(**_args(out_dir), packing=True, bf16=False, max_length=MAX_LENGTH)
            trainer = SFTTrainer(
                model=model, args=args, train_dataset=support.dataset(_features()),
                processing_class=support.tokenizer(), context_parallel=cp, context_layout=case["layout"],
            )  # fmt: skip
        else:
            from transformers import TrainingArguments

            from padless.integrations.transformers import PackedTrainer

            trainer = PackedTrainer(
                model=model, args=TrainingArguments(**_args(out_dir)), train_dataset=_features(),
                max_length=MAX_LENGTH, context_parallel=cp, context_layout=case["layout"],
            )  # fmt: skip
        rows: list[dict[str, Any]] = []
        step = trainer.training_step

        def record(model, inputs, num_items_in_batch=None):
            rows.append({k: inputs[k].detach().cpu().clone() for k in ("input_ids", "labels", "position_ids")})
            rows[-1]["num_items"] = float(num_items_in_batch)
            rows[-1]["step"] = trainer.state.global_step  # the optimiser step this micro-batch belongs to
            return step(model, inputs, num_items_in_batch)

        trainer.training_step = record
        said = io.StringIO()
        handler = logging.StreamHandler(said)
        from padless.integrations.trainer_boundary import logger

        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            trainer.train()
        finally:
            logger.removeHandler(handler)
        params = full_tensors(trainer.model)
        dist.barrier()
        return {
            "rows": rows, "params": {k: v.detach().cpu() for k, v in params.items()}, "said": said.getvalue(),
            "backend": trainer.model.config._attn_implementation, "layout": trainer.padless_context.layout,
            "loss": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "dtype": str(next(iter(params.values())).dtype).removeprefix("torch."), "torch": torch.__version__,
        }  # fmt: skip
    finally:
        trainer_context.context_loss, packed_trainer.data_parallel_place = saved


def _trainer_snippet() -> str:
    page = support.ROOT / "docs" / "context-parallel.md"
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)[1]  # the trainers' section


def main(out_dir: str, world: str) -> None:
    """torchrun worker: every case of ``CASES[world]`` on this rank, saved to ``OUT/rank{r}.pt``; a case that
    raises saves its traceback (the tests reading it fail with it)."""
    import faulthandler

    import torch
    import torch.distributed as dist

    from padless.models.fsdp import init_distributed

    faulthandler.dump_traceback_later(int(os.environ.get("PADLESS_WORKER_TIMEOUT", "540")), exit=True)
    torch.set_num_threads(1)
    init_distributed("cpu")
    rank = dist.get_rank()
    results: dict[str, Any] = {"rank": rank, "errors": {}}
    if int(world) == 2:  # the docs page's trainer snippet, as torchrun --nproc-per-node 2 runs it
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.chdir(out_dir):
                exec(compile(_trainer_snippet(), "docs/context-parallel.md", "exec"), {"__name__": "__main__"})
        except Exception:
            results["errors"]["docs"] = traceback.format_exc()
            dist.barrier()
        results["docs"] = printed.getvalue()
    for name, case in CASES[int(world)].items():
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                results[name] = _train(case, os.path.join(out_dir, f"{name}-{rank}"))
        except Exception:
            results["errors"][name] = traceback.format_exc()
            Path(out_dir, f"error-{name}-{rank}.txt").write_text(results["errors"][name])  # read if the others hang
            dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent


def _launch(world: int, out: Path) -> list[dict[str, Any]]:
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": os.pathsep.join([str(support.ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip
    if "GLOO_SOCKET_IFNAME" not in env and sys.platform == "linux":
        env["GLOO_SOCKET_IFNAME"] = "lo"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), __file__]
    done = subprocess.run([*cmd, str(out), str(world)], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        pytest.fail(f"torchrun --nproc-per-node {world} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    import torch

    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def launch(request, tmp_path_factory) -> tuple[int, list[dict[str, Any]]]:
    return request.param, _launch(request.param, tmp_path_factory.mktemp(f"cp{request.param}"))


def _case(ranks: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    for r in ranks:
        if name in r["errors"]:
            pytest.fail(f"case {name!r} raised on rank {r['rank']}:\n{r['errors'][name]}")
    return [r[name] for r in ranks]


def _one_process(got: list[dict[str, Any]], cp: int, name: str = "tiny-llama") -> dict[str, Any]:
    """The same steps in one process: each step's micro-batches of every replica (rank ``d * cp`` of each),
    the loss summed over their trained tokens and divided by the step's count, SGD."""
    import torch

    import padless
    from padless.attention.mixers import enable_per_document_mixers
    from padless.objectives.loss import _ce_sum, trained_tokens

    padless.register_padless_attention()
    model = _build(name, "padless")
    enable_per_document_mixers(model)  # a hybrid's mixers read the rows' documents
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    replicas = [got[d]["rows"] for d in range(0, len(got), cp)]
    for step in range(STEPS):
        batches = [b for rows in replicas for b in rows if b["step"] == step]  # the epoch's last step may be short
        total = sum(int(trained_tokens(b["labels"])) for b in batches)
        assert all(b["num_items"] == total * cp for b in batches), "Trainer's count: every rank's rows, cp times each"
        optimizer.zero_grad()
        for b in batches:
            logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits
            (_ce_sum(logits[:, :-1], _shifted(b)) / total).backward()
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def _shifted(batch: dict[str, Any]) -> Any:
    """The next token's label inside its document (a document's first label is already -100)."""
    return batch["labels"][:, 1:]


def _relative_gap(got: dict[str, Any], want: dict[str, Any]) -> float:
    assert set(got) == set(want)
    return max(float((got[n] - w).abs().max() / w.abs().max()) for n, w in want.items())


pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]


@pytest.mark.parametrize("name", sorted({n for cases in CASES.values() for n, c in cases.items() if "fault" not in c}))
def test_three_steps_reach_the_one_process_parameters(launch, name: str) -> None:
    world, ranks = launch
    if name not in CASES[world]:
        pytest.skip(f"{name} runs on {len([w for w in CASES if name in CASES[w]])} other launch")
    case = CASES[world][name]
    got = _case(ranks, name)
    cp = case["cp"]
    for d in range(world // cp):  # every rank of a cp group trained the same rows
        group = got[d * cp : (d + 1) * cp]
        assert {b["step"] for b in group[0]["rows"]} == set(range(STEPS))
        for g in group[1:]:
            assert all(a["input_ids"].equal(b["input_ids"]) for a, b in zip(g["rows"], group[0]["rows"]))
    if world // cp > 1:  # replicas trained different rows
        assert not got[0]["rows"][0]["input_ids"].equal(got[cp]["rows"][0]["input_ids"])
    want = _one_process(got, cp, case.get("model", "tiny-llama"))
    for g in got:
        assert g["backend"] == "padless_cp" and g["dtype"] == "float32"
        assert _relative_gap(g["params"], want) < 1e-5
    assert case["layout"] == "auto" or got[0]["layout"] == case["layout"]


def test_ranks_of_a_cp_group_holding_different_rows_are_refused(launch) -> None:
    """Rows dealt to every process (as plain data parallel deals them): the first step stops on every rank,
    naming the mismatch, instead of gathering keys of different rows."""
    world, ranks = launch
    if world != 4:
        pytest.skip("the other launch")
    for r in ranks:
        assert "the ranks of a cp group hold different rows" in r["errors"].get("dp2xcp2-rows-per-rank", ""), r[
            "errors"
        ]


@pytest.mark.parametrize("name", ["cp2-per-rank-loss"])
def test_controls_miss_the_one_process_parameters(launch, name: str) -> None:
    world, ranks = launch
    if name not in CASES[world]:
        pytest.skip("the other launch")
    got = _case(ranks, name)
    want = _one_process(got, CASES[world][name]["cp"])
    assert _relative_gap(got[0]["params"], want) > 1e-3


def test_the_start_line_names_context_parallel_and_the_balance(launch) -> None:
    world, ranks = launch
    name = "cp2" if world == 2 else "dp2xcp2"
    said = _case(ranks, name)[0]["said"]
    dp, cp = world // CASES[world][name]["cp"], CASES[world][name]["cp"]
    assert f"context parallel {dp} x {cp} ranks (data x context)" in said, said
    assert "attention padless_cp" in said and "max/mean shard attention work" in said, said
    if world == 2:  # the hybrid says how its token mixers run
        said = _case(ranks, "cp2-hybrid")[0]["said"]
        assert "token mixers head-parallel (gated_deltanet: all-to-all over each cp group)" in said, said


def test_the_docs_trainer_snippet_trains_on_two_ranks(launch) -> None:
    world, ranks = launch
    if world != 2:
        pytest.skip("the snippet runs under torchrun --nproc-per-node 2")
    out = _case(ranks, "docs")[0]
    assert re.search(r"^trained 2 steps on padless_cp: loss \d+\.\d+$", out, flags=re.M), out


if __name__ == "__main__":
    main(*sys.argv[1:])


# ----------------------------------------------------------------------------- refusals, one process


def test_context_parallel_without_a_process_group_is_refused_naming_the_launch(tmp_path) -> None:
    from transformers import TrainingArguments

    import padless
    from padless.integrations.transformers import PackedTrainer

    model = padless.build_model("tiny-llama", seed=0)
    args = TrainingArguments(**{**_args(str(tmp_path)), "max_steps": 1})
    with pytest.raises(
        ValueError,
        match=r"PackedTrainer\(context_parallel=2\) splits each row over 2 ranks .* `torchrun --nproc-per-node 2`",
    ):
        PackedTrainer(model=model, args=args, train_dataset=_features(), max_length=MAX_LENGTH, context_parallel=2)
    with pytest.raises(
        ValueError,
        match=r"PackedTrainer\(context_layout=...\) must be one of auto, contiguous, zigzag, striped, got 'ring'",
    ):
        PackedTrainer(model=model, args=args, train_dataset=_features(), max_length=MAX_LENGTH, context_layout="ring")
    with pytest.raises(ValueError, match=r"PackedTrainer\(context_parallel=...\) must be an integer >= 1, got 0"):
        PackedTrainer(model=model, args=args, train_dataset=_features(), max_length=MAX_LENGTH, context_parallel=0)


def test_a_batch_the_split_cannot_cut_is_refused_by_its_keys() -> None:
    import torch

    from padless.integrations.trainer_context import ContextGroups, context_loss

    ctx = ContextGroups(cp=2, dp=1, cp_rank=0, dp_rank=0, world=2, group=None, layout="contiguous")
    batch = {k: torch.zeros(1, 8, dtype=torch.long) for k in ("input_ids", "labels", "position_ids")}
    with pytest.raises(ValueError, match="carries pixel_values, token_type_ids, which the split"):
        context_loss(None, ctx, None, {**batch, "pixel_values": torch.zeros(1), "token_type_ids": batch["labels"]}, 4)
    with pytest.raises(ValueError, match="average_tokens_across_devices=True"):
        context_loss(None, ctx, None, batch, None)
    with pytest.raises(ValueError, match="has no position_ids"):
        context_loss(None, ctx, None, {k: batch[k] for k in ("input_ids", "labels")}, 4)


def test_a_model_context_parallelism_cannot_make_exact_is_refused_by_name() -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from padless.integrations.trainer_context import ContextGroups, prepare_model

    ctx = ContextGroups(cp=2, dp=1, cp_rank=0, dp_rank=0, world=2, group=None, layout="contiguous")
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, attn_logit_softcapping=50.0)  # fmt: skip
    with pytest.raises(ValueError, match="context_parallel=2: model: context_parallel refused: .*soft-capping"):
        prepare_model(Gemma2ForCausalLM(config), ctx)


def test_the_layout_is_chosen_from_rows_packed_beforehand_as_a_list_or_a_dataset() -> None:
    from datasets import Dataset

    from padless.integrations.trainer_context import ContextGroups, resolve_layout

    ctx = ContextGroups(cp=2, dp=1, cp_rank=0, dp_rank=0, world=2, group=None, layout="auto")
    rows = [{"input_ids": [1] * 30, "seq_lengths": [10, 20]}, {"input_ids": [1] * 64, "seq_lengths": [64]}]
    said = [resolve_layout(ctx, d, None, 64)[1] for d in (rows, Dataset.from_list(rows))]
    assert said[0] == said[1] and "mean of 2 rows" in said[0], said
    chosen = resolve_layout(ctx, rows, None, 64)[0].layout
    assert chosen != "contiguous"  # one 64-token document: contiguous halves carry 1 : 3 of its work
