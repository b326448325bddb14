"""How often padless' attention reads device tensors on the host in one forward (each would be a
device sync on a GPU: ``.cpu()``, ``.item()``, ``.tolist()``, ``bool()``, ``nonzero``, ``torch.equal``).

Counted by wrapping those calls and keeping the ones made from padless modules; a CPU run counts the
calls, not their cost (there is no GPU queue to drain here). A tiny Llama on the padless backend, one
packed batch, ``cu_seq_lens_k`` a tensor of its own as after a device move; as collated, then moved
with :func:`padless.batching.batch.batch_to` (which remembers the collator's host copies)::

    PYTHONPATH=src .venv/bin/python benchmarks/host_syncs.py            # 4 layers
    PYTHONPATH=src .venv/bin/python benchmarks/host_syncs.py --layers 12
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch

from padless.attention.backend import register_padless_attention
from padless.batching.batch import batch_to, forward_inputs
from padless.batching.collate import PackingCollator
from padless.models.factory import tiny_config

CALLS: Counter[str] = Counter()


def _counted(name, original):
    def call(*args, **kwargs):
        module = sys._getframe(1).f_globals.get("__name__", "")
        if module.startswith("padless."):
            CALLS[f"{module}: {name}"] += 1
        return original(*args, **kwargs)

    return call


def main() -> None:
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    for name in ("cpu", "item", "tolist", "__bool__", "nonzero"):
        setattr(torch.Tensor, name, _counted(name, getattr(torch.Tensor, name)))
    for name in ("equal", "nonzero"):
        setattr(torch, name, _counted(f"torch.{name}", getattr(torch, name)))
    config = tiny_config("llama")
    config.num_hidden_layers = args.layers
    model = AutoModelForCausalLM.from_config(config, attn_implementation=register_padless_attention())
    features = [{"input_ids": list(range(1, n + 1))} for n in (7, 3, 12, 5, 9, 1, 4)]
    collate = PackingCollator.for_model(model, max_length=16)

    def collated():
        batch = collate(features)
        batch["cu_seq_lens_k"] = batch["cu_seq_lens_k"].clone()  # two tensors, as after a device move
        return batch

    for label, batch in (("as collated", collated()), ("after batch_to", batch_to(collated(), "cpu"))):
        CALLS.clear()
        with torch.no_grad():
            model(**forward_inputs(batch))
        print(f"{label}: {sum(CALLS.values())} host reads in one forward of {args.layers} layers  {dict(CALLS)}")


if __name__ == "__main__":
    main()
