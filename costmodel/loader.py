"""Load a problem file into a validated `Problem`; every failure becomes one `ProblemError`
line naming the file, the field path and the problem."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from costmodel.specs import Problem


class ProblemError(Exception):
    """A problem file (or a --set override) is unusable. str() is the one-line message."""

    def __init__(self, path: str, field: str | None, message: str):
        self.path, self.field, self.message = path, field, message
        where = f"{path}: {field}: " if field else f"{path}: "
        super().__init__(where + message)


def _field_path(loc: tuple) -> str:
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif item in ("function-after", "function-before", "function-wrap") or str(item).startswith(("function-", "union[", "lax-or-strict")):
            continue
        else:
            parts.append(str(item))
    return ".".join(parts)


def _describe(err: ValidationError) -> tuple[str | None, str]:
    first = err.errors(include_url=False)[0]
    field = _field_path(first["loc"])
    message = first["msg"]
    message = re.sub(r"^(Value error|Assertion failed), ", "", message)
    # a model-level validator may name the field itself: "config.tp: ..."
    named = re.match(r"^([a-z_][\w.\[\]]*): (.*)$", message)
    if named and "." in named.group(1) or (named and not field):
        inner, message = named.group(1), named.group(2)
        field = f"{field}.{inner}" if field else inner
    if first["type"] == "missing":
        message = "required field is missing"
    elif first["type"] == "extra_forbidden":
        message = "unknown field (check the spelling)"
    shown = repr(first.get("input"))
    if first["type"] not in ("missing", "extra_forbidden", "value_error") and "input" in first and not isinstance(first["input"], (dict, list)) and shown not in message:
        message = f"{message} (got {shown})"
    return field or None, message


SECTIONS = ("name", "description", "model", "hardware", "cluster", "training", "features", "fault_tolerance", "search", "config")


def parse_override(text: str) -> tuple[list[str], object]:
    """'tp=8' -> (['config', 'tp'], 8); 'training.seq_len=4096' -> (['training', 'seq_len'], 4096)."""
    if "=" not in text:
        raise ValueError(f"--set expects key=value, got '{text}'")
    key, raw = text.split("=", 1)
    key = key.strip()
    path = key.split(".")
    if len(path) == 1 and key not in SECTIONS:
        path = ["config", key]
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict, overrides: list[str], path: str) -> dict:
    for text in overrides:
        try:
            keys, value = parse_override(text)
        except ValueError as exc:
            raise ProblemError(path, "--set", str(exc)) from None
        node = data
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if isinstance(child, str) and node is data and k in ("model", "hardware"):
                child = node[k] = {"preset": child}  # override a field of a named preset
            if not isinstance(child, dict):
                raise ProblemError(path, ".".join(keys), "cannot set a field inside a non-mapping value")
            node = child
        node[keys[-1]] = value
    return data


def read_yaml(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ProblemError(path, None, "file not found")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(path, None, f"cannot read: {exc}") from None
    if not text.strip():
        raise ProblemError(path, None, "file is empty")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProblemError(path, None, f"YAML syntax error{where}: {problem}") from None
    if data is None:
        raise ProblemError(path, None, "file is empty")
    if not isinstance(data, dict):
        raise ProblemError(path, None, f"the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def load_problem(path: str, overrides: list[str] | None = None) -> Problem:
    data = read_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides, path)
        if data.get("config") is None:
            data.pop("config", None)
    data.setdefault("name", Path(path).stem)
    if "measured" in data:
        raise ProblemError(path, "measured", "this is a validation point: use `mofa validate` (or `mofa calibrate`) with it")
    try:
        problem = Problem.model_validate(data, context={"base_dir": str(Path(path).parent)})
    except ValidationError as exc:
        field, message = _describe(exc)
        raise ProblemError(path, field, message) from None
    check_config(problem, path)
    return problem


def check_config(problem: Problem, path: str) -> None:
    """The problem's fixed configuration must obey the rules (costmodel.rules) the frameworks
    enforce; the first broken one is the error, named by the field it concerns."""
    from costmodel.rules import config_violations  # the rule engine needs the cost model's arrays

    if problem.config is not None:
        broken = config_violations(problem, problem.config)
        if broken:
            field, message = broken[0]
            raise ProblemError(path, f"config.{field}", message)
