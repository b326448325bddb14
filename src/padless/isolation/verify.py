"""Isolation and equivalence checks for packed training, for any causal LM and attention backend.

For each backend, :func:`verify_isolation` runs documents alone (no padding, no mask), packed into
rows of ``max_length`` tokens, and right-padded, and measures against the runs alone:

1. logits: the largest absolute difference over each document's tokens (packed and padded);
2. gradients: ``||g - g_alone|| / ||g_alone||`` of the token-normalised loss (packed and padded).

Padding is exact in mathematics but not in floating point, so its differences are the noise of this
model, backend and dtype, measured in the same run. Packed rows pass when their differences stay
within :data:`NOISE_FACTOR` times that noise, or under the dtype's absolute floor
(:data:`TOLERANCES`) (the judgment of :mod:`padless.isolation.compare`); a leaked token moves logits
by their own size, far above both. A failure names the documents, their tokens over the limit and
the packed and padded differences side by side. The same is checked for shared-prompt rows
(:class:`padless.RolloutCollator`: completions read their prompt's keys; the trained quantity is
the completions' summed log-probs).

How much is run (:data:`Check`), for rows of ``L`` tokens (default :data:`DEFAULT_MAX_LENGTH`, capped
at the model's positions)::

                    sampled (default)                      thorough
    documents       1 row of L (seeded lengths)            2 rows of L (seeded lengths)
    logits          every document                         every document
    padded (noise)  the longest document, padded to L      every document, padded to L
    alone           once, on the first backend that runs   on each backend
    gradients       the last block + the layers after it   every trainable parameter
    shared prompt   3 prompts, 7 completions in one row; gradients as above

What costs is a forward (and backward) over rows of ``L`` tokens, and a backward through every layer
(docs/verify.md has timings). The sampled check still fails a contaminated row: every document's
logits are compared (a leak moves them by their own size), and a label or loss leak changes the
last block's gradients too (tests/isolation/test_verify.py).

``autocast=torch.bfloat16`` runs the forwards under ``torch.autocast`` over the model's own
(float32) weights, as ``Trainer(bf16=True)`` trains; the floor is then the autocast dtype's. A
float64 model is the oracle: its noise is ~1e-14, so any systematic difference shows.

A backend that padless refuses for this model and device (say FlexAttention on a CPU) is reported
as refused, with the reason; a backend that is not installed as unavailable. Only a backend that
runs and differs fails. Use it in your own tests: ``assert padless.verify_isolation(model).passed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from padless.devices import compute_dtype, dtype_name
from padless.isolation.compare import (
    NOISE_FACTOR,
    TOLERANCES,  # noqa: F401  (its public home: padless.isolation.verify.TOLERANCES)
    Document,
    DocumentDiff,
    Judgment,
    LogitCheck,
    Tolerance,
    document_diff,
    judge,
    relative_difference,
    tolerance_for,
)

if TYPE_CHECKING:  # torch is imported where used: `padless verify` refuses bad flags before torch loads
    import torch


DEFAULT_BACKENDS = ("sdpa", "eager", "padless", "flash_attention_2", "flex_attention")
DEFAULT_MAX_LENGTH = 2048
"""Packed row length when none is given (capped at the model's positions: :attr:`ModelSummary.context`)."""
DEFAULT_LENGTHS = (1, 7, 13, 5, 24, 3, 9, 2)
"""The documents of one row holding every document (``max_length=None``)."""
SHARED_PROMPT_GROUPS = ((5, (3, 1)), (1, (4, 2, 6)), (9, (2, 2)))
"""(prompt length, completion lengths) of the groups the shared-prompt check packs."""

Check = Literal["sampled", "thorough"]
"""How much :func:`verify_isolation` runs (the table in the module docstring)."""
CHECKS: tuple[str, ...] = get_args(Check)
ROWS: dict[str, int] = {"sampled": 1, "thorough": 2}
"""Rows of default documents per check."""
DOCUMENTS_PER_ROW = 6
"""Default documents in a row (fewer when the row is too short)."""
PADDED_TOKENS = 8192
"""Padded rows run in micro-batches of at most this many tokens (their gradients add up)."""
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")
"""Config fields that bound the row length (the first one set is the model's context)."""

Progress = Callable[[str], None]
"""Receives one line per stage as :func:`verify_isolation` goes (``print``, a logger, ...)."""


def default_lengths(
    model: Any, max_length: int | None = None, check: Check = "sampled", seed: int = 0
) -> tuple[int, ...]:
    """The lengths of the default documents: for rows of ``max_length`` tokens,
    :func:`sample_lengths` (``ROWS[check]`` rows); for one row of everything (``None``),
    :data:`DEFAULT_LENGTHS`. Either way one document is longer than the model's shortest sliding
    window shorter than the row (when it fits), so that a packed mask that dropped the window shows
    as a difference."""
    from padless.attention.facts import model_facts as read_facts

    windows = read_facts(model).rules.active_windows(max_length)
    window = windows[0] if windows else None
    if max_length is not None:
        return sample_lengths(max_length, ROWS[check], seed=seed, window=window)
    if window is not None and max(DEFAULT_LENGTHS) <= window:
        return (*DEFAULT_LENGTHS, window + 4)
    return DEFAULT_LENGTHS


def sample_lengths(max_length: int, rows: int = 1, *, seed: int = 0, window: int | None = None) -> tuple[int, ...]:
    """Seeded document lengths for ``rows`` rows of ``max_length`` tokens, in the order that next-fit
    packs them (each row's documents, row after row), chosen to meet at boundaries::

        rows=1   [1 | a | b ....... | c | d .. | e | pad]    a 1-token document first, a padded tail
        rows=2   [1 | a | b ....... | c | d .. | e ..... ]   the first row full to its last token
                 [f ...... | g | h ........ | pad ...... ]   the last row ~3/4 full, then padding

    Lengths come from uniform cuts of each row (:data:`DOCUMENTS_PER_ROW` documents), so short and
    long documents sit side by side. With ``window`` (a sliding window shorter than the row) and no
    document longer than it, the last row holds one of ``window + 4`` tokens (at most the row).
    """
    if max_length < 1 or rows < 1:
        raise ValueError(f"max_length={max_length} and rows={rows} must be >= 1")
    rng = np.random.default_rng(seed)

    def cut(total: int, parts: int) -> list[int]:
        parts = max(1, min(parts, total))
        points = np.sort(rng.choice(np.arange(1, total), parts - 1, replace=False)) if parts > 1 else []
        return np.diff([0, *points, total]).astype(int).tolist()

    last_fill = max(1, (3 * max_length) // 4) if rows > 1 else max(1, max_length - max(1, max_length // 16))
    fills = [max_length] * (rows - 1) + [last_fill]
    out = []
    for r, fill in enumerate(fills):
        if r == 0 and fill > 1:  # a 1-token document opens the first row: no target, position 0 only
            out.append([1, *cut(fill - 1, DOCUMENTS_PER_ROW - 1)])
        else:
            out.append(cut(fill, DOCUMENTS_PER_ROW))
    if window is not None and window < max_length and max(max(r) for r in out) <= window:
        lead = [1] if rows == 1 and window + 1 < max_length else []  # keep the 1-token document when it fits
        n = min(window + 4, max_length - len(lead))
        fill = max(fills[-1], len(lead) + n)
        out[-1] = [
            *lead,
            n,
            *(cut(fill - len(lead) - n, DOCUMENTS_PER_ROW - 1 - len(lead)) if fill > len(lead) + n else []),
        ]
    return tuple(n for row in out for n in row)


def context_length(model: Any) -> int | None:
    """The longest row the model's positions cover (:data:`CONTEXT_KEYS` of its text config), or None."""
    from padless.attention.rules import config_of

    config = config_of(model)
    get_text = getattr(config, "get_text_config", None)
    if get_text is not None:
        try:
            config = get_text(decoder=True)
        except (TypeError, ValueError):
            pass
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


Status = Literal["pass", "fail", "refused", "unavailable"]


@dataclass(frozen=True)
class ModelSummary:
    """What :func:`verify_isolation` reads about the model once, before anything runs: a summary for the
    report (:attr:`VerifyReport.facts`), not the rule's :class:`padless.attention.facts.ModelFacts`."""

    name: str
    """The model's name (``config._name_or_path``) or class."""
    model_class: str
    """Its class (the class a PEFT adapter wraps, when it wraps one)."""
    parameters: int
    """Parameters (tied ones counted once)."""
    trainable: int
    """Parameters with ``requires_grad``."""
    attention: str
    """Its attention implementation when the check began (restored afterwards)."""
    context: int | None
    """The longest row its positions cover (:func:`context_length`; None: no limit known)."""
    windows: list[int]
    """Its sliding windows, shortest first (empty: none)."""
    images: str | None = None
    """A vision-language model: how packed rows carry its images, or why they are refused
    (:func:`padless.attention.multimodal.vision_scheme`; the text checks below run on text documents;
    images are checked by the multimodal sweep, tests/multimodal). ``None``: no vision tower."""

    def describe(self) -> str:
        windows = f", sliding windows {self.windows}" if self.windows else ""
        images = f"; images: {self.images}" if self.images else ""
        context = f"{self.context:,} positions" if self.context else "no position limit"
        name = self.name if self.name == self.model_class else f"{self.name}: {self.model_class}"
        return (
            f"model {name}, {_count(self.parameters)} parameters "
            f"({_count(self.trainable)} trainable), {context}{windows}, attention {self.attention!r}{images}"
        )


def model_summary(model: Any) -> ModelSummary:
    """:class:`ModelSummary` of ``model``, from the rule's :func:`padless.attention.facts.model_facts`."""
    from padless.attention.facts import model_facts as read_facts

    params = list(model.parameters())
    read = read_facts(model)  # the rule's facts, read once per model
    cls = read.model_class or type(model)
    windows = sorted({w for w in read.rules.windows.values() if w is not None})
    return ModelSummary(
        getattr(model.config, "_name_or_path", "") or type(model).__name__,
        cls.__name__,
        sum(p.numel() for p in params),
        sum(p.numel() for p in params if p.requires_grad),
        str(model.config._attn_implementation),
        context_length(model),
        windows,
        _images(read),
    )


def _images(facts: Any) -> str | None:
    """What :attr:`ModelSummary.images` says of a model's facts."""
    scheme = facts.vision
    if scheme is None:
        return f"refused ({facts.vision_reason})" if facts.vision_reason else None
    how = "a 3-D rope index per document" if scheme.positions == "rope3d" else "positions restarting per document"
    blocks = ", image tokens attending both ways inside each image (4D mask only)" if scheme.blocks else ""
    return f"packed with their documents ({scheme.family}: {how}{blocks})"


@dataclass(frozen=True)
class Coverage:
    """What the check ran on: the documents, the noise reference, the gradients (honest about sampling)."""

    check: str
    """:data:`Check`."""
    lengths: list[int]
    """The plain documents' lengths, in packing order."""
    rows: int
    """Packed rows of them."""
    row_length: int | None
    """Tokens per packed row (None: one row of every document)."""
    requested_length: int | None
    """The ``max_length`` asked for, before the cap at the model's positions."""
    padded: list[int]
    """The documents also run right-padded (padding's noise)."""
    alone_on: str | None
    """The backend the documents ran alone on, for every backend (None: each backend on its own)."""
    grad_parameters: int
    """Parameters whose gradients are compared on plain rows."""
    grad_scope: str
    """Which they are (``every trainable parameter``, or the modules)."""
    seed: int
    """Seed of the default documents' lengths and token ids."""

    def describe(self) -> list[str]:
        """Two lines: the documents and rows; what was sampled (or that nothing was)."""
        rows = f"{self.rows} row{'s' if self.rows != 1 else ''} of {self.row_length}" if self.row_length else "one row"
        capped = ""
        if (
            self.requested_length is not None
            and self.row_length is not None
            and self.row_length < self.requested_length
        ):
            capped = f" (max_length {self.requested_length} capped at the model's positions)"
        shown = ", ".join(map(str, self.lengths[:12])) + (", ..." if len(self.lengths) > 12 else "")
        first = (
            f"{self.check} check: {len(self.lengths)} documents (lengths {shown}; seed {self.seed}) in {rows}{capped}"
        )
        if self.check == "thorough":
            second = (
                f"every document alone on each backend and right-padded; gradients of {self.grad_scope} "
                f"({_count(self.grad_parameters)})"
            )
        else:
            longest = ", ".join(f"document {i} ({self.lengths[i]} tokens)" for i in self.padded)
            second = (
                f"sampled: logits of every document; padding's noise from {longest} padded to the row; each "
                f"document alone once, on {self.alone_on or 'the first backend that runs'}, for every backend; "
                f"gradients of {_count(self.grad_parameters)} parameters ({self.grad_scope}), shared-prompt rows too; "
                "thorough: two rows, every document padded, every parameter"
            )
        return [first, second]


@dataclass(frozen=True)
class BackendResult:
    """The verdict for one attention backend (one layout: plain rows, or ``+shared_prompt``)."""

    backend: str
    """The backend's name, ``+shared_prompt`` for the shared-prompt rows."""
    status: Status
    """``pass``, ``fail``, ``refused`` (by padless' exactness rule) or ``unavailable`` (not installed)."""
    max_logit_diff: float | None = None
    """Largest |packed - alone| logit over every document's tokens."""
    logit_tolerance: float | None = None
    """The limit it was held to: ``max(factor x logit_noise, dtype floor)``."""
    grad_rel_diff: float | None = None
    """``||g_packed - g_alone|| / ||g_alone||``."""
    grad_tolerance: float | None = None
    """The limit it was held to: ``max(factor x grad_noise, dtype floor)``."""
    detail: str = ""
    """Why refused or unavailable."""
    logit_noise: float | None = None
    """Padding's own largest |padded - alone| logit, same documents, same run."""
    grad_noise: float | None = None
    """Padding's own ``||g_padded - g_alone|| / ||g_alone||``."""
    evidence: list[str] = field(default_factory=list)
    """On failure: each document over the limit, its tokens, packed vs padded differences; the gradients."""
    seconds: float | None = None
    """How long the check took (None: it did not run)."""


@dataclass(frozen=True)
class VerifyReport:
    """Every backend's result plus what was checked."""

    model: str
    """The model's name (or class)."""
    dtype: str
    """What the forwards computed in: a dtype name, or ``autocast-<dtype>`` over the weights' dtype."""
    device: str
    """Where they ran."""
    lengths: list[int]
    """The lengths of the plain documents."""
    max_length: int | None
    """Packed row length (None: one row for all)."""
    results: list[BackendResult] = field(default_factory=list)
    """One per backend for plain rows, then one per backend for shared-prompt rows."""
    factor: float = NOISE_FACTOR
    """How many times padding's noise packed rows may differ."""
    facts: ModelSummary | None = None
    """What was read about the model before anything ran."""
    coverage: Coverage | None = None
    """What was run: documents, rows, the noise reference, the gradients."""
    tolerance: Tolerance | None = None
    """The dtype's floor the judgment used."""

    @property
    def ran(self) -> bool:
        """Some backend ran (passed or failed); False when every one was refused or unavailable."""
        return any(r.status in ("pass", "fail") for r in self.results)

    @property
    def passed(self) -> bool:
        """No backend that ran was contaminated or trained differently from padding."""
        return all(r.status != "fail" for r in self.results) and any(r.status == "pass" for r in self.results)

    def legend(self) -> str:
        """One line: what the columns of the report mean (:func:`legend`)."""
        return legend(self.factor, self.tolerance)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "ran": self.ran}


def legend(factor: float, tolerance: Tolerance | None) -> str:
    """One line: what the columns of a report mean, and the limit."""
    floor = ""
    if tolerance is not None:
        t = tolerance
        floor = f": logits {t.logits_atol:g} + {t.logits_rtol:g} x max|logit alone|, gradients {t.grad_rtol:g}"
    return (
        "columns: alone = each document run by itself (the reference); packed = the documents packed into rows; "
        "padded = the same documents right-padded, one per row, as wide as the packed rows (padding's own float "
        "noise, same run); logit = largest |logit - alone|, grad = ||grad - grad alone|| / ||grad alone||; "
        f"limit = max({factor:g} x padded, dtype floor{floor})"
    )


def _count(n: int) -> str:
    """``134,515,008`` -> ``134.5M``."""
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def random_sequences(lengths: Sequence[int], vocab_size: int, seed: int) -> list[dict[str, list[int]]]:
    """Features of random token ids, one per length (the verifier's default documents), from ``seed``."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, vocab_size, int(n)).tolist()} for n in lengths]


_Context = Callable[[], AbstractContextManager[Any]]


def sampled_parameters(model: Any) -> tuple[list[Any], str]:
    """The parameters whose gradients the sampled check compares, and their description: the last
    block of the model's longest ``ModuleList`` (its decoder layers) and every parameter after it
    except the embeddings (the final norm), among the trainable ones. A leak in any layer reaches
    them through the forward; a label or loss leak changes them directly; and their backward runs
    the attention backend's backward once. Every trainable parameter when there is no such block
    (or none of it trains)."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        return trainable, "every trainable parameter"
    name, blocks = max(lists, key=lambda nm: len(nm[1]))
    last = f"{name}.{len(blocks) - 1}"
    embeddings = {
        id(m.weight)
        for m in (model.get_input_embeddings(), model.get_output_embeddings())
        if m is not None and getattr(m, "weight", None) is not None
    }
    chosen, modules, after = [], [last], False
    ids = {id(p) for p in trainable}
    for pname, p in model.named_parameters():
        inside = pname.startswith(last + ".")
        if inside or (after and id(p) not in embeddings):
            if id(p) in ids:
                chosen.append(p)
                if not inside:
                    modules.append(pname.rsplit(".", 1)[0])
        after = after or inside
    if not chosen:
        return trainable, "every trainable parameter"
    return chosen, ", ".join(dict.fromkeys(modules))


@contextmanager
def _gradients_of(model: Any, params: Sequence[Any]) -> Iterator[None]:
    """Within: only ``params`` require gradients (the backward stops where none is needed)."""
    keep = {id(p) for p in params}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in keep]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _flat_grads(params: Sequence[Any]) -> torch.Tensor:
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten() for p in params])


