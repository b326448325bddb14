"""Optional dependencies: which ``padless[extra]`` provides a package, and one import helper that says so.

The core (planning, collators, attention, loss, verify, models) needs numpy, torch and transformers
only. The rest comes with an extra (``pyproject.toml``); a module imports it where it is used, through
:func:`require`, so ``import padless`` never needs an extra and a missing one is named in the error.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS: dict[str, str] = {
    "datasets": "data",
    "pyarrow": "data",
    "matplotlib": "bench",
    "gguf": "bench",
    "PIL": "vision",
    "accelerate": "trainer",
    "trl": "trl",
    "peft": "peft",
    "ray": "ray",
}
"""Top-level package -> the padless extra that installs it."""


DISTRIBUTIONS: dict[str, str] = {"PIL": "pillow"}
"""Import name -> the distribution an extra lists, where they differ."""


def require(module: str, purpose: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"pyarrow.parquet"``), or raise ``ImportError`` naming the extra that
    installs it; ``purpose`` says what needed it."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if top not in EXTRAS or (exc.name is not None and exc.name.split(".")[0] != top):
            raise  # not a missing optional package: a real error inside it
        extra = EXTRAS[top]
        what = f"{purpose} needs" if purpose else "this needs"
        raise ImportError(
            f"{what} the optional package {top!r}; install it with: pip install 'padless[{extra}]'"
        ) from exc
