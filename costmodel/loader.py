"""Load a problem file into a validated `Problem`; every failure becomes one `ProblemError`
line naming the file, the field path and the problem.

Reading is bounded whatever the file holds: its size, the YAML nesting depth, the number of
aliases and the number of values they expand to are capped before anything walks the data,
so an alias bomb or a 10,000-deep list ends in one line instead of a hang or a RecursionError.
Duplicate keys, binary and non-UTF-8 files, non-text keys and numbers no field can hold
(.nan, .inf, integers beyond 64 bits) are errors that name where they are.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml
from pydantic import ValidationError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from costmodel.specs import Problem
from costmodel.sweep import SWEEP_KEY

#: a problem file is a few kilobytes; anything this large is not one (and parsing it in
#: pure Python would take long enough to look like a hang)
MAX_FILE_BYTES = 1 << 20
#: nesting of mappings and lists, in the file and after aliases are expanded
MAX_DEPTH = 64
#: alias uses (*name) in one document
MAX_ALIASES = 1000
#: values (mappings, lists, scalars) the document holds once every alias is expanded
MAX_VALUES = 100_000
#: an echoed piece of input (a value, a tag, a name) is cut to this many characters
MAX_ECHO = 80
#: ... and the whole message to this many
MAX_MESSAGE = 400
INT64_MAX = (1 << 63) - 1


def _clip(text: str, limit: int = MAX_ECHO) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """One line, with long quoted input cut short: an error message never reproduces a huge
    value, and never spans lines (a value with newlines shows them as \\n)."""
    text = str(text).replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")
    text = re.sub(r"'[^']{%d,}'" % (MAX_ECHO + 1), lambda m: "'" + _clip(m.group(0)[1:-1]) + "'", text)
    text = re.sub(r'"[^"]{%d,}"' % (MAX_ECHO + 1), lambda m: '"' + _clip(m.group(0)[1:-1]) + '"', text)
    return _clip(text, limit)


class ProblemError(Exception):
    """A problem file (or a --set override) is unusable. str() is the one-line message."""

    def __init__(self, path: str, field: str | None, message: str):
        field = _one_line(field, 2 * MAX_ECHO) if field else field
        message = _one_line(message)
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
    errors = err.errors(include_url=False)
    # a misspelt key is both unknown and the reason a required key is missing: name the
    # misspelling ("model.prese: unknown field"), not a consequence ("model.name: missing")
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
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
    if first["type"] not in ("missing", "extra_forbidden", "value_error") and "input" in first and not isinstance(first["input"], (dict, list)):
        shown = _clip(repr(first["input"]))
        if shown not in message:
            message = f"{message} (got {shown})"
    return field or None, message


SECTIONS = ("name", "description", "model", "hardware", "cluster", "training", "features", "fault_tolerance", "search", "config")


# --------------------------------------------------------------------------------------
# A bounded, strict YAML reader
# --------------------------------------------------------------------------------------
class YAMLLimitError(yaml.YAMLError):
    """The document is too deep, has too many aliases or duplicates a key. `field` is the
    dotted path of the value concerned, when there is one."""

    def __init__(self, message: str, field: str | None = None, line: int | None = None):
        super().__init__(message)
        self.message, self.field, self.line = message, field, line


def _line(mark) -> int | None:
    return mark.line + 1 if mark is not None else None


def _key_text(node) -> str:
    return node.value if isinstance(node, ScalarNode) else f"<{node.id}>"


def _join(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _children(node, path: str):
    """(child node, its path) in document order; a merge key (<<) adds to its own mapping."""
    if isinstance(node, SequenceNode):
        return [(child, _join(path, i)) for i, child in enumerate(node.value)]
    if isinstance(node, MappingNode):
        out = []
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                out.append((value, path))
            else:
                out += [(key, path), (value, _join(path, _key_text(key)))]
        return out
    return []


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys and counts what it composes: nesting depth
    and aliases while composing, the expanded size and depth before constructing anything."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._paths: dict[int, str] = {}

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise YAMLLimitError(f"too many YAML aliases ({self._aliases}; at most {MAX_ALIASES})", line=_line(mark))
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels", line=_line(self.peek_event().start_mark))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            self._measure(node)
        return node

    def _measure(self, root) -> None:
        """Record each node's (first) dotted path, then size and depth of the document with
        every alias expanded, iteratively and memoised per node: linear in the file's size
        whatever the aliases would expand to, and a recursive alias is an error."""
        seen = {id(root)}
        stack = [(root, "")]
        while stack:
            node, path = stack.pop()
            self._paths[id(node)] = path
            for child, child_path in reversed(_children(node, path)):
                if id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, child_path))
        size: dict[int, int] = {}
        depth: dict[int, int] = {}
        on_path: set[int] = set()
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            kids = [child for child, _ in _children(node, "")]
            if done:
                on_path.discard(key)
                size[key] = 1 + sum(size[id(c)] for c in kids)
                depth[key] = (1 if kids else 0) + max((depth[id(c)] for c in kids), default=0)
                where = self._paths.get(key) or None
                if size[key] > MAX_VALUES:
                    raise YAMLLimitError(f"too many YAML aliases ({self._aliases}): they expand to more than {MAX_VALUES:,} values", where, _line(node.start_mark))
                if depth[key] > MAX_DEPTH:
                    raise YAMLLimitError(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded", where, _line(node.start_mark))
                continue
            if key in size:
                continue
            if key in on_path:
                raise YAMLLimitError("recursive YAML alias (a value that contains itself)", self._paths.get(key) or None, _line(node.start_mark))
            on_path.add(key)
            stack.append((node, True))
            stack += [(c, False) for c in kids if id(c) not in size]

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, ScalarNode):
                    continue  # merged keys may be overridden; complex keys fail below
                key = self.construct_object(key_node)
                ident = (type(key), key)
                if ident in first:
                    where = _join(self._paths.get(id(node), ""), str(key))
                    raise YAMLLimitError(
                        f"duplicate key {_clip(repr(key))} (lines {first[ident]} and {_line(key_node.start_mark)}): "
                        "YAML would silently keep the last one",
                        where,
                        _line(key_node.start_mark),
                    )
                first[ident] = _line(key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads 15.0e12 and 1e9 as strings: it wants a sign in the exponent and a dot.
# Problem files write token counts that way, and a strict schema would reject the string, so
# numbers in scientific notation are floats here, as YAML 1.2 says.
StrictLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _load_text(text: str):
    loader = StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _check_values(value, path: str, file: str) -> None:
    """Keys must be text and numbers representable: no field of a problem holds NaN, an
    infinity or an integer beyond 64 bits (the model computes in float64 and int64).
    Iterative; the reader has already bounded the document's expanded size."""
    seen: set[int] = set()
    stack = [(value, path)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            if id(value) in seen:
                continue
            seen.add(id(value))
            for key, item in value.items():
                if not isinstance(key, str):
                    hint = " (YAML reads unquoted yes/no/on/off/null as booleans or null: quote it)" if key is None or isinstance(key, bool) else ""
                    raise ProblemError(file, _join(path, _clip(str(key))), f"keys must be text, got {type(key).__name__} {_clip(repr(key))}{hint}")
                stack.append((item, _join(path, key)))
        elif isinstance(value, list):
            if id(value) in seen:
                continue
            seen.add(id(value))
            stack += [(item, _join(path, i)) for i, item in enumerate(value)]
        elif isinstance(value, float) and not math.isfinite(value):
            raise ProblemError(file, path or None, f"must be a finite number, got {value}")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
            raise ProblemError(file, path or None, f"number too large ({_clip(str(value), 24)}; at most {INT64_MAX})")


# --------------------------------------------------------------------------------------
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
        value = _load_text(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict, overrides: list[str], path: str) -> dict:
    from costmodel.sweep import set_field

    for text in overrides:
        try:
            keys, value = parse_override(text)
        except ValueError as exc:
            raise ProblemError(path, "--set", str(exc)) from None
        try:
            set_field(data, keys, value)
        except ValueError as exc:
            raise ProblemError(path, ".".join(keys), str(exc)) from None
    return data


def read_yaml(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ProblemError(path, None, "not a regular file" if p.exists() else "file not found")
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ProblemError(path, None, f"file too large for a problem file ({size:,} bytes; at most {MAX_FILE_BYTES:,})")
        raw = p.read_bytes()
    except OSError as exc:
        raise ProblemError(path, None, f"cannot read: {exc.strerror or exc}") from None
    for bom, encoding in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):
        if raw.startswith(bom):
            raise ProblemError(path, None, f"not UTF-8 text ({encoding}, by its byte-order mark): save it as UTF-8")
    if b"\x00" in raw:
        nul = raw.index(b"\x00")
        line = raw.count(b"\n", 0, nul) + 1
        raise ProblemError(path, None, f"binary file (a NUL byte at line {line}, offset {nul}), not YAML text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ProblemError(path, None, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}, offset {exc.start})") from None
    if not text.strip():
        raise ProblemError(path, None, "file is empty")
    try:
        data = _load_text(text)
    except YAMLLimitError as exc:
        where = f" (line {exc.line})" if exc.line and "line" not in exc.message else ""
        raise ProblemError(path, exc.field, exc.message + where) from None
    except yaml.YAMLError as exc:
        raise ProblemError(path, None, _yaml_problem(exc, text)) from None
    if data is None:
        raise ProblemError(path, None, "file is empty")
    if not isinstance(data, dict):
        raise ProblemError(path, None, f"the top level must be a mapping of sections, got {type(data).__name__}")
    _check_values(data, "", path)
    return data


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f" at line {mark.line + 1}, column {mark.column + 1}"
    elif isinstance(getattr(exc, "position", None), int):  # a ReaderError: a character YAML does not allow
        where = f" at line {text.count(chr(10), 0, exc.position) + 1}"
    else:
        where = ""
    if isinstance(exc, yaml.reader.ReaderError):
        code = ord(exc.character) if isinstance(exc.character, str) else exc.character
        problem = f"character #x{code:04x} is not allowed in YAML ({exc.reason})"
    else:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    kind = "YAML error" if isinstance(exc, ConstructorError) else "YAML syntax error"
    return f"{kind}{where}: {problem}"


def _check_references(data: dict, path: str) -> None:
    """model and hardware name a preset, a Hugging Face config or give an inline spec: the
    preset or config reference itself must be text."""
    for section in ("model", "hardware"):
        value = data.get(section)
        if isinstance(value, dict):
            for ref in ("preset", "hf_config") if section == "model" else ("preset",):
                if ref in value and not isinstance(value[ref], str):
                    what = "a preset name" if ref == "preset" else "the path of a config.json"
                    raise ProblemError(path, f"{section}.{ref}", f"must be {what} (text), got {type(value[ref]).__name__}")


def load_problem(path: str, overrides: list[str] | None = None) -> Problem:
    """The one problem of a file; a file that declares a sweep is an error here (it stands
    for several problems: load_problems, `mofa batch`)."""
    data = read_yaml(path)
    if SWEEP_KEY in data:
        raise ProblemError(path, SWEEP_KEY, "this file declares a sweep (several problems): run it with `mofa batch`")
    return _finish(data, path, overrides, Path(path).stem)


def load_problems(path: str, overrides: list[str] | None = None) -> list[tuple[str, dict, Problem]]:
    """[(name, {swept field: value}, problem)] of a file: one entry without a sweep, the
    cartesian product of its `sweep:` lists with one (costmodel.sweep). The name is the
    file's stem plus `field=value` parts (what a batch names its run folder after); the
    problem's own name gets the same parts. The sweep section is checked first and errors
    name `sweep.<path>`; an expanded problem's error names its file, the combination and the
    field. `overrides` apply to every expanded problem."""
    from costmodel.sweep import SweepError, expand

    data = read_yaml(path)
    stem = Path(path).stem
    try:
        expanded = expand(data, stem)
    except SweepError as exc:
        raise ProblemError(path, exc.field, exc.message) from None
    out = []
    for name, values, item in expanded:
        where = path if not values else f"{path} [{name[len(stem) + 1:]}]"
        item = dict(item)
        if values:
            item["name"] = str(item.get("name") or stem) + name[len(stem):]
        out.append((name, values, _finish(item, where, overrides, stem)))
    return out


def _finish(data: dict, path: str, overrides: list[str] | None, stem: str) -> Problem:
    if overrides:
        data = apply_overrides(data, overrides, path)
        if data.get("config") is None:
            data.pop("config", None)
        _check_values(data, "", path)
    data.setdefault("name", stem)
    if "measured" in data:
        raise ProblemError(path, "measured", "this is a validation point: use `mofa validate` (or `mofa calibrate`) with it")
    _check_references(data, path)
    problem = build_problem(data, path)
    check_config(problem, path)
    check_cluster_choices(problem, path)
    return problem


def check_cluster_choices(problem: Problem, path: str) -> None:
    """Every candidate cluster of `search.num_gpus` / `search.hardware` must be a valid
    problem (costmodel.cluster_choice): the first that is not is the error."""
    from costmodel.cluster_choice import ClusterChoiceError, cluster_problems
    from costmodel.presets import HARDWARE

    prices = problem.search.price_per_gpu_hour
    if isinstance(prices, dict):  # a misspelt key would be ignored and a cost computed without it
        known = {problem.hardware.name, *HARDWARE, *(problem.search.hardware or [])}
        unknown = next((k for k in prices if k not in known), None)
        if unknown is not None:
            raise ProblemError(path, "search.price_per_gpu_hour", f"'{unknown}' is not a GPU preset (nor this problem's hardware)")
    if problem.search.chooses_cluster:
        try:
            cluster_problems(problem)
        except ClusterChoiceError as exc:
            raise ProblemError(path, exc.field, exc.message) from None


def build_problem(data: dict, path: str) -> Problem:
    """The typed problem of a problem file's data: the model and hardware references resolved
    (a preset, a preset with overrides, a Hugging Face config.json relative to the file, or an
    inline spec), then every section validated. Errors name the field."""
    from costmodel.presets import resolve_hardware, resolve_model  # presets import the schema

    data = dict(data)
    base_dir = str(Path(path).parent)
    for section, resolve in (("model", lambda v: resolve_model(v, base_dir)), ("hardware", resolve_hardware)):
        if section not in data:
            continue
        try:
            data[section] = resolve(data[section])
        except ValidationError as exc:
            field, message = _describe(exc)
            raise ProblemError(path, f"{section}.{field}" if field else section, message) from None
        except ValueError as exc:
            raise ProblemError(path, section, str(exc)) from None
    try:
        return Problem.model_validate(data)
    except ValidationError as exc:
        field, message = _describe(exc)
        raise ProblemError(path, field, message) from None


def check_config(problem: Problem, path: str) -> None:
    """The problem's fixed configuration must obey the rules (costmodel.rules) the frameworks
    enforce; the first broken one is the error, named by the field it concerns."""
    from costmodel.rules import config_violations  # the rule engine needs the cost model's arrays

    if problem.config is not None:
        broken = config_violations(problem, problem.config)
        if broken:
            field, message = broken[0]
            raise ProblemError(path, f"config.{field}", message)
