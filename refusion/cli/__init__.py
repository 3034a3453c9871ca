"""The ``refusion`` command line: generate, visualize, batch, bench, eval, reproduce, sweep, train, plugins, serve.

One module per group of subcommands (``generate``, ``batch``, ``measure``,
``sweep``, ``train``, ``plugins``, ``serve``), each adding its parsers; ``options`` holds
the flags they share. Every subcommand explains its options in ``--help``;
``--json`` prints machine-readable output; long work shows a progress bar on
stderr. Building the parser imports no model code, so ``--help`` is quick.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from refusion.cli import batch, generate, measure, plugins, serve, sweep, train
from refusion.errors import RefusionError, UsageError


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusals are a :class:`UsageError` (one line from :func:`main`, status 2) rather than
    a usage text and ``SystemExit``; subcommands' parsers are of this class too."""

    def error(self, message: str) -> None:  # type: ignore[override]  # raises instead of exiting
        found = re.match(r"argument ([^:]+): (.*)$", message, re.S)
        if found:  # "argument --port: must be ..." -> "`--port` must be ...", the house style
            flag, reason = found.groups()
            message = f"`{flag}` {reason}" if reason.startswith(("must", "'")) else f"`{flag}`: {reason}"
        raise UsageError(f"{message} (`{self.prog} --help` lists the options)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="refusion", description="Plan-and-infill decoding for diffusion LMs (ReFusion).")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (generate, batch, measure, train, sweep, plugins, serve):
        group.add_parsers(sub)
    for command in sub.choices.values():  # `refusion generate ... --debug` works too
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of a failure"
        )
    return parser


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings are printed as one line, ``refusion: note: ...`` (no file and line)."""
    print(f"refusion: note: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Bad input (argparse errors, :class:`RefusionError`, :class:`OSError`) gives
    ``refusion: error: ...`` on stderr and status 2; any other failure status 1
    with the exception's one-line summary. ``--debug`` re-raises instead, with
    the traceback. Output cut short by a closed pipe (``| head``) is not an error.
    Parts named ``module:Class`` are found in the current directory too, as
    ``python -m`` finds them (after the installed packages, which it cannot shadow).
    """
    import warnings

    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"refusion: error: {exc}", file=sys.stderr)
        return 2
    search_current_directory()
    debug = getattr(args, "debug", False)
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _note
        try:
            return args.func(args)
        except KeyboardInterrupt:
            print("refusion: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # the reader stopped reading (`refusion plugins --json | head -1`)
            _silence_stdout()
            return 0
        except (RefusionError, OSError) as exc:
            if debug:
                raise
            print(f"refusion: error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:
            if debug:
                raise
            print(f"refusion: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
            return 1


def search_current_directory() -> None:
    """Let ``module:Class`` names find modules in the current directory (``--infiller my_infiller:Mine`` run where
    ``my_infiller.py`` is), as ``python -m`` and pytest do; appended, so no installed module is shadowed."""
    import os

    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's flush at exit does not report the broken pipe again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):  # stdout without a file descriptor
        pass


__all__ = ["build_parser", "main"]
