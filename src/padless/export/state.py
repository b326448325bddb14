"""What ``padless pack`` keeps in its output folder so that a rerun never loses or mixes data.

- ``.lock``: created exclusively at the start of a run, removed at its end; it names the holder
  (host, process id, start time). A second run into the same folder is refused with that name; a
  lock whose process is gone (same host, no such pid) is taken over.
- ``state.json``: the job (the input's content fingerprint and every flag that changes the rows), the
  plan's hash, and for each finished output shard its rows, tokens and BLAKE2b checksum. A rerun with
  another job is refused with every difference (:class:`JobMismatch`; ``overwrite`` starts over); a
  finished shard that is missing or whose checksum fails is rewritten.

A folder padless wrote is one with a ``state.json`` (written before anything else). A folder without
one that holds anything (but a lock) is someone else's and is refused, naming it; ``overwrite`` packs
into it anyway, replacing only the names padless writes (:func:`clear`) and keeping every other file.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

STATE_FILE, SUMMARY_FILE, LOCK_FILE, WORK = "state.json", "summary.json", ".lock", ".work"
INPUT_OPTIONS = ("synthetic", "tokenizer", "train_on", "system_prompt", "vocab_size", "seed")
"""Keys of an input's key that are options of the packing; its other keys fingerprint its content."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class FolderLock:
    """An exclusive lock on an output folder, naming its holder (a context manager)."""

    def __init__(self, out: Path) -> None:
        self.path = out / LOCK_FILE
        self.held = False

    def __enter__(self) -> FolderLock:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    holder = json.loads(self.path.read_text())
                except (OSError, ValueError):
                    holder = {}
                if (
                    holder.get("host") == me["host"]
                    and isinstance(holder.get("pid"), int)
                    and not _alive(holder["pid"])
                ):
                    self.path.unlink(missing_ok=True)  # its process is gone: a stale lock
                    continue
                raise ValueError(
                    f"out={self.path.parent} is being written by another padless pack (pid {holder.get('pid', '?')} on "
                    f"host {holder.get('host', '?')}, since {holder.get('started', '?')}); wait for it to finish, or "
                    f"delete {self.path} if that run is gone"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise ValueError(f"could not take the lock {self.path}")

    def __exit__(self, *exc: Any) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


class JobMismatch(ValueError):
    """A rerun into a folder that holds a packing made with another job. ``changes``: every
    ``(argument, was, now)`` that differs; ``input`` for the input's content (its fingerprint)."""

    def __init__(self, out: Path, changes: list[tuple[str, Any, Any]]) -> None:
        self.out, self.changes = out, changes
        said = "; ".join(f"{name} was {was!r}, now {now!r}" for name, was, now in changes)
        super().__init__(
            f"out={out} holds a packing made with other options ({said}); rerun with the same "
            "options, choose another out, or overwrite=True to start over"
        )


def job_changes(saved: dict[str, Any], job: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every ``(argument, was, now)`` between a saved job and this one, in the job's order; the input's
    options (:data:`INPUT_OPTIONS`) each by name, a change of its content as one ``input`` change."""
    changes = []
    for key, value in job.items():
        was = saved.get(key)
        if key == "input" and isinstance(value, dict) and isinstance(was, dict):
            content = [k for k in {**was, **value} if k not in INPUT_OPTIONS and was.get(k) != value.get(k)]
            if content:
                changes.append(("input", {k: was.get(k) for k in content}, {k: value.get(k) for k in content}))
            changes += [(k, was.get(k), value.get(k)) for k in INPUT_OPTIONS if was.get(k) != value.get(k)]
        elif was != value:
            changes.append((key, was, value))
    return changes


def check_job(out: Path, job: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """The saved state of an earlier run into ``out`` with the same job, None for a fresh start.

    A state made with another job is refused with every difference (:class:`JobMismatch`), and a
    folder without a state that holds anything but a lock is refused naming what it holds, unless
    ``overwrite``, which removes what padless wrote (shards, state, summary, work folder) and starts
    over, keeping every other file."""
    state_path = out / STATE_FILE
    if not state_path.exists():
        held = [p.name for p in sorted(out.iterdir()) if p.name != LOCK_FILE]
        if held and not overwrite:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise ValueError(
                f"out={out} is not empty and has no {STATE_FILE}, so padless pack did not write it (it "
                f"holds {shown}); choose a new or empty folder, or overwrite=True to pack into it "
                "(files named like padless' own are replaced, other files are kept)"
            )
        clear(out)
        return None
    try:
        state = json.loads(state_path.read_text())
        saved = state["job"]
    except (json.JSONDecodeError, KeyError, TypeError):
        if overwrite:
            clear(out)
            return None
        raise ValueError(
            f"out={out}: {STATE_FILE} is not a padless packing state; use an empty folder (or overwrite=True)"
        ) from None
    changes = job_changes(saved, job)
    if changes:
        if overwrite:
            clear(out)
            return None
        raise JobMismatch(out, changes)
    return state


def clear(out: Path) -> None:
    """Remove what a packing wrote into ``out`` (never anything else)."""
    for p in [*out.glob("shard-*.parquet"), *out.glob(".shard-*.tmp"), out / STATE_FILE, out / SUMMARY_FILE]:
        p.unlink(missing_ok=True)
    shutil.rmtree(out / WORK, ignore_errors=True)
