"""Sub-commands that live outside cli.py (search, calibration). Registered in build_parser."""

from __future__ import annotations


def register(sub) -> None:
    """Add the search and calibration sub-commands to the parser."""
