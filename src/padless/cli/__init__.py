"""The ``padless`` command line: a table of subcommands, each a thin wrapper over one library call.

Every subcommand is one module of this package, ``padless.cli.<command>``, with two functions:
``add_<command>_arguments(parser)`` and ``run_<command>(args) -> int`` (the exit status). A module is
imported only when its subcommand is chosen, so ``padless --help`` is instant. Only this package
knows flags, argparse and printing; the library raises errors that name arguments.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "stats": ("padless.cli.stats", "length distribution, plan statistics and padding a batch would waste"),
    "plan": ("padless.cli.plan", "plan packed rows for a lengths file and save the plan"),
    "verify": ("padless.cli.verify", "check that packed rows are isolated and train like padded ones"),
    "bench": ("padless.cli.bench", "fine-tune with padding, bucketing and packing; measure and report"),
    "report": ("padless.cli.report", "redraw the plots and report.html from a results.json"),
    "pack": ("padless.cli.pack", "tokenize and pack a dataset into Parquet shards of packed rows"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="padless", description=__doc__.splitlines()[0])
    from padless import __version__

    parser.add_argument("--version", action="version", version=f"padless {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name in argv:  # only the chosen subcommand's module is imported to build its flags
            getattr(importlib.import_module(module), f"add_{name}_arguments")(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        return int(getattr(module, f"run_{args.command}")(args) or 0)
    except ValueError as exc:  # bad input: a clear message, no traceback
        print(f"padless {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
