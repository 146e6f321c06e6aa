"""What the exporters share: the refusal they raise and the checks every framework makes."""

from __future__ import annotations


class ExportError(ValueError):
    """A plan the framework cannot express or would reject; the message says which rule."""


def refuse(framework: str, why: str):
    raise ExportError(f"{framework} cannot run this plan: {why}")


def check_rules(plan, framework: str, ignore: tuple[str, ...] = ()) -> None:
    """Refuse with the first of the framework's rules (costmodel.frameworks) the plan breaks:
    the rules the search applies when restricted to the framework, so a plan found for it is
    never refused here. `ignore`: rules (by key) the exporter knows do not apply to this plan."""
    from costmodel.frameworks import DISPLAY, refusals

    broken = [(key, why) for key, why in refusals(framework, plan.facts(), plan.batch()) if key not in ignore]
    if broken:
        refuse(DISPLAY[framework], broken[0][1])


def mode_of(enabled: bool) -> str:
    return "true" if enabled else "false"
