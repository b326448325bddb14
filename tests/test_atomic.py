"""Atomic writes (padless.atomic): a file or folder appears whole under its name, or not at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from padless.atomic import atomic_write, atomic_write_text, write_folder_atomically
from padless.planning.plan import PackPlan, plan_packs


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = atomic_write_text(tmp_path / "sub" / "state.json", "old")
    assert path.read_text() == "old"

    def half(f):  # type: ignore[no-untyped-def]
        f.write(b"new, but cut sh")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half)
    assert path.read_text() == "old"
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_folder_is_kept_unless_replaced(tmp_path: Path) -> None:
    target = tmp_path / "assets"
    write_folder_atomically(target, lambda d: (d / "a.txt").write_text("1"))
    write_folder_atomically(target, lambda d: (d / "a.txt").write_text("2"))  # another process won: kept
    assert (target / "a.txt").read_text() == "1"
    write_folder_atomically(target, lambda d: (d / "b.txt").write_text("3"), replace=True)
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    with pytest.raises(ValueError, match="boom"):
        write_folder_atomically(tmp_path / "x", lambda d: (_ for _ in ()).throw(ValueError("boom")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assets"]


def test_plan_save_appends_npz_like_numpy(tmp_path: Path) -> None:
    plan = plan_packs([5, 3, 6, 2], 8)
    plan.save(str(tmp_path / "plan"))
    again = PackPlan.load(str(tmp_path / "plan.npz"))
    assert np.array_equal(again.index, plan.index) and again.stats == plan.stats
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.npz"]


def test_an_atomic_file_gets_the_permissions_of_a_plain_open(tmp_path):
    import os

    from padless.atomic import atomic_write_text

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    written = atomic_write_text(tmp_path / "atomic.txt", "x")
    assert os.stat(written).st_mode & 0o777 == os.stat(plain).st_mode & 0o777
