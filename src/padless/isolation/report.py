"""The verifier's report: what it read of the model, what it ran, and each backend's verdict.

:func:`padless.isolation.verify.verify_isolation` returns a :class:`VerifyReport`: a
:class:`ModelSummary` read before anything runs, the :class:`Coverage` of the check (documents, rows,
the noise reference, the gradients), and one :class:`BackendResult` per backend and layout, with
:func:`legend` saying what the columns mean. The runs that fill it are :mod:`padless.isolation.runs`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from padless.isolation.compare import NOISE_FACTOR, Tolerance

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")
"""Config fields that bound the row length (the first one set is the model's context)."""


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
    """:data:`padless.isolation.verify.Check`."""
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
