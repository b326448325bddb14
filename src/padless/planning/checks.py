"""The argument checks every stage shares, so a bad value is refused with the same words everywhere.

- :func:`check_int`: an integer (never a bool) at least ``minimum``; returns it as a plain ``int``.
- :func:`check_choice`: one of a fixed vocabulary (``strategy``, ``overlong``, ``remainder``...).
- :func:`overlong_error`: the error for a sequence longer than ``max_length`` under ``overlong="error"``,
  naming the other policies (``OVERLONG_POLICIES`` in :mod:`padless.planning.plan`).
- :data:`OVERLONG_DEFAULT`: the default policy shared by the planners, the collators, the trainers and
  the command line.

Messages name the argument (``max_length``), never a command-line flag: the CLI translates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np

OVERLONG_DEFAULT: Final = "error"  # Final: type checkers read it as Literal["error"], a valid OverlongPolicy
"""What a sequence longer than ``max_length`` does unless told otherwise, everywhere (planners,
collators, trainers, ``padless stats`` and ``padless pack``): refuse it, naming the other policies,
so nothing is cut or lost without being asked for."""


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """``value`` as an ``int`` if it is an integer (numpy ones included, bools not) ``>= minimum``,
    else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_choice(value: object, choices: Iterable[str], what: str) -> str:
    """``value`` if it is one of ``choices``, else ``ValueError``: ``unknown {what} 'x'; choose one of ...``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
    return value  # type: ignore[return-value]


def overlong_error(
    index: int, length: int, max_length: int, *, more: int = 0, what: str = "sequence", numbered: bool = False
) -> ValueError:
    """The error for ``what`` at ``index`` (0-based; ``numbered``: already a number counted from 1, a
    file's line) of ``length`` tokens over ``max_length`` (``more``: how many other ones are too long as
    well); the caller raises it. Sequences are counted from 1, as a person counts records."""
    also = f" (and {more} more)" if more else ""
    return ValueError(
        f"{what} {index if numbered else index + 1} has length {length}, longer than max_length {max_length}{also}; "
        "choose overlong='truncate', 'split' or 'drop'"
    )


def integer_array(values: object, name: str, unit: str = "") -> np.ndarray:
    """``values`` as a one-dimensional int64 array, or ``ValueError`` naming ``name`` and the first bad
    entry (booleans, non-integral floats, other dtypes); ``unit`` is said in the messages ("image
    patches"). The caller checks the range."""
    arr = np.asarray(values)
    said = f" ({unit})" if unit else ""
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        raise ValueError(f"{name} must be integers{said}, got booleans")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise ValueError(f"{name} must be integers: {name}[{bad[0]}] = {float(arr[bad[0]])!r}")
    elif arr.dtype.kind not in "iu" and arr.size:
        raise ValueError(f"{name} must be integers{said}, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)
