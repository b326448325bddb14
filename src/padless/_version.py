"""padless' version, read once from the installed package's metadata (pyproject.toml is its one source).

Every module that records or prints the version (``padless.__version__``, the cache keys of
``pack_dataset``, the benchmark's results, ``padless --version``) reads ``__version__`` here, a
floor module that imports nothing of padless, so no stage imports the top-level package for it. It is
read on first use (this module's ``__getattr__``), not at import: ``importlib.metadata`` alone takes
about 30 ms to import, three times what ``import padless`` takes without it.

Where no metadata names padless (a source tree put on ``sys.path`` without ``pip install``), the
version is read from the ``pyproject.toml`` two folders above this file if there is one, else it is
:data:`UNKNOWN`.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

DISTRIBUTION = "padless"
UNKNOWN = "0+unknown"
"""The version when neither metadata nor a source tree's pyproject.toml gives one (PEP 440 local)."""

_PROJECT_VERSION = re.compile(r'^\[project\][^\[]*?^version\s*=\s*"([^"]+)"', re.MULTILINE | re.DOTALL)


def source_tree_version(pyproject: Path) -> str | None:
    """``[project] version`` of ``pyproject`` (a ``pyproject.toml`` file), or None if it has none or
    is not there. A regular expression, not ``tomllib``: Python 3.10 has no TOML reader."""
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    found = _PROJECT_VERSION.search(text)
    return found.group(1) if found else None


def read_version(distribution: str = DISTRIBUTION, pyproject: Path | None = None) -> str:
    """The installed ``distribution``'s version; else ``pyproject``'s (by default the source tree's
    ``pyproject.toml`` beside ``src/``); else :data:`UNKNOWN`."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pass
    if pyproject is None:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    return source_tree_version(pyproject) or UNKNOWN


@cache
def version() -> str:
    """padless' version (:func:`read_version`), read once."""
    return read_version()


__version__: str  # resolved by __getattr__ on first use


def __getattr__(name: str) -> str:
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
