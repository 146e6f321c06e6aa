"""Property: every malformed problem made from a shipped one is a clean error.

From problems/tuning/*.yaml and problems/mofa/*.yaml, hypothesis makes malformed variants
(tests/integration/malformed.py: wrong types, NaN and infinities, numbers beyond 64 bits,
negative values, unknown, misspelt and missing keys, duplicate keys, a list or a scalar
for a section, binary, non-UTF-8 and control bytes, truncation, printable garbage, alias
bombs, deep nesting) and runs `mofa evaluate` on each, in-process. Each must end with exit
code 2 and exactly one line on stderr naming the file and, where the mutation targets a
field, that field's dotted path; no traceback; within a few seconds. A truncated or
garbled file that is still a valid problem must run normally instead.

At least 1,000 malformed problems per run (derandomized: the same ones every run). The
schema-strictness classes, which costmodel/specs.py accepts today, are expected failures in
their own test below; bench/malformed_corpus.py --exhaustive lists each field they fail on.
"""

import collections
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import malformed

BASES = malformed.load_bases()
PER_CLASS = 50  # x 22 classes = 1,100 malformed problems per run
RAN = collections.Counter()
COMMON = dict(derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("malformed")


def check(kind: str, data, workdir) -> None:
    chooser = malformed.DrawChooser(data.draw)
    base = chooser.pick(BASES)
    case = malformed.mutate(kind, base, chooser)
    RAN[kind] += 1
    path = workdir / f"{kind}-{RAN[kind]}.yaml"
    outcome = malformed.run_case(case, path)
    problem = malformed.verdict(case, path, outcome)
    assert problem is None, (
        f"{kind} on {base.name} ({case.detail}): {problem}\n"
        f"stderr: {outcome.stderr[:1000]}\n{outcome.error[-2000:]}"
    )


@pytest.mark.parametrize("kind", malformed.CLEAN)
@settings(max_examples=PER_CLASS, **COMMON)
@given(data=st.data())
def test_malformed_problem_is_a_clean_error(kind, data, workdir):
    check(kind, data, workdir)


def test_at_least_1000_malformed_problems_ran():
    if set(RAN) < set(malformed.CLEAN):
        pytest.skip("run with the whole module")
    assert sum(RAN[k] for k in malformed.CLEAN) >= 1000, dict(RAN)


@pytest.mark.parametrize("kind", malformed.STRICTNESS)
@settings(max_examples=100, phases=[Phase.explicit, Phase.generate], **COMMON)
@given(data=st.data())
def test_schema_strictness(kind, data, workdir):
    """What a lax schema accepted: a bool for a number (True taken as 1), a numeric string
    for a number ("8"), huge values that ended in a traceback, a warning or the wrong field
    blamed, empty lists (features.recompute, search.layer_split) and recovery_mix
    "probabilities" that sum to 1 but are not (1.5, -0.5, 0): all clean errors now."""
    check(kind, data, workdir)


def test_every_number_in_the_schema_has_a_lower_bound():
    """Zero or negative values cannot pass unnoticed (negative peak TFLOP/s once gave an
    'optimal' solve with negative MFU): every numeric field of every shipped problem's sections
    has a lower bound, so the negative/zero mutation classes have nothing left to target."""
    unbounded = sorted({f.path for base in BASES for f in malformed.fields_of(base) if f.kind in ("int", "float") and not f.bounded})
    assert unbounded == [], unbounded


# --------------------------------------------------------------------------------------
# A few as real processes: the same outcome with a real interpreter, stderr and exit
# --------------------------------------------------------------------------------------
SMOKE = [("alias_bomb", "evaluate"), ("deep_nesting", "evaluate"), ("binary", "evaluate"), ("invalid_utf8", "solve"),
         ("duplicate_key", "solve"), ("wrong_type_str", "solve"), ("not_finite", "evaluate"), ("missing_required", "solve")]


@pytest.mark.parametrize("kind,command", SMOKE)
def test_smoke_in_a_process(tmp_path, kind, command):
    import random

    chooser = malformed.RandomChooser(random.Random(kind))
    case = malformed.mutate(kind, chooser.pick(BASES), chooser)
    path = tmp_path / "problem.yaml"
    path.write_bytes(case.content)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "mofa", command, str(path)], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 10
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"mofa {command}: {path}: ")
    if case.field:
        named, message = malformed._named(line, str(path))
        assert malformed.names_field(named, message, case.field) or any(malformed.names_field(named, message, a) for a in case.alternatives), line
    if case.fragment:
        assert case.fragment in line
