"""Lazy re-exports: a package's public names, each imported from its module on first use.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, moved=_MOVED)

``table`` (public name -> the module that defines it) is the package's face: listed in ``__all__``
and ``dir()``, resolved once, then cached in the package. ``moved`` (former public name -> its home)
holds names that left the face: they still resolve, each access with a ``DeprecationWarning`` naming
the home (not cached, so every use is told), and are listed nowhere. Importing this module imports
nothing of padless, so ``import padless`` stays free of torch.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    module_name: str, table: Mapping[str, str], moved: Mapping[str, str] | None = None, extra: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for the package ``module_name``; ``extra``: names the package
    defines itself (``__version__``), listed in ``__all__`` too."""
    moved = dict(moved or {})
    both = sorted(set(table) & set(moved))
    if both:
        raise ValueError(f"moved: {both} are also in table; a name is public or moved, not both")
    public = sorted([*table, *extra])

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
            setattr(sys.modules[module_name], name, value)  # resolve once
            return value
        home = moved.get(name)
        if home is not None:  # this function is the package's __getattr__: stacklevel=2 is the line that asked
            warnings.warn(
                f"{module_name}.{name} moved: import it from {home} ({module_name}.{name} is deprecated)",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(home), name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return list(public)

    return __getattr__, __dir__, public
