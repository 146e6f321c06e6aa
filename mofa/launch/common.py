"""What the exporters share: the refusal they raise and the checks every framework makes."""

from __future__ import annotations


class ExportError(ValueError):
    """A plan the framework cannot express or would reject; the message says which rule."""


def refuse(framework: str, why: str):
    raise ExportError(f"{framework} cannot run this plan: {why}")


def needs_iterations(plan, framework: str) -> int:
    if plan.train_iters is None:
        refuse(framework, "the problem gives neither training.steps nor training.tokens, and a launch without a "
               "length runs the framework's default number of steps")
    return plan.train_iters


def mode_of(enabled: bool) -> str:
    return "true" if enabled else "false"
