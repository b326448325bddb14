"""Names that are not built in: a local folder, the model hub's cache, or the hub itself, failing fast.

transformers retries an unreachable model hub for 25-50 s and then raises an ``OSError`` with a long
traceback. :func:`from_pretrained` instead tries, in order: a local folder; the hub cache on disk
(``local_files_only=True``, no network); and the hub, but only after a TCP connection to it succeeded
within :data:`CONNECT_TIMEOUT_S`. It makes no request at all with ``HF_HUB_OFFLINE=1``, nor for a name
without an owner (``org/name``) on a machine with no hub cache (:func:`hub_cache_dir`): such a name is
an unknown one, not a first download. Anything that fails raises a ``ValueError`` that lists the
built-in names and says how to pass a local folder.

A model loader must honour ``local_files_only`` itself: ``AutoModelForCausalLM.from_pretrained`` (in the
transformers version :mod:`padless.attention.transformers_compat` names) looks up ``adapter_config.json``
on the hub even then, unless it also gets ``adapter_kwargs={"local_files_only": True}``
(:func:`padless.models.factory.build_model` passes it).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

CONNECT_TIMEOUT_S = 1.5
"""How long the reachability check of the model hub waits (name lookup and TCP connect): an unknown
name fails within 2 s even where the network drops packets."""


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set, now or when ``huggingface_hub`` was imported."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def hub_cache_dir() -> Path:
    """The model hub's cache folder, read from the environment now (``HF_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``);
    it may not exist."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def hub_reachable(timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the model hub's endpoint opens within ``timeout`` seconds."""
    from huggingface_hub import constants

    if hub_offline():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    ok: list[bool] = []

    def probe() -> None:  # in a thread: the name lookup has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(ok)


def _hint(what: str, builtin: Sequence[str]) -> str:
    return (
        f"a {what} name is one of the built-in names ({', '.join(builtin)}), a local folder saved with "
        f"save_pretrained (config.json{', tokenizer files' if what == 'tokenizer' else ', weights'}), "
        "or a model-hub name when the hub can be reached"
    )


def _offline_reason() -> str:
    return "the model hub cannot be reached; HF_HUB_OFFLINE is set, and a model-hub name needs network; "


def check_name(name: str, what: str, builtin: Sequence[str]) -> None:
    """Raise the ``ValueError`` of :func:`from_pretrained` for a name that can only be unknown, reading
    nothing but the file system (no transformers, no network): a path that does not exist, or a name
    without an owner (``org/name``) on a machine with no hub cache. Other names pass."""
    if Path(name).expanduser().exists():
        return
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name:
        raise ValueError(f"{what} {name!r}: no such folder; {_hint(what, builtin)}")
    cache = hub_cache_dir()
    if "/" not in name and not cache.is_dir():  # nothing to look up on disk: not even a cache-only load
        why = _offline_reason() if hub_offline() else "a model-hub name ('org/name') needs network; "
        raise ValueError(
            f"unknown {what} {name!r}: not built in, not a local folder, and this machine has no "
            f"model-hub cache ({cache}); {why}{_hint(what, builtin)}"
        )


def from_pretrained(load: Callable[..., Any], name: str, what: str, builtin: Sequence[str], **kwargs: Any) -> Any:
    """``load(name, **kwargs)`` (a transformers ``from_pretrained``) local-first, failing within seconds.

    ``what`` ("model", "tokenizer") and ``builtin`` (the names padless knows itself) word the error.
    """
    path = Path(name).expanduser()
    hint = _hint(what, builtin)
    if path.exists():
        try:
            return load(str(path), **kwargs)
        except (OSError, ValueError) as err:
            raise ValueError(f"{what} folder {name!r} does not load: {_first_line(err)}") from None
    check_name(name, what, builtin)
    try:
        return load(name, local_files_only=True, **kwargs)  # the hub cache on disk, no network
    except (OSError, ValueError):
        pass
    if hub_offline():
        raise ValueError(
            f"unknown {what} {name!r}: not built in, not a local folder, not in the hub cache, and "
            f"{_offline_reason()}{hint}"
        )
    if not hub_reachable():
        raise ValueError(
            f"unknown {what} {name!r}: not built in, not a local folder, not in the hub cache, "
            f"and the model hub cannot be reached; {hint}"
        )
    try:
        return load(name, **kwargs)
    except (OSError, ValueError) as err:
        raise ValueError(f"{what} {name!r} did not load from the model hub: {_first_line(err)}; {hint}") from None


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
