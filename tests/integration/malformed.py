"""Malformed problem files made from the shipped ones, and the oracle they must meet.

A mutation class turns a shipped problem (problems/tuning/*.yaml, problems/mofa/*.yaml) into
a file that is certainly wrong -- a value of the wrong type, out of range, not a number; an
unknown or a missing key; a duplicate key; binary, non-UTF-8 or control bytes; an alias
bomb; deep nesting; a truncated file -- and says which field the error must name. The
fields are read from the schema (costmodel/specs.py) so that a new field is mutated too.

`run_case` runs `mofa evaluate` on it in-process and `verdict` says whether the outcome is a
clean error: exit code 2, exactly one line on stderr naming the file and the field, no
traceback, within a few seconds. Used by test_malformed_problems.py (hypothesis draws the
choices) and by bench/malformed_corpus.py (a seeded corpus with per-class figures).
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import time
import traceback
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
BASE_FILES = sorted((ROOT / "problems" / "tuning").glob("*.yaml")) + sorted((ROOT / "problems" / "mofa").glob("*.yaml"))
TIME_LIMIT_S = 5.0


# --------------------------------------------------------------------------------------
# Randomness: hypothesis's draws in the test, random.Random in the corpus script
# --------------------------------------------------------------------------------------
class Chooser(typing.Protocol):
    def pick(self, options: typing.Sequence): ...
    def integer(self, lo: int, hi: int) -> int: ...


class RandomChooser:
    def __init__(self, rng):
        self.rng = rng

    def pick(self, options):
        return options[self.rng.randrange(len(options))]

    def integer(self, lo, hi):
        return self.rng.randint(lo, hi)


class DrawChooser:
    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw, self.st = draw, st

    def pick(self, options):
        return self.draw(self.st.sampled_from(list(options)))

    def integer(self, lo, hi):
        return self.draw(self.st.integers(lo, hi))


# --------------------------------------------------------------------------------------
# The shipped problems and the fields of the schema
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Base:
    name: str
    text: str
    data: dict


def load_bases() -> list[Base]:
    return [Base(p.parent.name + "/" + p.name, p.read_text(), yaml.safe_load(p.read_text())) for p in BASE_FILES]


@dataclass(frozen=True)
class Field:
    path: tuple  # keys from the top of the file
    kind: str  # int | float | bool | choice | intlist | choicelist
    bounded: bool  # the schema gives a lower bound (gt/ge) or a validator checks positivity
    nullable: bool
    required: bool
    choices: tuple = ()
    list_default_empty: bool = False

    @property
    def dotted(self) -> str:
        return ".".join(str(k) for k in self.path)


FREE_TEXT = {"name", "source", "description"}
#: list fields whose validators refuse non-positive entries (SearchSpec._positive_ints)
POSITIVE_LISTS = {("search", k) for k in ("tp", "cp", "pp", "vp", "ep", "etp", "mbs")}


def _strip_optional(annotation):
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return inner, type(None) in args
    return [annotation], False


def _bounded(info) -> bool:
    return any(hasattr(m, "gt") or hasattr(m, "ge") for m in info.metadata)


def _unwrap(annotation):
    """(the plain type, whether an Annotated wrapper gives it a lower bound)."""
    if get_origin(annotation) is Annotated:
        plain, *meta = get_args(annotation)
        bound = any(hasattr(m, "gt") or hasattr(m, "ge") for item in meta for m in getattr(item, "metadata", [item]))
        return plain, bound
    return annotation, False


def _fields_of(model: type[BaseModel], prefix: tuple, present: dict | None) -> list[Field]:
    """Scalar fields of a section, recursing into sub-sections that are present (a missing
    sub-section would fail on its other required fields, not on the mutated one)."""
    out = []
    for name, info in model.model_fields.items():
        if name in FREE_TEXT:
            continue
        path = prefix + (name,)
        options, nullable = _strip_optional(info.annotation)
        kinds = []
        annotated_bound = False
        for option in options:
            option, bound = _unwrap(option)
            annotated_bound |= bound
            origin = get_origin(option)
            if option is bool:
                kinds.append("bool")
            elif option is int:
                kinds.append("int")
            elif option is float:
                kinds.append("float")
            elif origin is Literal:
                kinds.append("choice")
            elif isinstance(option, type) and issubclass(option, BaseModel):
                sub = (present or {}).get(name) if isinstance(present, dict) else None
                if isinstance(sub, dict) or (present is None and info.default is not None):
                    out += _fields_of(option, path, sub if isinstance(sub, dict) else {})
                kinds.append("model")
            elif origin is dict:
                key_type, value_type = get_args(option)
                keys = list(((present or {}).get(name) or {}).keys()) or (list(get_args(key_type)) if get_origin(key_type) is Literal else [])
                value_type, value_bound = _unwrap(value_type)
                if value_type is float:
                    out += [Field(path + (k,), "float", value_bound, False, False) for k in keys]
                kinds.append("dict")
            elif origin is list:
                (item,) = get_args(option)
                item, _ = _unwrap(item)
                if item is int:
                    kinds.append("intlist")
                elif get_origin(item) is Literal:
                    kinds.append("choicelist")
                else:
                    kinds.append("list")
        choices = tuple(c for option in options if get_origin(option) is Literal for c in get_args(option))
        if "int" in kinds:
            kind = "int"
        elif "float" in kinds:
            kind = "float"
        elif kinds in (["bool"], ["choice"], ["intlist"], ["choicelist"]):
            kind = kinds[0]
        else:
            continue
        default_empty = isinstance(info.default, list) and not info.default
        bounded = _bounded(info) or annotated_bound or path in POSITIVE_LISTS
        out.append(Field(path, kind, bounded, nullable, info.is_required(), choices, default_empty))
    return out


def fields_of(base: Base) -> list[Field]:
    if base.name not in _FIELDS:
        _FIELDS[base.name] = _fields_of_problem(base)
    return _FIELDS[base.name]


_FIELDS: dict[str, list[Field]] = {}


def _fields_of_problem(base: Base) -> list[Field]:
    """Every scalar field a mutation may target in this problem: those of its sections
    (present or not, except config and fault_tolerance, which change what the problem is),
    and those of its model and hardware presets (written as preset overrides)."""
    from costmodel.presets import resolve_hardware, resolve_model
    from costmodel.specs import Problem

    out = []
    for section, info in Problem.model_fields.items():
        if section in FREE_TEXT:
            continue
        present = base.data.get(section)
        if section in ("model", "hardware"):
            value = dict(present) if isinstance(present, dict) else present
            resolved = resolve_model(value, str(ROOT / "problems")) if section == "model" else resolve_hardware(value)
            out += _fields_of(type(resolved), (section,), resolved.model_dump())
            continue
        if section in ("config", "fault_tolerance") and present is None:
            continue
        (model,), _ = _strip_optional(info.annotation)
        out += _fields_of(model, (section,), present if isinstance(present, dict) else {})
    return out


# --------------------------------------------------------------------------------------
# Mutations
# --------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str
    base: str
    content: bytes
    field: str | None = None  # the dotted path the error must name
    fragment: str | None = None  # a piece of the message it must contain
    may_be_valid: bool = False  # a truncated file can still be a valid problem
    detail: str = ""
    alternatives: tuple = ()  # other fields the error may name instead


def _copy(data):
    return yaml.safe_load(yaml.safe_dump(data))


def _set(data: dict, path: tuple, value) -> None:
    """Set a field, writing a model/hardware preset as {preset: name, field: value}."""
    if path[0] in ("model", "hardware") and isinstance(data.get(path[0]), str):
        data[path[0]] = {"preset": data[path[0]]}
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def _dump(data) -> bytes:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()


WORDS = ("many", "abc", "eight", "lots", "NaN-ish", "1O", "8 GPUs", "x", "?", "-")
_SKIP = object()


def _scalar_fields(fields, *kinds):
    return [f for f in fields if f.kind in kinds]


def mutate(kind: str, base: Base, chooser: Chooser) -> Case:
    fields = fields_of(base)
    numeric = _scalar_fields(fields, "int", "float")
    if kind == "wrong_type_str":
        f = chooser.pick(_scalar_fields(fields, "int", "float", "bool", "choice"))
        return _with(kind, base, f, chooser.pick([w for w in WORDS if w not in f.choices]))
    if kind == "wrong_type_list":
        return _with(kind, base, chooser.pick(_scalar_fields(fields, "int", "float", "bool", "choice")), [1, 2])
    if kind == "wrong_type_dict":
        return _with(kind, base, chooser.pick(_scalar_fields(fields, "int", "float", "bool", "choice", "intlist", "choicelist")), {"value": 1})
    if kind == "wrong_type_null":
        return _with(kind, base, chooser.pick([f for f in fields if not f.nullable and f.kind != "choicelist"]), None)
    if kind == "wrong_type_scalar_for_list":
        f = chooser.pick(_scalar_fields(fields, "intlist"))
        return _with(kind, base, f, chooser.pick([{"a": 1}, "abc", 3.5]))
    if kind == "fraction_for_int":
        return _with(kind, base, chooser.pick(_scalar_fields(fields, "int")), chooser.integer(1, 64) + 0.5)
    if kind == "bad_choice":
        f = chooser.pick(_scalar_fields(fields, "choice", "choicelist"))
        return _with(kind, base, f, "bogus-" + chooser.pick(WORDS) if f.kind == "choice" else ["bogus"])
    if kind == "not_finite":
        f = chooser.pick(numeric)
        return _with(kind, base, f, chooser.pick([math.inf, -math.inf, math.nan]), "finite")
    if kind == "beyond_int64":
        f = chooser.pick(numeric)
        return _with(kind, base, f, chooser.pick([1, -1]) * 10 ** chooser.integer(19, 400), "too large")
    if kind == "negative_bounded":
        f = chooser.pick([f for f in numeric + _scalar_fields(fields, "intlist") if f.bounded])
        return _with(kind, base, f, _negative(f, chooser))
    if kind == "unknown_key":
        return _unknown_key(base, chooser, fields)
    if kind == "missing_required":
        return _missing(base, chooser)
    if kind == "wrong_container":
        section = chooser.pick([s for s in ("model", "hardware", "cluster", "training", "features", "fault_tolerance", "search", "config") if s in base.data or s in ("features", "search")])
        data = _copy(base.data)
        value = chooser.pick([[1, 2], 3, 2.5, True] + ([] if section in ("model", "hardware") else ["text"]))
        data[section] = value
        return Case(kind, base.name, _dump(data), section, detail=f"{section} = {value!r}")
    if kind == "top_level_not_mapping":
        data = chooser.pick([[base.data], "text", 3])
        return Case(kind, base.name, _dump(data), None, "top level must be a mapping")
    if kind == "duplicate_key":
        return _duplicate(base, chooser)
    if kind == "binary":
        return _insert_bytes(kind, base, chooser, b"\x00" + bytes(chooser.integer(0, 255) for _ in range(chooser.integer(0, 16))), "binary file")
    if kind == "invalid_utf8":
        return _insert_bytes(kind, base, chooser, chooser.pick([b"\xff", b"\xfe", b"\xc3\x28", b"\x80", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]), "not UTF-8")
    if kind == "control_character":
        char = chooser.pick([c for c in range(1, 32) if c not in (9, 10, 13)] + [0x7F, 0xFFFE])
        return _insert_bytes(kind, base, chooser, chr(char).encode("utf-8"), "not allowed in YAML")
    if kind == "truncated":
        raw = base.text.encode()
        cut = chooser.integer(0, len(raw) - 1)
        return Case(kind, base.name, raw[:cut], None, may_be_valid=True, detail=f"cut at byte {cut} of {len(raw)}")
    if kind == "alias_bomb":
        return _bomb(base, chooser)
    if kind == "deep_nesting":
        return _deep(base, chooser)
    if kind == "garbage_text":
        return _garbage(base, chooser)
    if kind == "probability_out_of_range":
        # probabilities that sum to 1 but are not probabilities (one negative, one above 1)
        data = _copy(base.data)
        if not isinstance(data.get("fault_tolerance"), dict):
            data["fault_tolerance"] = {"failure_rate_per_node_day": 0.01, "checkpoint_save_s": 5}
        high = chooser.pick([1.5, 2.0, 10.0])
        mix = dict(zip(chooser.pick([("process", "pod", "job"), ("job", "process", "pod"), ("pod", "job", "process")]), (high, 1.0 - high, 0.0)))
        data["fault_tolerance"]["recovery_mix"] = mix
        data["fault_tolerance"].pop("recovery_time_s", None)
        return Case(kind, base.name, _dump(data), "fault_tolerance.recovery_mix", detail=f"fault_tolerance.recovery_mix = {mix}")
    if kind in STRICT:
        population, values = STRICT[kind]
        f = chooser.pick(population(fields))
        return _with(kind, base, f, chooser.pick(values(f, chooser)))
    raise ValueError(kind)


def _numeric(fields):
    return [f for f in fields if f.kind in ("int", "float")]


#: schema strictness classes: (the fields they target, the values they try)
STRICT = {
    "bool_for_number": (_numeric, lambda f, c: [True, False]),
    "numeric_string": (_numeric, lambda f, c: [str(c.integer(1, 64)) if c else "8"]),
    "negative_unbounded": (lambda fs: [f for f in _numeric(fs) if not f.bounded], lambda f, c: [-1 if f.kind == "int" else -0.75]),
    # zero recovery time is allowed (recovery_time_s >= 0), a zero probability too
    "zero_unbounded": (lambda fs: [f for f in _numeric(fs) if not f.bounded and not {"recovery_times_s", "recovery_mix"} & set(f.path)], lambda f, c: [0]),
    "huge_number": (_numeric, lambda f, c: [2 ** (c.integer(53, 62) if c else 62) if f.kind == "int" else float(10 ** (c.integer(30, 300) if c else 300))]),
    "empty_list": (lambda fs: [f for f in fs if f.kind in ("intlist", "choicelist") and not f.list_default_empty], lambda f, c: [[]]),
}


#: classes whose values are not wrong in themselves (no upper bound is in the schema):
#: a clean error or a clean result (no traceback, no warning on stderr) are both right
EITHER = {"huge_number"}


def strictness_cases(kind: str, base: Base) -> list[Case]:
    """Every field of the class's population with its canonical value(s): the exhaustive list."""
    population, values = STRICT[kind]
    return [_with(kind, base, f, v) for f in population(fields_of(base)) for v in values(f, None)]


