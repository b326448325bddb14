"""The padless command line: a table of subcommands, each a thin wrapper over one library call.

Every subcommand is one module of this package, ``padless.cli.<command>``, with two functions:
``add_<command>_arguments(parser)`` and ``run_<command>(args) -> int`` (the exit status). A module is
imported only when its subcommand is chosen, so ``padless --help`` is instant. Only this package
knows flags, argparse and printing; the library raises errors that name arguments. Every
subcommand's ``--help`` shows each flag's default (:class:`HelpFormatter`).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import NoReturn

from padless.cli._shared import INT_MAX, HelpFormatter, as_flags, int_in, plain

__all__ = ["COMMANDS", "EXIT_BROKEN_PIPE", "EXIT_ERROR", "EXIT_INTERRUPTED", "INT_MAX", "HelpFormatter", "as_flags",
           "build_parser", "int_in", "main", "plain"]  # fmt: skip

EXIT_ERROR = 2
"""Exit status of a bad input or an expected failure (one line on stderr, no traceback)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it."""
EXIT_BROKEN_PIPE = 141
"""Exit status when the reader of the output went away (``padless stats | head``): 128 + SIGPIPE."""

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "stats": ("padless.cli.stats", "length distribution, plan statistics and padding a batch would waste"),
    "plan": ("padless.cli.plan", "plan packed rows for a lengths file and save the plan"),
    "verify": ("padless.cli.verify", "check that packed rows are isolated and train like padded ones"),
    "bench": ("padless.cli.bench", "fine-tune with padding, bucketing and packing; measure and report"),
    "report": ("padless.cli.report", "redraw the plots and report.html from a results.json"),
    "pack": ("padless.cli.pack", "tokenize and pack a dataset into Parquet shards of packed rows"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="padless", description=plain(__doc__.splitlines()[0]), formatter_class=HelpFormatter)
    from padless._version import __version__

    parser.add_argument("--version", action="version", version=f"padless {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        p.set_defaults(_module=module)
        if name in argv:  # only the chosen subcommand's module is imported to build its flags
            getattr(importlib.import_module(module), f"add_{name}_arguments")(p)
    return parser


def _os_message(exc: OSError) -> str:
    """One line for a failed file operation: what went wrong and on which path."""
    where = f": {exc.filename}" if exc.filename else ""
    reason = exc.strerror or str(exc)
    hint = {
        errno.EACCES: " (no permission: choose a folder you can write to)",
        errno.EROFS: " (read-only file system)",
        errno.ENOTDIR: " (a path component is a file, not a folder)",
        errno.ENOSPC: " (the disk is full)",
    }.get(exc.errno or 0, "")
    return f"{reason}{where}{hint}"


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; every expected failure becomes one line on stderr and a non-zero exit.

    Returns the exit status (it never raises ``SystemExit``): a usage error (argparse) exits with
    :data:`EXIT_ERROR` too. Bad input (``ValueError``, ``OverflowError``), a file that cannot be read or written
    (``OSError``) and too little memory exit with :data:`EXIT_ERROR`; Ctrl-C exits with
    :data:`EXIT_INTERRUPTED`, and a reader that closed the output (``| head``) with :data:`EXIT_BROKEN_PIPE`,
    silently. Anything else is a bug in padless and keeps its traceback.
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed: its status
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    prefix = f"padless {args.command}: error:"
    try:
        module = importlib.import_module(args._module)
        status = int(getattr(module, f"run_{args.command}")(args) or 0)
        sys.stdout.flush()  # here, so that a reader gone away is seen below and not at exit
        return status
    except KeyboardInterrupt:
        again = ", rerun to resume (finished shards are kept)" if args.command == "pack" else ""
        print(f"padless {args.command}: interrupted{again}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, OverflowError) as exc:  # bad input: a clear message, no traceback
        print(f"{prefix} {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except MemoryError as exc:
        detail = f" ({_one_line(exc)})" if str(exc) else ""
        sizes = _SIZE_FLAGS.get(args.command, "--max-length")
        print(f"{prefix} out of memory{detail}; use smaller {sizes} or a smaller input", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # the reader has what it wanted; say nothing, and keep Python's exit flush quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        print(f"{prefix} {_os_message(exc)}", file=sys.stderr)
        return EXIT_ERROR


_SIZE_FLAGS = {"pack": "--max-length or --rows-per-shard (a shard holds rows x max-length tokens)",
               "stats": "--num or --max-length", "plan": "--num or --max-length",
               "bench": "--batch-size or --max-length", "verify": "--lengths or --max-length"}  # fmt: skip


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


if __name__ == "__main__":
    raise SystemExit(main())
