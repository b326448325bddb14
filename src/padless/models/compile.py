"""``torch.compile`` for the decoder layers of a causal LM, with packed rows that do not recompile.

:func:`compile_layers` compiles each block of the decoder (``transformer.h`` of GPT-2,
``model.layers`` of the Llama family, found generically) in place, the way ``nn.Module.compile``
does, so the state dict and the model's own forward are unchanged. What stays out of the graphs:

- the padless attention kernel: its bucket planner reads document lengths (data), so traced it
  would guard on every new document length; :func:`padless.attention.backend.padless_attention` runs untraced under
  compile (a graph break around it);
- the document boundaries of a packed batch (``cu_seq_lens_q/k``, ``max_length_q/k``): their number
  of documents and longest document change every batch. Each compiled layer is called through an
  eager wrapper that takes them out of the layer's arguments and hands them to the attention in a
  :func:`padless.attention.backend.packed_documents` context, where they are still checked against ``position_ids``.
  With ``flash_attention_2`` the same wrapper hands them to transformers' flash function, which
  :func:`route_flash_attention` wraps so that it runs untraced inside such a call (a graph break);
- everything outside the layers (embeddings, the LM head over trained tokens, the loss), which
  depends on how many tokens are trained.

So what a compiled layer sees is ``hidden_states [B, L, d]``, ``position_ids [B, L]`` (and a mask
for SDPA): with the row length rounded up (``pad_to_multiple_of`` of the collators) a handful of
shapes, or one graph with ``dynamic=True``. :class:`CompileCounter` reads how often torch compiled
(dynamo frame compilations, recompilations, backward graphs compiled later) and how long it took.

Measured with inductor on 2 CPU cores (``benchmarks/compile.py``; docs/bench/compile.txt and
compile-gpt2-mini.txt): compile does not pay there. gpt2-2layer, 48 steps: steady-state packing
x0.96-0.98 of eager, bucketing x0.87-0.95, and 30-85 s of cold compiling on top; gpt2-mini
(4 x 256): x0.95-1.03. ``dynamic=True`` compiled 9 frames for packing where static shapes with
rows rounded to 128 compiled 36 (one packed row per micro-batch takes many lengths), and static
bucketing (rows x length) reached dynamo's recompile limit. So ``padless bench`` stays eager by
default; ``--compile dynamic`` is the mode to try on other hardware.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch  # torch._dynamo: imported where used (loading it is slow)

BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
"""Keyword arguments that carry a packed batch's document boundaries to the attention layers."""


@dataclass(frozen=True)
class CompileStats:
    """How often torch compiled, and how long it took, since a :class:`CompileCounter` started."""

    frames: int
    """Dynamo frame compilations: first compiles and recompiles (a graph break adds frames)."""
    recompiles: int
    """Of ``frames``, compilations of a frame that was compiled before (a guard failed: a new shape)."""
    backward_compiles: int
    """Backward graphs compiled lazily, at their first backward (inductor on a CPU compiles them with
    the forward, inside ``frames``: then 0)."""
    graphs: int
    """Graphs handed to the backend (torch._dynamo's ``unique_graphs`` counter)."""
    compile_s: float
    """Wall time spent compiling (frames and lazy backwards; nested compilations counted once)."""


class CompileCounter:
    """Counts torch compilations in this process from its creation on (torch's compile callbacks and
    dynamo's graph counter are process-wide: in a process that compiles one model, they are its).
    :meth:`stats` reads them; :meth:`close` stops counting."""

    def __init__(self) -> None:
        from torch._dynamo.callback import CallbackTrigger, callback_handler
        from torch._dynamo.utils import counters

        self._dynamo, self._backward = CallbackTrigger.DYNAMO, CallbackTrigger.LAZY_BACKWARD
        self._handler, self._counters = callback_handler, counters
        self._graphs0 = int(counters["stats"]["unique_graphs"])
        self._frames = self._recompiles = self._backwards = 0
        self._seconds = 0.0
        self._started: float | None = None
        self._open = True
        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)

    def _start(self, args: Any) -> None:
        self._started = time.perf_counter()

    def _end(self, args: Any) -> None:
        if self._started is not None:
            self._seconds += time.perf_counter() - self._started
            self._started = None
        if args.callback_trigger == self._backward:
            self._backwards += 1
        elif args.callback_trigger == self._dynamo:
            self._frames += 1
            # compile ids read "frame/attempt" ("!autograd/frame/attempt" under compiled autograd)
            attempt = args.compile_id.rsplit("/", 1)[-1]
            self._recompiles += attempt.isdigit() and int(attempt) > 0

    def stats(self) -> CompileStats:
        """Counts and seconds so far."""
        graphs = int(self._counters["stats"]["unique_graphs"]) - self._graphs0
        return CompileStats(self._frames, self._recompiles, self._backwards, graphs, self._seconds)

    def close(self) -> None:
        """Stop counting (idempotent)."""
        if self._open:
            self._handler.remove_start_callback(self._start)
            self._handler.remove_end_callback(self._end)
            self._open = False


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The decoder's list of blocks: the first ``nn.ModuleList`` (outermost first) whose length is the
    config's number of layers and whose entries are all of one class (GPT-2's ``transformer.h``,
    Llama's ``model.layers``, ...). ``ValueError`` when there is none."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    config = getattr(model, "config", None)
    expected = getattr(config, "num_hidden_layers", None) if config is not None else None
    for _, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
            continue
        if expected is not None and len(module) != expected:
            continue
        if len({type(m) for m in module}) == 1:
            return module
    raise ValueError(
        f"compile_layers found no decoder layers in {type(model).__name__}: no nn.ModuleList of "
        f"{expected if expected is not None else 'config.num_hidden_layers'} blocks of one class; "
        "compile the model with torch.compile yourself"
    )


