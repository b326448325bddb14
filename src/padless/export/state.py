"""What ``padless pack`` keeps in its output folder so that a rerun never loses or mixes data.

- ``.lock``: created exclusively at the start of a run, removed at its end; it names the holder
  (host, process id, start time). A second run into the same folder is refused with that name; a
  lock whose process is gone (same host, no such pid) is taken over.
- ``state.json``: the job (the input's content fingerprint and every flag that changes the rows), the
  plan's hash, and for each finished output shard its rows, tokens and BLAKE2b checksum. A rerun with
  another job is refused naming the first difference (``overwrite`` starts over); a finished shard
  that is missing or whose checksum fails is rewritten.
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
                if holder.get("host") == me["host"] and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
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


def check_job(out: Path, job: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """The saved state of an earlier run into ``out`` with the same job, None for a fresh start.

    A state made with another job is refused naming the first difference, unless ``overwrite``, which
    removes the earlier run's files (shards, state, summary, work folder) and starts over."""
    state_path = out / STATE_FILE
    if not state_path.exists():
        if any(out.glob("shard-*.parquet")) and not overwrite:
            raise ValueError(f"out={out} holds shards but no {STATE_FILE}: not a resumable packing; use an empty "
                             "folder, or overwrite=True to replace them")  # fmt: skip
        clear(out)
        return None
    try:
        state = json.loads(state_path.read_text())
        saved = state["job"]
    except (json.JSONDecodeError, KeyError, TypeError):
        if overwrite:
            clear(out)
            return None
        raise ValueError(f"out={out}: {STATE_FILE} is not a padless packing state; use an empty folder "
                         "(or overwrite=True)") from None  # fmt: skip
    for key, value in job.items():
        if saved.get(key) != value:
            if overwrite:
                clear(out)
                return None
            raise ValueError(f"out={out} holds a packing made with {key}={saved.get(key)!r}, not {value!r}; rerun "
                             "with the same options, choose another out, or overwrite=True to start over")  # fmt: skip
    return state


def clear(out: Path) -> None:
    """Remove what a packing wrote into ``out`` (never anything else)."""
    for p in [*out.glob("shard-*.parquet"), *out.glob(".shard-*.tmp"), out / STATE_FILE, out / SUMMARY_FILE]:
        p.unlink(missing_ok=True)
    shutil.rmtree(out / WORK, ignore_errors=True)
