"""Models: what padless trains and verifies on.

- ``factory``: GPT-2 sizes, tiny test configs, the packaged pretrained SmolLM2-135M, any transformers name.
- ``lora``: a model wrapped in a LoRA adapter (``padless[peft]``), as users build one.
- ``compile``: ``torch.compile`` of decoder layers with packed-row boundaries kept out of the graphs.
- ``fsdp``: FSDP2 (``fully_shard``) per decoder layer and the root, the rank's device and process group,
  gradient accumulation under DDP / FSDP2, whole tensors gathered from the shards.

Loading from a model hub offline-first lives in :mod:`padless.hub` (the floor), since data/ uses it too.
What padless relies on in transformers' internals, and the version it was read from, is
:mod:`padless.attention.transformers_compat` (in attention, which reads most of it and which models may import).
"""
