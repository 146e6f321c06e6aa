"""Sweeps in problem files: `sweep:` maps field paths to lists of values, and the file stands
for the cartesian product of them, one problem per combination.

    sweep:
      cluster.num_gpus: [64, 128]
      training.global_batch_size: [256, 512]
      hardware: [h100-sxm, a100-80gb]

A path is written as for `--set` (a dotted path, or a bare configuration key such as `tp`);
it must name a field of the schema (costmodel/specs.py), checked before anything is expanded,
so a misspelt path is one error naming the file and `sweep.<path>`, not eight errors about an
unknown field. Values are scalars (a number, text, a boolean): each becomes part of the
expanded problem's name, which is deterministic -- the base name, then `field=value` for each
swept field in the order the file lists them (the field is its last path part unless two
swept paths share it). The order of the expansion is the file's order too (the last field
varies fastest), so a batch is the same batch on every run.

Pure data manipulation on the file's mapping: the loader (costmodel.loader) validates each
expanded problem as it would a file without a sweep.
"""

from __future__ import annotations

import itertools
import re
import types
import typing
from typing import Union, get_args, get_origin

from pydantic import BaseModel

SWEEP_KEY = "sweep"
#: an expansion larger than this is a typo (a list pasted twice), not a batch anyone runs
MAX_SWEEP_PROBLEMS = 10_000
#: what a name part may hold (folder names are made of them)
_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


class SweepError(ValueError):
    """A sweep section that cannot be expanded; `field` is the dotted path concerned."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, unions, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (Union, types.UnionType, typing.Annotated):
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


#: keys a `model` or `hardware` mapping may hold besides the spec's fields (presets.resolve_*)
_REFERENCE_KEYS = {"model": ("preset", "hf_config"), "hardware": ("preset",)}


def check_path(keys: list[str]) -> str | None:
    """None when `keys` names a field of a problem, else why not."""
    from costmodel.specs import Problem

    models = [Problem]
    for depth, key in enumerate(keys):
        if depth == 1 and keys[0] in _REFERENCE_KEYS and key in _REFERENCE_KEYS[keys[0]]:
            return None if len(keys) == 2 else f"'{key}' is not a section"
        field = next((m.model_fields[key] for m in models if key in m.model_fields), None)
        if field is None:
            where = ".".join(keys[:depth]) or "a problem"
            return f"unknown field '{key}' in {where} (check the spelling)"
        models = _models_in(field.annotation)
        if not models and depth < len(keys) - 1:
            return f"'{'.'.join(keys[: depth + 1])}' is a value, not a section"
    return None


def _label(value) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        text = str(value)
    return _SAFE.sub("_", text).strip("_") or "_"


def parse_sweep(sweep) -> list[tuple[list[str], str, list]]:
    """[(path keys, name part's field, values)] of a sweep section, checked: SweepError names
    the path and the problem."""
    from costmodel.specs import Problem

    if not isinstance(sweep, dict) or not sweep:
        raise SweepError(SWEEP_KEY, "must be a mapping of field paths to lists of values, e.g. {cluster.num_gpus: [64, 128]}")
    parsed = []
    for path, values in sweep.items():
        field = f"{SWEEP_KEY}.{path}"
        keys = path.split(".")
        if len(keys) == 1 and path not in Problem.model_fields:
            keys = ["config", path]  # a bare configuration key, as --set reads it
        if keys[0] in ("name", "description", SWEEP_KEY) or any(not k for k in keys):
            raise SweepError(field, "cannot be swept (give a field path such as cluster.num_gpus)")
        why = check_path(keys)
        if why:
            raise SweepError(field, why)
        if not isinstance(values, list) or not values:
            raise SweepError(field, f"must be a non-empty list of values, got {type(values).__name__}")
        for i, value in enumerate(values):
            if value is None or isinstance(value, (dict, list)):
                raise SweepError(f"{field}[{i}]", "a swept value must be a number, text or a boolean (it becomes part of the problem's name)")
        labels = [_label(v) for v in values]
        if len(set(labels)) != len(labels):
            twice = next(l for l in labels if labels.count(l) > 1)
            raise SweepError(field, f"lists '{twice}' twice")
        parsed.append((keys, keys[-1], values))
    leaves = [leaf for _, leaf, _ in parsed]
    parsed = [(keys, leaf if leaves.count(leaf) == 1 else ".".join(keys), values) for keys, leaf, values in parsed]
    total = 1
    for _, _, values in parsed:
        total *= len(values)
    if total > MAX_SWEEP_PROBLEMS:
        raise SweepError(SWEEP_KEY, f"expands to {total:,} problems (at most {MAX_SWEEP_PROBLEMS:,})")
    return parsed


def set_field(data: dict, keys: list[str], value) -> None:
    """Set a dotted path in a problem's mapping, creating sections on the way; a model or
    hardware given by its preset name becomes {preset: name} to take a field override.
    ValueError when the path runs through a value that is not a mapping."""
    node = data
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if isinstance(child, str) and node is data and k in ("model", "hardware"):
            child = node[k] = {"preset": child}
        elif isinstance(child, dict):
            child = node[k] = dict(child)  # never write into a mapping another expansion shares
        if not isinstance(child, dict):
            raise ValueError("cannot set a field inside a non-mapping value")
        node = child
    node[keys[-1]] = value


def expand(data: dict, base_name: str) -> list[tuple[str, dict[str, object], dict]]:
    """[(name, {field: value}, the problem's mapping)] of a file's data: one entry, named
    base_name, without a sweep; the cartesian product of its lists with one. SweepError for a
    malformed sweep section."""
    if SWEEP_KEY not in data:
        return [(base_name, {}, data)]
    parsed = parse_sweep(data[SWEEP_KEY])
    base = {k: v for k, v in data.items() if k != SWEEP_KEY}
    out = []
    for combo in itertools.product(*(values for _, _, values in parsed)):
        item = dict(base)
        chosen = {}
        for (keys, leaf, _), value in zip(parsed, combo):
            try:
                set_field(item, keys, value)
            except ValueError as exc:
                raise SweepError(f"{SWEEP_KEY}.{'.'.join(keys)}", str(exc)) from None
            chosen[leaf] = value
        name = "_".join([base_name] + [f"{leaf}={_label(v)}" for leaf, v in chosen.items()])
        out.append((name, chosen, item))
    return out