def _negative(f: Field, chooser) -> object:
    magnitude = chooser.pick([1, 2, 8, 1000])
    value = -magnitude if f.kind in ("int", "intlist") else -magnitude * 0.75
    return [value] if f.kind == "intlist" else value


def _with(kind, base, f: Field, value, fragment=None) -> Case:
    data = _copy(base.data)
    _set(data, f.path, value)
    return Case(kind, base.name, _dump(data), f.dotted, fragment, detail=_clip(f"{f.dotted} = {value!r}"), may_be_valid=kind in EITHER)


def _clip(text, n=120):
    return text if len(text) <= n else text[: n - 3] + "..."


def _sections(data):
    return [(k, v) for k, v in data.items() if isinstance(v, dict)]


def _unknown_key(base, chooser, fields) -> Case:
    data = _copy(base.data)
    where = chooser.pick([()] + [(k,) for k, _ in _sections(data)])
    node = data
    for key in where:
        node = node[key]
    long_keys = [k for k in node if isinstance(k, str) and len(k) > 3]
    if long_keys and chooser.pick([True, False]):
        # a misspelt key: the error may name the misspelling or the required key it hides
        original = chooser.pick(long_keys)
        i = chooser.integer(1, len(original) - 1)
        name = original[:i] + original[i + 1:]
        if name in node:
            name = original + "x"
        node[name] = node.pop(original)
        alternatives, detail = (".".join(where + (original,)),), f"misspells {original}"
    else:
        name = chooser.pick(["bogus", "learning_rate", "gpus", "tp_size", "notes"])
        node[name] = chooser.pick([1, "x", [1], {"a": 1}])
        alternatives, detail = (), ""
    path = ".".join(where + (name,))
    return Case("unknown_key", base.name, _dump(data), path, None, detail=f"{path} {detail}".strip(), alternatives=alternatives)


