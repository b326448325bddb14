"""The engines of ``padless pack``: the same rows on the local engine and on Ray with 1 and 2 workers;
a lost worker is retried; errors come back the same on every engine. One Ray cluster for the module."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import row_documents
from padless.cli import main
from padless.export.engine import LocalEngine, RayEngine, make_engine

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    """One local Ray of 2 CPUs for every test here (starting one takes seconds)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    if started:
        ray.shutdown()


def rows_of(out):
    return [r for p in sorted(Path(out).glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_local_and_ray_with_one_and_two_workers_write_the_same_rows(tmp_path, cluster):
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(np.log(20), 1.0, 3000).astype(int) + 1, 400)
    with open(tmp_path / "in.jsonl", "w") as f:
        for i, n in enumerate(lengths):
            cut = int(rng.integers(0, n))
            f.write(json.dumps({"input_ids": [i] * int(n), "labels": [-100] * cut + [i] * (int(n) - cut)}) + "\n")
    args = ["pack", str(tmp_path / "in.jsonl"), "--max-length", "128", "--overlong", "split", "--rows-per-shard",
            "100", "--shard-rows", "500", "--vocab-size", "5000", "--no-progress"]  # fmt: skip
    runs = {"local": [], "ray1": ["--engine", "ray", "--num-workers", "1"],
            "ray2": ["--engine", "ray", "--num-workers", "2"]}  # fmt: skip
    for name, extra in runs.items():
        assert main([*args, "--out", str(tmp_path / name), *extra]) == 0
    rows = {name: rows_of(tmp_path / name) for name in runs}
    assert rows["local"] == rows["ray1"] == rows["ray2"] and len(rows["local"]) > 100
    files = {name: [p.read_bytes() for p in sorted((tmp_path / name).glob("shard-*.parquet"))] for name in runs}
    assert files["local"] == files["ray1"] == files["ray2"]
    # every input token exactly once (long sequences as consecutive pieces of 128), within 0.05% of the bound
    docs = row_documents(rows["local"])
    by_source: dict[int, int] = {}
    for d in docs:
        assert len(set(d)) == 1 and len(d) <= 128
        by_source[d[0]] = by_source.get(d[0], 0) + len(d)
    assert by_source == {i: int(n) for i, n in enumerate(lengths)}
    summary = json.loads((tmp_path / "ray2" / "summary.json").read_text())
    assert summary["this_run"]["engine"] == "ray" and summary["this_run"]["workers"] == 2
    assert summary["stats"]["relative_gap"] <= 0.0005 and summary["tokens_accounted"]


def _dies_once(marker: str, x: int) -> int:
    """Kills its worker process the first time it runs (a lost worker), then answers."""
    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os._exit(1)
    return x * 10


def _refuses(x: int) -> int:
    if x in (2, 4):
        raise ValueError(f"item {x} is bad")
    return x


@pytest.fixture()
def by_value():
    """Ship this module's functions to the workers by value (they cannot import a test module)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_a_lost_worker_is_retried(tmp_path, cluster, by_value):
    engine = make_engine("ray", 2)
    marker = str(tmp_path / "died")
    assert engine.run(_dies_once, [1, 2, 3], marker) == [10, 20, 30]
    assert Path(marker).read_text() == "died"  # one worker did die


def test_errors_come_back_the_same_on_every_engine(cluster, by_value):
    for engine in (LocalEngine(), RayEngine(2)):
        with pytest.raises(ValueError, match="item 2 is bad"):  # the lowest item's error, whoever finished first
            engine.run(_refuses, [5, 4, 3, 2, 1][::-1])
    with pytest.raises(ValueError, match="unknown engine 'spark'"):
        make_engine("spark")
    with pytest.raises(ValueError, match="need engine='ray'"):
        make_engine("local", 2)
