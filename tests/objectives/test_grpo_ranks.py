"""grpo_loss on 2 gloo ranks (CPU): each rank trains half the rollouts of a generation batch in 2
accumulated micro-batches; the gradients all-reduced to their mean (as DDP averages them) equal TRL's
with the normalisation TRL applies for 2 processes (its ``_compute_loss`` on each rank's micro-batches,
in one process), for dapo, grpo and bnpo. One launch checks every loss type (starting processes is the
slow part; DistributedDataParallel itself would add seconds per rank and nothing to what is checked)."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from padless.objectives.grpo import grpo_loss

LOSS_TYPES = ("dapo", "grpo", "bnpo")
WORLD, MICRO = 2, 2
LENGTHS = (8, 3, 6, 0, 5, 8, 2, 7, 4, 1, 8, 6)
"""12 rollouts: rank ``r`` holds ``r::2`` (33 and 25 trained tokens), split into 2 micro-batches of 3."""
H, V = 8, 16


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _policy():
    torch.manual_seed(0)
    return torch.nn.Linear(H, V, bias=False)


def _data():
    """Features, tokens, masks, advantages and old / reference log-probs of the 12 rollouts (the same on
    every rank): the policy's per-token log-prob is ``log_softmax(x @ W.T)[token]``."""
    g = torch.Generator().manual_seed(3)
    B, T = len(LENGTHS), max(LENGTHS)
    x = torch.randn(B, T, H, generator=g)
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).int()
    with torch.no_grad():
        now = _logps(_policy(), x, tokens)
    old = now + 0.5 * torch.randn(B, T, generator=g)
    ref = now + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    return x, tokens, mask, adv, old, ref


def _logps(model, x, tokens):
    return model(x).log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)  # [B, T]


def _micro_batches(rank):
    rows = torch.arange(rank, len(LENGTHS), WORLD)
    return [rows[i::MICRO] for i in range(MICRO)]


def _worker(rank, world_size, port, out_dir):
    from datetime import timedelta

    import torch.distributed as dist

    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on the loopback interface
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    try:
        model = _policy()
        x, tokens, mask, adv, old, ref = _data()
        parts = _micro_batches(rank)
        num_items = mask[torch.cat(parts)].sum()  # TRL: accelerator.gather(loss_mask.sum()).sum()
        dist.all_reduce(num_items)
        out = {"num_items": int(num_items)}
        for loss_type in LOSS_TYPES:
            model.zero_grad(set_to_none=True)
            for rows in parts:  # accumulated locally
                result = grpo_loss(
                    _logps(model, x[rows], tokens[rows]),
                    adv[rows],
                    mask[rows],
                    old_per_token_logps=old[rows],
                    ref_per_token_logps=ref[rows],
                    loss_type=loss_type,
                    beta=0.04,
                    epsilon_high=0.28,
                    num_items_in_batch=num_items,
                    num_processes=world_size,
                    gradient_accumulation_steps=MICRO,
                )
                result.loss.backward()
            grad = model.weight.grad.detach().clone()
            dist.all_reduce(grad)  # what DDP does at the step's last backward: the mean over ranks
            out[loss_type] = grad / world_size
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _trl_grad(trainer_cls, args, parts, *, num_processes, num_items):
    """TRL's gradient of the micro-batches ``parts`` (summed), each through its own ``_compute_loss``."""
    from test_grpo import _stand_in

    x, tokens, mask, adv, old, ref = _data()
    model = _policy()
    for rows in parts:
        s = _stand_in(
            trainer_cls, args, _logps(model, x[rows], tokens[rows]), grad_accum=len(parts), num_processes=num_processes
        )
        n = rows.numel()
        inputs = {"prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
                  "completion_ids": tokens[rows], "completion_mask": mask[rows], "advantages": adv[rows],
                  "old_per_token_logps": old[rows], "ref_per_token_logps": ref[rows], "num_items_in_batch": num_items}  # fmt: skip
        trainer_cls._compute_loss(s, None, inputs).backward()
    return model.weight.grad.detach().clone()


@pytest.mark.slow
def test_two_gloo_ranks_equal_trls_two_process_normalisation(tmp_path):
    import torch.multiprocessing as mp

    pytest.importorskip("trl")
    procs = mp.start_processes(
        _worker, args=(WORLD, _free_port(), str(tmp_path)), nprocs=WORLD, join=False, start_method="spawn"
    )
    from test_grpo import _trl_args  # imported while the ranks start
    from trl.trainer.grpo_trainer import GRPOTrainer

    while not procs.join():
        pass
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    _, _, mask, *_ = _data()
    counts = [int(mask[torch.cat(_micro_batches(r))].sum()) for r in range(WORLD)]
    assert counts[0] != counts[1] and ranks[0]["num_items"] == ranks[1]["num_items"] == sum(counts)
    num_items = mask.sum()
    for loss_type in LOSS_TYPES:
        args = _trl_args(loss_type, beta=0.04, epsilon_high=0.28, steps_per_generation=MICRO)
        # TRL on 2 processes: each rank's micro-batches with num_processes=2; DDP averages the ranks
        want = (
            sum(
                _trl_grad(GRPOTrainer, args, _micro_batches(r), num_processes=WORLD, num_items=num_items)
                for r in range(WORLD)
            )
            / WORLD
        )
        scale = want.abs().max().item()
        assert scale > 0
        for r in ranks:  # the same averaged gradient on both ranks
            torch.testing.assert_close(r[loss_type], want, rtol=1e-5, atol=1e-6 * scale, msg=loss_type)
        # one process, all 12 rollouts in one micro-batch: the same step for dapo and grpo (the token
        # and per-rollout means survive the split); bnpo's token mean is per micro-batch, so it differs
        one = _trl_grad(
            GRPOTrainer,
            _trl_args(loss_type, beta=0.04, epsilon_high=0.28),
            [torch.arange(len(LENGTHS))],
            num_processes=1,
            num_items=num_items,
        )
        gap = (one - want).abs().max().item()
        if loss_type == "bnpo":
            assert gap > 1e-3 * scale, gap
        else:
            torch.testing.assert_close(one, want, rtol=1e-5, atol=1e-6 * scale, msg=f"{loss_type}: 2 ranks vs 1")