REQUIRED = {
    "model": None, "hardware": None, "cluster": None, "training": None,
    "cluster.num_gpus": None, "cluster.gpus_per_node": None,
    "training.global_batch_size": None, "training.seq_len": None,
    "fault_tolerance.failure_rate_per_node_day": None,
}


def _missing(base, chooser) -> Case:
    present = [p for p in REQUIRED if _get(base.data, p.split(".")) is not _SKIP]
    path = chooser.pick(present).split(".")
    data = _copy(base.data)
    node = data
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return Case("missing_required", base.name, _dump(data), ".".join(path), "required field is missing")


def _get(data, path):
    node = data
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _SKIP
        node = node[key]
    return node


_KEY_LINE = re.compile(r"^(\s*)([A-Za-z_][\w.-]*):(\s.*|)$")


def _key_lines(text: str) -> list[tuple[int, str, str]]:
    """(line index, dotted path, indentation) of each block-mapping key line."""
    out, stack = [], []
    for i, line in enumerate(text.splitlines()):
        m = _KEY_LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m.group(2)])
        out.append((i, path, m.group(1)))
        rest = m.group(3).split("#")[0].strip()
        if not rest:
            stack.append((indent, m.group(2)))
    return out


def _duplicate(base, chooser) -> Case:
    lines = base.text.splitlines()
    index, path, indent = chooser.pick(_key_lines(base.text))
    key = path.split(".")[-1]
    value = chooser.pick(["1", "abc", "{}", "[]", "null"])
    where = chooser.pick(["after", "end"]) if "." not in path else "after"
    if where == "after":
        # after the key's own block (its value may span the following, deeper lines)
        end = index + 1
        depth = len(indent)
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > depth or lines[end].lstrip().startswith("#")):
            end += 1
        lines.insert(end, f"{indent}{key}: {value}")
    else:
        lines.append(f"{key}: {value}")
    return Case("duplicate_key", base.name, ("\n".join(lines) + "\n").encode(), path, "duplicate key", detail=f"{path} repeated ({where})")


