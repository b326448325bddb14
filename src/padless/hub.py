"""Names that are not built in: a local folder, the model hub's cache, or the hub itself, failing fast.

transformers retries an unreachable model hub for 25-50 s and then raises an ``OSError`` with a long
traceback. :func:`from_pretrained` instead tries, in order: a local folder; the hub cache on disk
(``local_files_only=True``, no network); and the hub, but only after a TCP connection to it succeeded
within :data:`CONNECT_TIMEOUT_S` (and never with ``HF_HUB_OFFLINE=1``). Anything that fails raises a
``ValueError`` that lists the built-in names and says how to pass a local folder.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

CONNECT_TIMEOUT_S = 3.0
"""How long the reachability check of the model hub waits (name lookup and TCP connect)."""


def hub_reachable(timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the model hub's endpoint opens within ``timeout`` seconds."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
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


def from_pretrained(load: Callable[..., Any], name: str, what: str, builtin: Sequence[str], **kwargs: Any) -> Any:
    """``load(name, **kwargs)`` (a transformers ``from_pretrained``) local-first, failing within seconds.

    ``what`` ("model", "tokenizer") and ``builtin`` (the names padless knows itself) word the error.
    """
    path = Path(name).expanduser()
    known = ", ".join(builtin)
    hint = (f"a {what} name is one of the built-in names ({known}), a local folder saved with "
            f"save_pretrained (config.json{', tokenizer files' if what == 'tokenizer' else ', weights'}), "
            "or a model-hub name when the hub can be reached")
    if path.exists():
        try:
            return load(str(path), **kwargs)
        except (OSError, ValueError) as err:
            raise ValueError(f"{what} folder {name!r} does not load: {_first_line(err)}") from None
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep + os.sep in name:
        raise ValueError(f"{what} {name!r}: no such folder; {hint}")
    try:
        return load(name, local_files_only=True, **kwargs)  # the hub cache on disk, no network
    except (OSError, ValueError):
        pass
    if not hub_reachable():
        raise ValueError(f"unknown {what} {name!r}: not built in, not a local folder, not in the hub cache, "
                         f"and the model hub cannot be reached; {hint}")  # fmt: skip
    try:
        return load(name, **kwargs)
    except (OSError, ValueError) as err:
        raise ValueError(f"{what} {name!r} did not load from the model hub: {_first_line(err)}; {hint}") from None


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