def compile_layers(model: Any, **torch_compile_kwargs: Any) -> CompileCounter:
    """Compile every decoder layer of ``model`` in place (``torch.compile`` with
    ``torch_compile_kwargs``: ``backend``, ``dynamic``, ``mode``, ``options``, ...) and return a
    :class:`CompileCounter` started now. Packed batches' document boundaries stay out of the
    compiled graphs (see the module docstring), so only the row shape can cause a recompilation.

    ``ValueError`` when no decoder layers are found (:func:`decoder_layers`), or when the layers are
    compiled already.
    """
    layers = decoder_layers(model)
    done = [i for i, layer in enumerate(layers) if getattr(layer, "_compiled_call_impl", None) is not None]
    if done:
        raise ValueError(f"decoder layer {done[0]} of {type(model).__name__} is compiled already")
    counter = CompileCounter()
    for layer in layers:
        if model.config._attn_implementation == FLASH:
            route_flash_attention()
        compiled = torch.compile(layer._call_impl, **torch_compile_kwargs)
        # what Module.compile() does, with the document boundaries taken out of the arguments first
        layer._compiled_call_impl = _boundaries_out_of_graph(compiled, model.config)
    return counter


FLASH = "flash_attention_2"

_FLASH_SENT: list[dict[str, Any]] = []
"""The boundary kwargs a compiled flash layer's wrapper took out of its arguments (innermost last);
empty outside such a call. Read only by untraced code: traced, its tensors would become guards."""
_FLASH_ACTIVE: list[bool] = [False]
"""Whether :data:`_FLASH_SENT` holds anything: the only value traced code reads (a stable guard)."""
_FLASH_ORIGINAL: list[Callable[..., Any]] = []
"""transformers' own flash_attention_2 function, once :func:`route_flash_attention` replaced it."""


def _boundaries_out_of_graph(compiled: Callable[..., Any], config: Any) -> Callable[..., Any]:
    """Call ``compiled`` without the packed batch's boundary kwargs (:data:`BOUNDARY_KWARGS`): their
    shapes and ``max_length`` values change every batch and would recompile the layer. The padless
    attention reads them from a :func:`padless.attention.backend.documents_context`; flash_attention_2
    from :data:`_FLASH_SENT` through :func:`flash_attention_with_documents`. Other backends get the
    call unchanged."""
    from padless.attention.backend import BACKEND_NAME, documents_context, sent_boundaries

    def call(*args: Any, **kwargs: Any) -> Any:
        backend = config._attn_implementation
        if backend not in (BACKEND_NAME, FLASH) or "cu_seq_lens_q" not in kwargs:
            return compiled(*args, **kwargs)
        cu, cu_k = sent_boundaries(kwargs), kwargs.get("cu_seq_lens_k")
        sent = {name: kwargs.pop(name) for name in BOUNDARY_KWARGS if name in kwargs}
        if backend == FLASH:
            _FLASH_SENT.append(sent)
            _FLASH_ACTIVE[0] = True
            try:
                return compiled(*args, **kwargs)
            finally:
                _FLASH_SENT.pop()
                _FLASH_ACTIVE[0] = bool(_FLASH_SENT)
        with documents_context(None, cu, cu_k, sent.get("max_length_q")):
            return compiled(*args, **kwargs)

    return call


def flash_attention_with_documents(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any):
    """What ``flash_attention_2`` names once :func:`route_flash_attention` ran: transformers' own function,
    given the boundaries a compiled layer's wrapper took out of its arguments. Outside such a call
    it is transformers' function, traced as before; inside, the call runs untraced (a graph break), so
    the boundaries never enter a graph."""
    if _FLASH_ACTIVE[0]:
        return _flash_untraced(module, query, key, value, attention_mask, **kwargs)
    return _FLASH_ORIGINAL[0](module, query, key, value, attention_mask, **kwargs)


def _flash_with_sent(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any):
    if kwargs.get("cu_seq_lens_q") is None:
        kwargs.update(_FLASH_SENT[-1])
    return _FLASH_ORIGINAL[0](module, query, key, value, attention_mask, **kwargs)


_UNTRACED: list[Callable[..., Any]] = []


def _flash_untraced(*args: Any, **kwargs: Any) -> Any:
    return _UNTRACED[0](*args, **kwargs)


def route_flash_attention() -> None:
    """Register :func:`flash_attention_with_documents` as ``flash_attention_2`` with transformers
    (idempotent; :func:`compile_layers` calls it for a flash-attention model)."""
    if _FLASH_ORIGINAL:
        return
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _FLASH_ORIGINAL.append(ALL_ATTENTION_FUNCTIONS[FLASH])
    _UNTRACED.append(torch.compiler.disable(_flash_with_sent, recursive=True))
    AttentionInterface.register(FLASH, flash_attention_with_documents)