def _insert_bytes(kind, base, chooser, payload: bytes, fragment) -> Case:
    raw = base.text.encode()
    at = chooser.integer(0, len(raw))
    return Case(kind, base.name, raw[:at] + payload + raw[at:], None, fragment, detail=f"{payload[:8]!r} at byte {at}")


def _bomb(base, chooser) -> Case:
    levels, fan = chooser.integer(4, 14), chooser.integer(3, 30)
    if fan ** levels <= 200_000:
        levels = math.ceil(math.log(200_001) / math.log(fan)) + 1
    lines = ['lol0: &lol0 "' + "lol" * chooser.integer(1, 50) + '"']
    lines += [f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * fan) + "]" for i in range(1, levels + 1)]
    if chooser.pick([True, False]):  # or aliases used many times over
        lines = ['ha: &ha "ha"', "has: [" + ", ".join(["*ha"] * chooser.integer(1001, 3000)) + "]"]
    text = base.text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
    return Case("alias_bomb", base.name, text.encode(), None, "too many YAML aliases", detail=_clip(lines[-1], 60))


def _deep(base, chooser) -> Case:
    depth = chooser.integer(65, 3000)
    style = chooser.pick(["flow_list", "flow_map", "block"])
    if style == "block":
        depth = min(depth, 400)
        body = "deep:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(depth)) + "  " * (depth + 1) + "leaf: 1\n"
    elif style == "flow_list":
        body = "deep: " + "[" * depth + "1" + "]" * depth + "\n"
    else:
        body = "deep: " + "{a: " * depth + "1" + "}" * depth + "\n"
    text = base.text.rstrip("\n") + "\n" + body
    return Case("deep_nesting", base.name, text.encode(), None, "nested deeper than", detail=f"{style} depth {depth}")


