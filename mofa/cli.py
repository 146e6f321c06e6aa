"""The `mofa` command line: builds the parser from the command modules (mofa/commands/) and
dispatches to them. Bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys

from costmodel.loader import ProblemError
from mofa.commands import COMMANDS
from mofa.version import version

EXIT_USAGE = 2


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


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
