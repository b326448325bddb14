"""Who runs the stages of ``padless pack``: this process (``local``) or Ray tasks (``ray``).

Both run the same functions (:mod:`padless.export.stages`) on the same shards, so the files they
write are the same; only where and how many at once differ. An engine's :meth:`run` calls
``fn(*shared, item)`` for every item and hands each result to ``done`` as it arrives (then lets it
go: a driver of 15,000 shards keeps what it needs of each, not every result), or returns the results
in item order when no ``done`` is given.

Why Ray tasks and not Ray Data: the stages are a map over *our* logical shards with one marker per
shard (what a resume checks), then a barrier (the plan), then a map over output shards that each read
many token shards. Ray Data re-blocks its input, names and orders the files it writes itself, and
hides which block became which file, so neither the deterministic placement nor the per-shard
markers would survive it. A task per shard keeps both, and Ray still gives the scheduling, the
object store for the shared arguments (the input description and the plan) and retries.

Errors: a ``ValueError`` raised by a stage (a bad record) is returned as a value and re-raised on the
driver, the lowest item's error first, so a run reports the same error on any engine. A worker
process that dies (killed, out of memory, a lost node) is retried by Ray (``max_retries``) on another
worker: the stages only write whole files under fixed names (:mod:`padless.atomic`), so running one
twice is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from padless._optional import require

ENGINES = ("local", "ray")
MAX_RETRIES = 3
"""Times Ray reruns a task whose worker died."""


def _guarded(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except ValueError as err:
        return "error", str(err)


class LocalEngine:
    """Every task in this process, one after another, in item order."""

    name = "local"
    workers = 1

    def run(
        self, fn: Callable[..., Any], items: Sequence[Any], *shared: Any, done: Callable[[Any, Any], None] | None = None
    ) -> list[Any]:
        out = []
        for item in items:
            result = fn(*shared, item)
            if done is not None:
                done(item, result)
            else:
                out.append(result)
        return out

    def close(self) -> None:
        pass


class RayEngine:
    """Tasks on a Ray cluster: a local one of ``num_workers`` CPUs, or the cluster at ``address``
    (``ray start``, KubeRay; ``auto`` for the cluster this process runs in), at most ``num_workers``
    tasks at once."""

    name = "ray"

    def __init__(self, num_workers: int | None = None, address: str | None = None) -> None:
        ray = require("ray", "--engine ray")
        self.ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if address:
                ray.init(address=address, **kwargs)
            else:
                ray.init(num_cpus=num_workers or None, **kwargs)
        self.workers = num_workers or int(ray.cluster_resources().get("CPU", 1))
        self._remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(_guarded)

    def run(
        self, fn: Callable[..., Any], items: Sequence[Any], *shared: Any, done: Callable[[Any, Any], None] | None = None
    ) -> list[Any]:
        ray = self.ray
        refs = [ray.put(x) for x in shared]  # sent once, not once per task
        pending: dict[Any, int] = {}
        results: dict[int, tuple[str, Any]] = {}
        queue = list(enumerate(items))
        queue.reverse()
        while queue or pending:
            while queue and len(pending) < self.workers:
                i, item = queue.pop()
                pending[self._remote.remote(fn, *refs, item)] = i
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                status, value = ray.get(ref)
                if status == "ok" and done is not None:
                    done(items[i], value)
                else:
                    results[i] = (status, value)
        errors = [results[i][1] for i in sorted(results) if results[i][0] == "error"]
        if errors:
            raise ValueError(errors[0])
        return [] if done is not None else [results[i][1] for i in range(len(items))]

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()


def make_engine(engine: str, num_workers: int | None = None, address: str | None = None) -> LocalEngine | RayEngine:
    """The engine named ``engine`` (``local`` or ``ray``)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if engine == "local":
        if num_workers not in (None, 1) or address:
            raise ValueError("num_workers and ray_address need engine='ray' (the local engine runs in this process)")
        return LocalEngine()
    return RayEngine(num_workers, address)
