"""What the exporters share: the refusal they raise and the checks every framework makes."""

from __future__ import annotations


class ExportError(ValueError):
    """A plan the framework cannot express or would reject; the message says which rule."""


def refuse(framework: str, why: str):
    raise ExportError(f"{framework} cannot run this plan: {why}")


def check_rules(plan, framework: str) -> None:
    """Refuse with the first of the framework's rules (costmodel.frameworks) the plan breaks:
    the rules the search applies when restricted to the framework, so a plan found for it is
    never refused here."""
    from costmodel.frameworks import DISPLAY, refusals

    broken = refusals(framework, plan.facts(), plan.batch())
    if broken:
        refuse(DISPLAY[framework], broken[0][1])


def mode_of(enabled: bool) -> str:
    return "true" if enabled else "false"