def _garbage(base, chooser) -> Case:
    """Printable junk in place of part of the file: YAML syntax errors or wrong values; the
    error must name the file (the field is not predictable)."""
    raw = base.text
    at = chooser.integer(0, len(raw))
    junk = chooser.pick(["{{{", "]]", ": : :", "\t- x\n  - ]", "'unterminated", '"also', "*undefined_alias", "&a &b x", "!!binary ZZZ", "%YAML 9.9\n", "? [\n"])
    return Case("garbage_text", base.name, (raw[:at] + junk + raw[at:]).encode(), None, may_be_valid=True, detail=f"{junk!r} at {at}")


#: mutation classes the shipped schema and loader turn into clean errors (every one)
CLEAN = (
    "wrong_type_str", "wrong_type_list", "wrong_type_dict", "wrong_type_null", "wrong_type_scalar_for_list",
    "fraction_for_int", "bad_choice", "not_finite", "beyond_int64", "negative_bounded",
    "unknown_key", "missing_required", "wrong_container", "top_level_not_mapping", "duplicate_key",
    "binary", "invalid_utf8", "control_character", "truncated", "alias_bomb", "deep_nesting", "garbage_text",
)
#: mutation classes costmodel/specs.py accepts today (schema strictness)
STRICTNESS = ("bool_for_number", "numeric_string", "huge_number", "empty_list", "probability_out_of_range")
#: classes with nothing left to mutate once the schema bounds every number (a test says so)
UNBOUNDED = ("negative_unbounded", "zero_unbounded")