@dataclass
class _Run:
    """What every check of one :func:`verify_isolation` call shares."""

    tol: Tolerance
    factor: float
    compute: _Context
    dtype: torch.dtype
    """The compute dtype (the rule and the collators are asked for it)."""
    check: str
    params: list[Any]
    """Whose gradients the plain rows compare."""
    padded: tuple[int, ...]
    """The documents also run right-padded."""
    max_length: int | None
    strategy: str
    """The collator's planner (next-fit for the default documents)."""
    verdicts: dict[str, str | None]
    """Result name -> why the rule refuses it (None: exact)."""
    alone: _Alone | None = None
    """sampled: the documents alone, run once on the first backend that ran."""


@dataclass(frozen=True)
class _Alone:
    """The documents run alone: logits, and the gradients of all and of the padded ones."""

    backend: str
    logits: list[Any]
    """``[n, V]`` per document."""
    grads: Any
    """Of every document's loss."""
    padded_grads: Any
    """Of the padded documents' losses only (their noise reference)."""


def _step(model: Any, batch: Any, num_items: Any, compute: _Context) -> Any:
    """Forward and backward of one micro-batch's token-normalised loss; its logits."""
    from padless.batching.batch import forward_inputs
    from padless.objectives.loss import causal_lm_loss

    with compute():
        # no cache, as in training (RWKV in eval mode writes its state in place, breaking backward)
        out = model(**{"use_cache": False, **forward_inputs(batch)}).logits
        loss = causal_lm_loss(out, batch["labels"], num_items)
    loss.backward()
    return out.detach()


