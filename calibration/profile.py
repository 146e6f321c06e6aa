"""Calibrated hardware profiles on disk: what `mofa calibrate` writes and the presets load."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from costmodel.specs import EfficiencyProfile, HardwareSpec

PROFILE_DIR = Path(__file__).resolve().parents[1] / "costmodel" / "presets" / "profiles"


def profile_document(cal, command: str) -> dict:
    from calibration.fit import cross_validation_summary

    stats = cal.hardware.efficiency.calibration
    return {
        "hardware": cal.hardware.name,
        "command": command,
        "knobs": {k: round(v, 6) for k, v in cal.knobs.items()},
        "efficiency": _fitted_only(cal.hardware.efficiency.model_dump(mode="json"), cal.knobs),
        "cross_validation": cross_validation_summary(cal.results, stats.log_residual_sd) if stats.cross_validation else None,
        "residuals": [
            {
                "name": r.name,
                "hardware": r.hardware,
                "source": r.source,
                "fitted": r.fitted,
                "measured_step_s": round(r.measured_step_s, 6),
                "predicted_step_s": round(r.predicted_step_s, 6),
                "error_pct": round(r.error_pct, 3),
                "loo_error_pct": None if r.loo_error_pct is None else round(r.loo_error_pct, 3),
                "unexplained": r.unexplained,
                "resolved": r.resolved,
            }
            for r in cal.results
        ],
    }


def _fitted_only(efficiency: dict, knobs: dict) -> dict:
    """The profile keeps the attention implementations its knobs fitted; one it did not fit is
    carried from the kernel terms when the presets load it (presets.hardware.
    calibrated_attention_impls), not frozen at its starting value."""
    impls = efficiency["attention_impls"]
    return {**efficiency, "attention_impls": {k: v for k, v in impls.items() if f"attention_{k}" in knobs}}


def read_profile(path: str | Path) -> tuple[str, EfficiencyProfile]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or "hardware" not in data or "efficiency" not in data:
        raise ValueError("not a calibrated profile (needs hardware and efficiency)")
    try:
        return data["hardware"], EfficiencyProfile.model_validate(data["efficiency"])
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"efficiency.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def with_profile(hw: HardwareSpec, efficiency: EfficiencyProfile) -> HardwareSpec:
    return hw.model_copy(update={"efficiency": efficiency})
