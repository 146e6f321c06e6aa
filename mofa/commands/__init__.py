"""The `mofa` sub-commands, one module each. `mofa.cli` builds the parser from COMMANDS and
dispatches; a command module never imports `mofa.cli`.

Each module defines NAME, HELP (the one-line summary), DESCRIPTION, add_arguments(parser)
and run(args) -> exit code, and imports what it needs when it runs: numpy, the model and
OR-Tools stay out of `mofa --help` and of the commands that do not use them."""

from mofa.commands import batch, calibrate, compare, ettr, evaluate, export, report, sensitivity, solve, validate

#: in the order `mofa --help` lists them
COMMANDS = (evaluate, ettr, solve, export, batch, report, sensitivity, compare, calibrate, validate)

__all__ = ["COMMANDS"]