def _alone(model: Any, backend: str, features: list[dict[str, list[int]]], num_items: Any, run: _Run) -> _Alone:
    """Each document alone (the padded ones first, so their gradients are read on the way)."""
    from padless.batching.batch import batch_to
    from padless.batching.collate import PaddingCollator

    device = next(model.parameters()).device
    order = [*run.padded, *(i for i in range(len(features)) if i not in run.padded)]
    logits: list[Any] = [None] * len(features)
    model.zero_grad(set_to_none=True)
    padded_grads = _flat_grads(run.params) if not run.padded else None
    for k, i in enumerate(order):
        logits[i] = _step(model, batch_to(PaddingCollator()([features[i]]), device), num_items, run.compute)[0]
        if k == len(run.padded) - 1:
            padded_grads = _flat_grads(run.params).clone()
    grads = _flat_grads(run.params)
    model.zero_grad(set_to_none=True)
    return _Alone(backend, logits, grads, padded_grads)


def _padded(model: Any, features: list[dict[str, list[int]]], width: int, num_items: Any, run: _Run) -> tuple[Any, Any]:
    """``[P, width, V]`` logits of the padded documents (row ``k`` = ``run.padded[k]``), right-padded to
    the packed rows' width (kernels of the same shapes), in micro-batches of :data:`PADDED_TOKENS`; their gradients."""
    import torch

    from padless.batching.batch import batch_to
    from padless.batching.collate import PaddingCollator

    device = next(model.parameters()).device
    chosen = [features[i] for i in run.padded]
    per_batch = max(1, PADDED_TOKENS // width)
    model.zero_grad(set_to_none=True)
    logits = []
    for s in range(0, len(chosen), per_batch):
        batch = batch_to(PaddingCollator(pad_to_multiple_of=width)(chosen[s : s + per_batch]), device)
        logits.append(_step(model, batch, num_items, run.compute))
    grads = _flat_grads(run.params)
    model.zero_grad(set_to_none=True)
    return torch.cat(logits), grads


def _switch_backend(model: Any, backend: str, name: str, run: _Run) -> BackendResult | None:
    """Switch ``model`` to ``backend`` if the rule accepted it for this layout (``run.verdicts``);
    else the report row saying why not (refused, or not installed here)."""
    from padless.attention.select import use_backend

    reason = run.verdicts[name]
    if reason is not None:
        return BackendResult(name, "refused", detail=reason)
    use_backend(backend)  # registers padless attention where it is the backend chosen
    try:
        model.set_attn_implementation(backend)
    except (ImportError, ValueError) as exc:
        return BackendResult(name, "unavailable", detail=str(exc).splitlines()[0])
    return None


def _verdicts(model: Any, backends: Sequence[str], max_length: int | None, dtype: torch.dtype) -> dict[str, str | None]:
    """The rule (:func:`padless.check_exact`), asked once per backend and layout: result name -> why
    it refuses (None: exact). Shared-prompt rows are judged without a row bound, as they are built."""
    from padless.attention.facts import model_facts as read_facts
    from padless.attention.select import decide

    facts = read_facts(model, next(model.parameters()).device, dtype)
    out: dict[str, str | None] = {}
    for layout, suffix, rows in (("documents", "", max_length), ("shared_prompt", "+shared_prompt", None)):
        for b in backends:
            try:
                out[b + suffix] = decide(facts, b, max_length=rows, layout=layout).message  # type: ignore[arg-type]
            except ValueError as exc:  # a backend the rule does not know
                out[b + suffix] = str(exc)
    return out


def _result(name: str, logits: LogitCheck, grads: Judgment) -> BackendResult:
    """The report row of one layout from its two judgments, with the evidence of a failure."""
    evidence = [e.describe() for e in logits.evidence]
    if not grads.passed:
        evidence.append(
            f"gradients: packed {grads.measured:.3g} vs padded {grads.noise:.3g} "
            f"(relative to each document alone; limit {grads.limit:.3g})"
        )
    lj = logits.judgment
    return BackendResult(
        name,
        "pass" if lj.passed and grads.passed else "fail",
        lj.measured,
        lj.limit,
        grads.measured,
        grads.limit,
        logit_noise=lj.noise,
        grad_noise=grads.noise,
        evidence=evidence,
    )


def _check_backend(model: Any, backend: str, features: list[dict[str, list[int]]], run: _Run) -> BackendResult:
    """Plain rows on ``backend``: every document alone, the padded ones, all of them packed."""
    from padless.batching.batch import batch_to
    from padless.batching.collate import PackingCollator
    from padless.objectives.loss import step_num_items

    skipped = _switch_backend(model, backend, backend, run)
    if skipped is not None:
        return skipped
    device = next(model.parameters()).device
    collator = PackingCollator.for_model(
        model,
        dtype=run.dtype,
        max_length=run.max_length,
        strategy=run.strategy,
        pad_to_max_length=run.max_length is not None,
    )
    batch = batch_to(collator(features), device)
    docs = []
    for i, feature in enumerate(features):
        ((_, row, offset, n),) = batch.placements.of_feature(i)  # overlong="error": one piece each
        docs.append(Document(i, tuple(feature["input_ids"]), row, tuple(range(offset, offset + n))))
    width = int(batch["input_ids"].shape[1])  # padding as wide as the packed rows: kernels of the same shapes
    num_items = step_num_items([batch], all_ranks=False)
    with _gradients_of(model, run.params):
        alone = run.alone if run.alone is not None else _alone(model, backend, features, num_items, run)
        if run.check == "sampled":
            run.alone = alone
        padded, g_padded = _padded(model, features, width, num_items, run)
        model.zero_grad(set_to_none=True)
        packed = _step(model, batch, num_items, run.compute)
        g_packed = _flat_grads(run.params)
        model.zero_grad(set_to_none=True)
    logits = _logit_check(docs, alone.logits, packed, padded, run)
    grads = judge(
        relative_difference(g_packed, alone.grads),
        relative_difference(g_padded, alone.padded_grads),
        run.tol.grad_rtol,
        run.factor,
    )
    return _result(backend, logits, grads)


def _logit_check(docs: Sequence[Document], alone: Sequence[Any], packed: Any, padded: Any, run: _Run) -> LogitCheck:
    """Every document packed against itself alone; padding's noise from the padded ones (row ``k`` of
    ``padded`` is document ``run.padded[k]``); judged by :func:`padless.isolation.compare.judge`."""
    import torch

    with torch.no_grad():
        checked = tuple(document_diff(d, a, packed) for d, a in zip(docs, alone))
        noisy: list[DocumentDiff | None] = [None] * len(docs)
        for k, i in enumerate(run.padded):
            d = docs[i]
            noisy[i] = document_diff(
                Document(d.index, d.input_ids, k, tuple(range(len(d.input_ids)))), alone[i], padded
            )
    scale = max(d.scale for d in checked)
    noise = max(n.max_diff for n in noisy if n is not None)
    verdict = judge(max(d.max_diff for d in checked), noise, run.tol.logit_floor(scale), run.factor)
    return LogitCheck(checked, tuple(noisy), verdict)


def _logprob_sum(logits: torch.Tensor, picks: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> torch.Tensor:
    """Sum of ``log p(target)`` over ``picks`` of ``(row, predicting columns, targets)`` of ``logits
    [R, L, V]``, in float32 or wider (a float64 model keeps float64)."""
    import torch

    wide = torch.promote_types(logits.dtype, torch.float32)
    total = logits.new_zeros((), dtype=wide)
    for row, columns, targets in picks:
        rows = logits[row, torch.tensor(list(columns), device=logits.device)].to(wide).log_softmax(-1)
        total = total + rows.gather(1, torch.tensor(list(targets), device=logits.device)[:, None]).sum()
    return total


def _shared_prompt_groups(vocab_size: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(0, vocab_size, n).tolist()  # noqa: E731
    return [{"prompt_ids": draw(p), "completion_ids": [draw(c) for c in cs]} for p, cs in SHARED_PROMPT_GROUPS]


def _check_shared_prompt(model: Any, backend: str, groups: list[dict[str, Any]], run: _Run) -> BackendResult:
    """Shared-prompt rows (:class:`padless.RolloutCollator`): every ``prompt + completion`` run alone
    has the logits of its prompt and completion in the packed row, and the summed completion
    log-probs have the same parameter gradients (``run.params``) packed as alone (padded: the noise)."""
    import torch

    from padless.batching.batch import batch_to, forward_inputs
    from padless.batching.preference import RolloutCollator
    from padless.isolation.compare import alone_logits, compare_documents, padded_logits

    name = f"{backend}+shared_prompt"
    skipped = _switch_backend(model, backend, name, run)
    if skipped is not None:
        return skipped
    batch = batch_to(RolloutCollator.for_model(model, dtype=run.dtype)(groups), next(model.parameters()).device)
    pl = batch.placements
    flat = [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]
    docs, packed_picks, alone_picks = [], [], []
    for f, (prompt, comp) in enumerate(flat):
        j = int(np.flatnonzero(pl.feature == f)[0])
        r, o, n, prev = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j]), int(pl.prev_offset[j])
        docs.append(Document(f, (*prompt, *comp), r, (*range(prev + 1 - len(prompt), prev + 1), *range(o, o + n))))
        packed_picks.append((r, [prev, *range(o, o + n - 1)], comp))
        alone_picks.append((f, list(range(len(prompt) - 1, len(prompt) + len(comp) - 1)), comp))
    params = run.params

    def grads(total: torch.Tensor) -> torch.Tensor:
        got = torch.autograd.grad(total, params, allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, got)])

    # each forward once: its logits are compared, its log-probs differentiated
    with _gradients_of(model, params), run.compute():
        packed = model(**forward_inputs(batch)).logits
        padded = padded_logits(model, docs, int(batch["input_ids"].shape[1]))
        alone = [alone_logits(model, d.input_ids) for d in docs]
        sums = (_logprob_sum(packed, packed_picks), _logprob_sum(padded, alone_picks),
                sum(_logprob_sum(a[None], [(0, cols, t)]) for a, (_, cols, t) in zip(alone, alone_picks)))  # fmt: skip
        g_packed, g_padded, g_alone = (grads(total) for total in sums)
    with run.compute():
        logits = compare_documents(
            model, packed, docs, tolerance=run.tol, factor=run.factor, alone=alone, padded=padded
        )
    verdict = judge(
        relative_difference(g_packed, g_alone), relative_difference(g_padded, g_alone), run.tol.grad_rtol, run.factor
    )
    return _result(name, logits, verdict)


