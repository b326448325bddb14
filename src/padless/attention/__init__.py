"""Attention over packed rows: every token sees only earlier tokens of its own document.

- ``masks``: the dense boolean reference mask and the 4D additive block-causal mask (windows carried).
- ``varlen``: padless' varlen kernels (grouped SDPA on CPU, torch varlen / flash-attn on CUDA).
- ``kernels``: which fused kernels run here (sm80+, head size, dtype) and whether a model's flash path
  hands them the document boundaries.
- ``host``: host copies of the boundary tensors, so a forward reads them with one device sync at most.
- ``backend``: the ``"padless"`` attention function registered with transformers, and its mask function.
- ``rules``: what a model's own attention computes (windows, soft-capping, ALiBi...), read from its config.
- ``positions``: how a model encodes positions, and when a packed row keeps ALiBi models exact.
- ``adapters``: PEFT wrappers (LoRA, DoRA, IA3): the unwrapping every check reads, and why prompt learning is refused.
- ``accept``: a batch or collator built without the model, checked against the model it meets.
- ``facts``: everything the rule asks about a model (rules, mixers, device, compute dtype), read once
  and cached per model until it changes.
- ``verdict``: the rule's answer (exact with what the batch must carry, or refused with why) and the one
  comparison of what a collator or batch carries with it.
- ``select``: the ONE rule that says whether a model + backend + layout is exact, or refuses it.
- ``backend_table``: the backend table the rule reads: per attention backend, what a batch carries for it and
  when it is refused.
- ``mixers``: layers that mix tokens without the mask (gated DeltaNet, Mamba, short convolutions, RWKV...),
  found and patched to keep packed documents apart: a chunked scan, or each document alone.
- ``scans``: the chunked scans over a whole packed row that take its boundaries as masks (short
  convolution, gated delta rule, Mamba2's SSD).
- ``mixer_documents``: where a forward's documents lie, seen from a layer inside it: the boundaries sent.
- ``per_document``: a layer run per document: grouped by length, right-padded, scattered back.
- ``tree``: shared-prompt (tree) attention: completions attend to one prompt, not to each other.
- ``context_parallel``: one packed row split over ranks: keys and values all-gathered, the document mask
  from global indices (``"padless_cp"``), and the models it refuses.
- ``context_mixers``: gated DeltaNet, Mamba2 and short-convolution layers run head-parallel inside a
  context-parallel forward (all-to-all from sequence to heads, the scans over the whole rows, and back),
  and which context-parallel forward is running (the one variable its layers read).
- ``multimodal``: how a vision-language model reads the images of a packed row (positions, image
  attention blocks): the families packed with images, the rest refused with the reason.
- ``transformers_compat``: the transformers internals padless relies on, and the version they were read from.
"""
