"""``python -m padless.cli.assets [--fetch]``: where each offline asset is, and the one-time fetch of the
asset that is not a package (the vaderSentiment snippets; see :mod:`padless.data.assets`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_assets_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fetch", action="store_true", help="fetch and unpack the assets that are not packages")
    parser.add_argument(
        "--sdist", type=Path, help="use this vaderSentiment sdist instead of downloading it (default: download it)"
    )


def run_assets(args: argparse.Namespace) -> int:
    from padless.data.assets import VADER_FILES, cache_root, check_packages, fetch_vader, vader_dir

    print(f"cache root: {cache_root()}")
    ok = check_packages(log=print)
    if args.fetch:
        fetch_vader(sdist=args.sdist, log=print)
    else:
        present = all((vader_dir() / n).is_file() for n in VADER_FILES.values())
        print(f"vader snippets: {'present' if present else 'missing; use --fetch'} in {vader_dir()}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    from padless.cli._shared import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="python -m padless.cli.assets",
        formatter_class=HelpFormatter,
        description="where each offline asset is; --fetch gets the one that is not a package",
    )
    add_assets_arguments(parser)
    return run_assets(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