# --------------------------------------------------------------------------------------
# Running a case and judging the outcome
# --------------------------------------------------------------------------------------
@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    error: str = ""  # an exception that escaped main(), formatted


def run_case(case: Case, path: Path) -> Outcome:
    from mofa.cli import main

    path.write_bytes(case.content)
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    error = ""
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["evaluate", str(path)])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 -- the very thing this looks for
            error = traceback.format_exc()
    return Outcome(code, out.getvalue(), err.getvalue(), time.perf_counter() - started, error)


NO_CONFIG = "no configuration to evaluate"


def _named(line: str, path: str) -> tuple[str, str]:
    """(field, message) of 'mofa evaluate: FILE: FIELD: message' (field '' when none)."""
    rest = line.split(f"{path}: ", 1)[1] if f"{path}: " in line else ""
    head, sep, tail = rest.partition(": ")
    if sep and " " not in head:
        return head, tail
    return "", rest


def names_field(named: str, message: str, expected: str) -> bool:
    """The error names the expected field: exactly, or an element of it, or a parent with the
    rest of the path in the message (a section-level rule: 'give recovery_time_s or ...',
    'recovery_mix probabilities must sum to 1')."""
    if named == expected or named.startswith(expected + ".") or named.startswith(expected + "["):
        return True
    if not named or not expected.startswith(named + "."):
        return False
    below = [k for k in re.split(r"[.\[\]]", expected[len(named) + 1:]) if k]
    return any(k in message for k in below)


def verdict(case: Case, path: Path, outcome: Outcome) -> str | None:
    """None when the outcome is a clean error for this case; else what is wrong."""
    text = outcome.stdout + outcome.stderr + outcome.error
    if outcome.error or "Traceback" in text:
        last = (outcome.error or text).strip().splitlines()[-1]
        return f"traceback: {_clip(last, 200)}"
    if outcome.seconds > TIME_LIMIT_S:
        return f"took {outcome.seconds:.1f} s"
    lines = outcome.stderr.splitlines()
    if case.may_be_valid and _still_valid(path):
        if outcome.code in (0, 1) and not outcome.stderr:
            return None
        if outcome.code == 2 and len(lines) == 1 and str(path) in lines[0]:
            return None  # a clean error after loading (no configuration, a rule of the model)
        return f"a loadable file gave exit {outcome.code} and {len(lines)} lines on stderr: {_clip(outcome.stderr, 200)}"
    if outcome.code != 2:
        return f"accepted (exit {outcome.code})" + (f": {_clip(outcome.stderr.strip(), 160)}" if outcome.stderr.strip() else "")
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr: {_clip(outcome.stderr, 200)}"
    line = lines[0]
    if str(path) not in line:
        return f"the file is not named: {_clip(line, 200)}"
    if NO_CONFIG in line:
        return "accepted (the problem loaded; evaluate only missed a config)"
    named, message = _named(line, str(path))
    expected = [case.field, *case.alternatives] if case.field else []
    if expected and not any(names_field(named, message, e) for e in expected):
        return f"names {named or 'no field'} instead of {case.field}: {_clip(message, 160)}"
    if case.fragment and case.fragment not in line:
        return f"says {_clip(message, 160)!r}, not {case.fragment!r}"
    return None


def _still_valid(path: Path) -> bool:
    from costmodel.loader import ProblemError, load_problem

    try:
        load_problem(str(path))
    except ProblemError:
        return False
    return True
