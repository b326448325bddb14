"""Atomic writes: a file or a folder appears whole under its name, or not at all.

Everything padless writes that a later run reads back (Parquet shards and ``state.json`` of ``padless
pack``, the token cache, saved plans, benchmark results, the offline asset folders) goes through here,
so a crash or a full disk never leaves a half-written file under a name that a reader trusts:

- :func:`atomic_write`: ``write(file)`` into a hidden temporary file beside ``path`` (``.NAME.*.tmp``,
  unique per writer), flushed and fsynced, renamed over ``path``, then the folder fsynced so the
  rename itself survives a power cut.
- :func:`atomic_write_text`: the same for a string.
- :func:`write_folder_atomically`: ``fill(folder)`` on a hidden temporary folder beside ``target``,
  then one rename.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(f)`` on a binary file that becomes ``path`` only once it is complete and on disk.

    Creates the parent folder. A reader sees the old file or the new one, never a partial one; a
    temporary file cut short by a crash is named ``.NAME.*.tmp`` (hidden). Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.chmod(f.fileno(), 0o666 & ~_umask())  # mkstemp makes 0600; a plain open() obeys the umask
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_folder_atomically(target: Path, fill: Callable[[Path], object], *, replace: bool = False) -> None:
    """Call ``fill(tmp)`` on a fresh folder beside ``target``, then rename it to ``target``, so a crash
    never leaves a half-written folder. If ``target`` exists (another process made it meanwhile) it
    is kept, unless ``replace`` (then the old one is removed just before the rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(tmp)
        if target.exists() and not replace:
            shutil.rmtree(tmp)
            return
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(target.parent)
