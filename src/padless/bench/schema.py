"""Checking decoded JSON against frozen dataclasses, and building them from it.

The results file's schema is its dataclasses (:mod:`padless.bench.results`); this module holds the
generic part: :func:`check` lists every missing or ill-typed field with its path, :func:`from_plain`
rebuilds the dataclasses (lists become tuples). A field that has a default may be missing: files
written before the field existed stay readable.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    names = {tuple: "list", dict: "object", float: "number"}
    return names.get(typing.get_origin(tp) or tp, getattr(tp, "__name__", str(tp)))


def check(value: Any, tp: Any, path: str, problems: list[str]) -> None:
    """Append to ``problems`` where ``value`` (decoded json) does not match type ``tp``."""
    where = path or "results"
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"{where}: expected an object, got {type(value).__name__}")
            return
        optional = {f.name for f in dataclasses.fields(tp) if _has_default(f)}
        for name, ftp in typing.get_type_hints(tp).items():
            sub = f"{path}.{name}" if path else name
            if name not in value:
                if name not in optional:  # a field added later, with a default: older files lack it
                    problems.append(f"{sub}: missing")
            else:
                check(value[name], ftp, sub, problems)
    elif origin in (typing.Union, types.UnionType):
        trial: list[str] = []
        for alt in typing.get_args(tp):
            trial = []
            check(value, alt, path, trial)
            if not trial:
                return
        problems.append(f"{where}: expected {type_name(tp)}, got {json.dumps(value)[:40]}")
    elif origin is Literal:
        if value not in typing.get_args(tp):
            problems.append(f"{where}: expected {type_name(tp)}, got {json.dumps(value)[:40]}")
    elif origin is tuple:
        if not isinstance(value, list):
            problems.append(f"{where}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check(item, typing.get_args(tp)[0], f"{path}[{i}]", problems)
    elif origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{where}: expected an object, got {type(value).__name__}")
            return
        for key, item in value.items():
            check(item, typing.get_args(tp)[1], f"{path}.{key}", problems)
    else:
        ok = {
            bool: isinstance(value, bool),
            int: isinstance(value, int) and not isinstance(value, bool),
            float: isinstance(value, (int, float)) and not isinstance(value, bool),
            str: isinstance(value, str),
            type(None): value is None,
        }.get(tp)
        if ok is None:  # pragma: no cover - a schema type this checker does not know
            raise TypeError(f"cannot validate type {tp!r} at {where}")
        if not ok:
            problems.append(f"{where}: expected {type_name(tp)}, got {json.dumps(value)[:40]}")


def from_plain(tp: Any, value: Any) -> Any:
    """Build ``tp`` from validated json (lists -> tuples, objects -> dataclasses; extra keys such as
    the derived sections are dropped)."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{name: from_plain(hints[name], value[name]) for name in hints if name in value})
    origin = typing.get_origin(tp)
    if origin is tuple:
        return tuple(from_plain(typing.get_args(tp)[0], v) for v in value)
    if origin is dict:
        return {k: from_plain(typing.get_args(tp)[1], v) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType) and value is not None:
        # every union in this schema is "X | None"
        return from_plain(next(a for a in typing.get_args(tp) if a is not type(None)), value)
    if tp is float and value is not None:
        return float(value)
    return value
