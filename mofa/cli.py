"""The `mofa` command line: builds the parser from the command modules (mofa/commands/) and
dispatches to them. Bad input ends in one line on stderr and exit code 2; a closed pipe
(`mofa ... | head`) ends quietly with 141, Ctrl-C with one line and 130."""

from __future__ import annotations

import argparse
import os
import sys

from costmodel.loader import ProblemError
from mofa.commands import COMMANDS
from mofa.version import version

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a job ended by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports `yes | head`'s yes


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help says its default: '(default: X)' from argparse unless the help
    already says it, '(required)' for required options, 'off' for flags."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.required:
            return f"{text} (required)"
        if isinstance(action, (argparse._StoreTrueAction,)):
            return f"{text} (default: off)"
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mofa", description="Predict and optimise LLM pretraining runs (MoFa).", formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"mofa {version()}", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION, formatter_class=HelpFormatter)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


def _run(argv: list[str] | None) -> int:
    from costmodel.arrays import tune_allocator

    args = build_parser().parse_args(argv)
    tune_allocator()
    try:
        return args.func(args)
    except ProblemError as exc:
        print(f"mofa {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def _stdout_to_devnull() -> None:
    """After a broken pipe, Python's final flush of stdout at exit would fail again and print
    'Exception ignored ... BrokenPipeError': point the descriptor at /dev/null instead."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return  # not a real file (captured in-process): nothing is flushed to a descriptor
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            code = _run(argv)
        except SystemExit:  # argparse: --help, --version, a usage error
            _flush_stdout()
            raise
        _flush_stdout()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), "")
        print(f"mofa{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
