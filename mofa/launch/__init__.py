"""Launch configurations from a launch plan (mofa.launch.plan): one exporter per framework,
each refusing with the reason (ExportError) what its framework cannot express or would reject.

FORMATS maps a format name to (the file `solve --out` writes it to, the function that renders
the plan). Light imports only: the exporters load when a format is rendered."""

from __future__ import annotations

from mofa.launch.common import ExportError
from mofa.launch.plan import LaunchPlan, build_plan


def _megatron(plan):
    from mofa.launch.megatron import megatron_script
    return megatron_script(plan)


def _bridge(plan):
    from mofa.launch.megatron import bridge_text
    return bridge_text(plan)


def _torchtitan(plan):
    from mofa.launch.torchtitan import torchtitan_script
    return torchtitan_script(plan)


def _deepspeed(plan):
    from mofa.launch.deepspeed import deepspeed_text
    return deepspeed_text(plan)


#: format -> (file name in `solve --out`, renderer)
FORMATS = {
    "megatron": ("megatron_launch.sh", _megatron),
    "megatron-bridge": ("bridge_overrides.txt", _bridge),
    "torchtitan": ("torchtitan_launch.sh", _torchtitan),
    "deepspeed": ("deepspeed_config.json", _deepspeed),
}


def export(plan: LaunchPlan, fmt: str) -> str:
    """The text of one format; ExportError where the framework cannot run the plan."""
    return FORMATS[fmt][1](plan)


def export_all(plan: LaunchPlan) -> tuple[dict[str, str], dict[str, str]]:
    """({file name: text} of every format the plan exports to, {format: why refused})."""
    files, refused = {}, {}
    for fmt, (name, render) in FORMATS.items():
        try:
            files[name] = render(plan)
        except ExportError as exc:
            refused[fmt] = str(exc)
    return files, refused


__all__ = ["ExportError", "FORMATS", "LaunchPlan", "build_plan", "export", "export_all"]