def verify_isolation(
    model: Any,
    sequences: Sequence[Sequence[int]] | None = None,
    *,
    backends: Sequence[str] = DEFAULT_BACKENDS,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    check: Check = "sampled",
    seed: int = 0,
    tolerance: Tolerance | None = None,
    autocast: torch.dtype | None = None,
    factor: float = NOISE_FACTOR,
    progress: Progress | None = None,
) -> VerifyReport:
    """Check every backend in ``backends`` on ``model`` (its device and dtype are used as they are).

    ``max_length``: packed row length, capped at the model's positions (:func:`context_length`);
    ``None``: one row holding every sequence. ``check``: ``"sampled"`` or ``"thorough"`` (the table
    in the module docstring). ``sequences``: token-id lists (default: random ids with lengths
    :func:`default_lengths`: for rows of ``max_length``, seeded lengths that fill them, with a
    1-token document and one longer than the model's sliding window if it has one); rows are raised
    to the longest sequence given. ``tolerance``: the absolute floor (default :data:`TOLERANCES` of the
    compute dtype); ``factor``: how many times padding's own noise packed rows may differ (see the
    module docstring). ``autocast``: run every forward under ``torch.autocast`` with this dtype (fp32
    master weights). ``progress``: called with one line per stage as it goes (the model, the rule's
    verdicts, what is sampled, then each check as it starts and ends).
    A row longer than the model's positions raises ``ValueError``. A model whose forward takes no
    ``position_ids`` gets every backend refused, with the reason.
    The model's attention implementation, mode and ``requires_grad`` flags are restored afterwards.
    """
    import torch

    say = progress or (lambda line: None)
    if check not in CHECKS:
        raise ValueError(f"check={check!r} must be one of {', '.join(CHECKS)}")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length={max_length} must be >= 1, or None for one row holding every sequence")
    if factor < 1:
        raise ValueError(f"factor={factor} must be >= 1: packed rows cannot be held below padding's own noise")
    if autocast is not None and autocast not in (torch.bfloat16, torch.float16):
        raise ValueError(f"autocast={autocast} must be torch.bfloat16 or torch.float16")
    facts = model_summary(model)
    requested = max_length
    if max_length is not None and facts.context is not None:
        max_length = min(max_length, facts.context)
    if sequences is None:
        features = random_sequences(default_lengths(model, max_length, check, seed), model.config.vocab_size, seed)
    else:
        features = [{"input_ids": [int(t) for t in s]} for s in sequences]
    if not features or min(len(f["input_ids"]) for f in features) < 1:
        raise ValueError("sequences must be non-empty token-id lists")
    lengths = [len(f["input_ids"]) for f in features]
    if max_length is not None:
        max_length = max(max_length, max(lengths))
    row = max_length if max_length is not None else sum(lengths)
    if facts.context is not None and row > facts.context:
        raise ValueError(
            f"packed rows of {row} tokens exceed the model's {facts.context} positions; "
            "use shorter sequences or a smaller max_length"
        )
    device = next(model.parameters()).device
    if autocast is not None:
        dtype = f"autocast-{dtype_name(autocast)}"
        compute: _Context = lambda: torch.autocast(device.type, dtype=autocast)  # noqa: E731
    else:
        dtype, compute = dtype_name(model.dtype), nullcontext
    tol = tolerance_for(autocast or model.dtype, tolerance)
    if check == "sampled":
        params, scope = sampled_parameters(model)
        padded: tuple[int, ...] = (int(np.argmax(lengths)),)
    else:
        params, scope = [p for p in model.parameters() if p.requires_grad], "every trainable parameter"
        padded = tuple(range(len(features)))
    # next-fit keeps the default documents' order, so each row holds what sample_lengths drew for it;
    # given sequences are planned as training plans them
    strategy = "next_fit" if sequences is None else "best_fit_decreasing"
    coverage = Coverage(
        check,
        lengths,
        _rows(lengths, max_length, strategy),
        max_length,
        requested,
        list(padded),
        None,
        sum(p.numel() for p in params),
        scope,
        seed,
    )

    def report(results: list[BackendResult], alone_on: str | None = None) -> VerifyReport:
        return VerifyReport(
            facts.name,
            dtype,
            str(device),
            lengths,
            max_length,
            results,
            factor,
            facts,
            replace(coverage, alone_on=alone_on),
            tol,
        )

    say(f"{facts.describe()}; {dtype} on {device}")
    refusal = _model_refusal(model)
    if refusal is not None:  # padless' own reason, before any backend (or transformers) is asked
        say(f"rule: refuses every backend: {refusal}")
        return report([BackendResult(b, "refused", detail=refusal) for b in backends])
    target = compute_dtype(model) if autocast is None else autocast
    run = _Run(
        tol,
        factor,
        compute,
        target,
        check,
        params,
        padded,
        max_length,
        strategy,
        _verdicts(model, backends, max_length, target),
    )
    for line in (*_rule_lines(model, backends, run.verdicts, max_length), *coverage.describe(), legend(factor, tol)):
        say(line)
    groups = _shared_prompt_groups(model.config.vocab_size, seed)
    names = [*backends, *(f"{b}+shared_prompt" for b in backends)]
    original = model.config._attn_implementation
    was_training = model.training
    model.eval()  # dropout off: both sides must compute the same function
    results = []
    try:
        for k, name in enumerate(names, 1):
            backend, _, layout = name.partition("+")
            what = (
                f"{len(features)} documents in {_rows_text(coverage.rows, max_length)}"
                if not layout
                else f"{len(groups)} prompts, {sum(len(g['completion_ids']) for g in groups)} completions in one row"
            )
            if run.verdicts[name] is not None:
                say(f"[{k}/{len(names)}] {name}: refused by the rule (reason in the table)")
            else:
                say(f"[{k}/{len(names)}] {name}: packed vs alone vs padded, {what} ...")
            start = time.perf_counter()
            result = (
                _check_shared_prompt(model, backend, groups, run)
                if layout
                else _check_backend(model, backend, features, run)
            )
            if result.status in ("pass", "fail"):
                result = replace(result, seconds=round(time.perf_counter() - start, 2))
                say(f"[{k}/{len(names)}] {name}: {result.status} in {result.seconds:.1f} s")
            elif run.verdicts[name] is None:
                say(f"[{k}/{len(names)}] {name}: {result.status} ({result.detail})")
            results.append(result)
    finally:
        model.set_attn_implementation(original)
        model.train(was_training)
    return report(results, run.alone.backend if run.alone is not None else None)


def _rows(lengths: Sequence[int], max_length: int | None, strategy: str) -> int:
    """Rows the collator's planner packs ``lengths`` into (1 without a row bound)."""
    from padless.planning.plan import plan_packs

    return 1 if max_length is None else plan_packs(lengths, max_length, strategy=strategy).num_rows  # type: ignore[arg-type]


def _rows_text(rows: int, max_length: int | None) -> str:
    return f"{rows} row{'s' if rows != 1 else ''} of {max_length}" if max_length is not None else "one row"


def _rule_lines(
    model: Any, backends: Sequence[str], verdicts: dict[str, str | None], max_length: int | None
) -> list[str]:
    """One line per layout: the backends the rule accepts (with what their rows carry) and refuses."""
    from padless.attention.select import BACKENDS, model_inputs

    lines = []
    for layout, suffix, rows in (("documents", "", max_length), ("shared prompt", "+shared_prompt", None)):
        exact = [f"{b} ({model_inputs(model, b)})" for b in backends if b in BACKENDS and verdicts[b + suffix] is None]
        refused = [b for b in backends if verdicts[b + suffix] is not None]
        where = f"rows of {rows}" if rows is not None else "one row"
        lines.append(
            f"rule (padless.check_exact), {layout} layout, {where}: exact on {', '.join(exact) or 'no backend'}"
            + (f"; refuses {', '.join(refused)}" if refused else "")
        )
    return lines


def _model_refusal(model: Any) -> str | None:
    """Why padless packs for no backend of this model (its forward takes no ``position_ids``), or None."""
    from padless.attention.facts import model_facts as read_facts

    facts = read_facts(model)  # of the model a PEFT wrapper wraps (its forward takes **kwargs)
    if facts.attention_free:  # Mamba, RWKV, xLSTM with patched mixers: position_ids through **kwargs
        return None
    if facts.rules.takes_position_ids is False:
        return (
            f"{facts.base_class}.forward takes no position_ids, so packed documents would be given "
            "positions that run on across document boundaries; padless refuses to pack for it"
        )
    return None
