"""Bad input: one line on stderr naming the file, the field and the problem; exit code 2;
never a traceback."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import sigint_as_in_a_terminal

VALID = {
    "model": "llama3.1-8b",
    "hardware": "h100-sxm",
    "cluster": {"num_gpus": 16, "gpus_per_node": 8},
    "training": {"global_batch_size": 64, "seq_len": 8192},
    "config": {"tp": 2, "pp": 2, "mbs": 1},
}


def run(*args):
    return subprocess.run([sys.executable, "-m", "mofa", *args], capture_output=True, text=True, timeout=120)


def write(tmp_path, data, name="problem.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def mutate(change):
    data = yaml.safe_load(yaml.safe_dump(VALID))
    change(data)
    return data


def assert_one_line_error(result, path, *fragments):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert path in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""


def test_valid_problem_evaluates(tmp_path):
    result = run("evaluate", write(tmp_path, VALID), "--json")
    assert result.returncode == 0, result.stderr


CASES = {
    "missing field": (lambda d: d["training"].pop("global_batch_size"), ["training.global_batch_size", "missing"]),
    "wrong type": (lambda d: d["cluster"].update(num_gpus="many"), ["cluster.num_gpus", "integer"]),
    "zero GPUs": (lambda d: d["cluster"].update(num_gpus=0), ["cluster.num_gpus", "greater than 0"]),
    "negative GPUs": (lambda d: d["cluster"].update(num_gpus=-8), ["cluster.num_gpus", "greater than 0"]),
    "tp does not divide heads": (lambda d: d["config"].update(tp=3), ["config.tp", "num_heads"]),
    "unknown model preset": (lambda d: d.update(model="llama9-1t"), ["model", "unknown model preset 'llama9-1t'"]),
    "unknown hardware preset": (lambda d: d.update(hardware="tpu-v9"), ["hardware", "unknown hardware preset"]),
    "seq not divisible by 2cp": (lambda d: (d["training"].update(seq_len=8190), d["config"].update(cp=2, pp=1)), ["config.cp", "2*cp"]),
    "unknown field": (lambda d: d["training"].update(global_batch=3), ["training.global_batch", "unknown field"]),
    "negative failure rate": (
        lambda d: d.update(fault_tolerance={"failure_rate_per_node_day": -1, "recovery_time_s": 60, "checkpoint_save_s": 5}),
        ["fault_tolerance.failure_rate_per_node_day"],
    ),
    "world size": (lambda d: d["config"].update(tp=8, pp=4), ["config.tp", "num_gpus"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_field(tmp_path, case):
    change, fragments = CASES[case]
    path = write(tmp_path, mutate(change))
    assert_one_line_error(run("evaluate", path), path, *fragments)


def test_yaml_syntax_error(tmp_path):
    path = write(tmp_path, "model: llama3.1-8b\ncluster: {num_gpus: 8\ntraining: x\n")
    assert_one_line_error(run("evaluate", path), path, "YAML syntax error", "line")


def test_empty_file(tmp_path):
    path = write(tmp_path, "  \n")
    assert_one_line_error(run("evaluate", path), path, "empty")


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    assert_one_line_error(run("evaluate", path), path, "not found")


def test_top_level_not_a_mapping(tmp_path):
    path = write(tmp_path, "- just\n- a list\n")
    assert_one_line_error(run("evaluate", path), path, "mapping")


def test_bad_set_override(tmp_path):
    path = write(tmp_path, VALID)
    assert_one_line_error(run("evaluate", path, "--set", "tp=3"), path, "config.tp")
    assert_one_line_error(run("evaluate", path, "--set", "bogus_key=1"), path, "config.bogus_key", "unknown field")


def test_hf_config(tmp_path):

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu",
    }))
    data = mutate(lambda d: d.update(model={"hf_config": "config.json", "name": "my-llama"}))
    result = run("evaluate", write(tmp_path, data), "--json")
    assert result.returncode == 0, result.stderr
    preset = run("evaluate", write(tmp_path, VALID, "preset.yaml"), "--json")
    # the HF config of Llama-3.1-8B and the preset describe the same model
    assert json.loads(result.stdout)["step_time_s"] == json.loads(preset.stdout)["step_time_s"]
    bad = mutate(lambda d: d.update(model={"hf_config": "missing.json"}))
    path = write(tmp_path, bad, "bad.yaml")
    assert_one_line_error(run("evaluate", path), path, "model", "not found")


@pytest.mark.parametrize("args,fragment", [
    (["--nodes", "0"], "--nodes"),
    (["--nodes", "4", "--failure-rate", "-1"], "--failure-rate"),
])
def test_ettr_bad_arguments(args, fragment):
    base = {"--nodes": "4", "--failure-rate": "0.01", "--repair-time": "60", "--save-time": "2", "--step-time": "10"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    flat = [x for kv in base.items() for x in kv]
    result = run("ettr", *flat)
    assert result.returncode == 2 and "Traceback" not in result.stderr and fragment in result.stderr


# --------------------------------------------------------------------------------------
# What the YAML reader bounds and refuses
# --------------------------------------------------------------------------------------
VALID_TEXT = yaml.safe_dump(VALID, sort_keys=False)


def test_duplicate_key_names_the_key_and_both_lines(tmp_path):
    path = write(tmp_path, VALID_TEXT.replace("  seq_len: 8192\n", "  seq_len: 8192\n  seq_len: 4096\n"))
    assert_one_line_error(run("evaluate", path), path, "training.seq_len", "duplicate key 'seq_len'", "lines")
    path = write(tmp_path, VALID_TEXT + "cluster: {num_gpus: 8}\n", "top.yaml")
    assert_one_line_error(run("evaluate", path), path, ": cluster: duplicate key")


def billion_laughs(levels=9, fan=9):
    lines = ['lol0: &lol0 "' + "lol" * 10 + '"']
    for i in range(1, levels + 1):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * fan) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_at_once(tmp_path):
    import time

    path = write(tmp_path, VALID_TEXT + billion_laughs())  # 9**9 = 387 million strings expanded
    started = time.monotonic()
    result = run("evaluate", path)
    assert time.monotonic() - started < 2 + 3  # the interpreter's start-up included
    assert_one_line_error(result, path, "too many YAML aliases (")
    assert len(result.stderr) < 400


def test_alias_bomb_in_process_under_2_seconds(tmp_path):
    import time

    from costmodel.loader import ProblemError, load_problem

    path = write(tmp_path, VALID_TEXT + billion_laughs(levels=12, fan=20))
    started = time.monotonic()
    with pytest.raises(ProblemError, match="too many YAML aliases"):
        load_problem(path)
    assert time.monotonic() - started < 2


def test_many_aliases_and_recursive_alias(tmp_path):
    many = "anchor: &a 1\nlots: [" + ", ".join(["*a"] * 1001) + "]\n"
    path = write(tmp_path, VALID_TEXT + many)
    assert_one_line_error(run("evaluate", path), path, "too many YAML aliases (1001")
    path = write(tmp_path, VALID_TEXT + "loop: &x [1, *x]\n", "loop.yaml")
    assert_one_line_error(run("evaluate", path), path, "loop: recursive YAML alias")


@pytest.mark.parametrize("text", ["deep: " + "[" * 1000 + "]" * 1000 + "\n", "deep:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(300)) + "  " * 301 + "leaf: 1\n"])
def test_deep_nesting_is_an_error_not_a_recursion_error(tmp_path, text):
    path = write(tmp_path, VALID_TEXT + text)
    assert_one_line_error(run("evaluate", path), path, "nested deeper than 64 levels")


def test_nesting_through_aliases_is_bounded(tmp_path):
    chain = "c0: &c0 [1]\n" + "".join(f"c{i}: &c{i} [*c{i - 1}]\n" for i in range(1, 100))
    path = write(tmp_path, VALID_TEXT + chain)
    assert_one_line_error(run("evaluate", path), path, "nested deeper than 64 levels once aliases are expanded")


def test_binary_file(tmp_path):
    path = tmp_path / "problem.yaml"
    path.write_bytes(VALID_TEXT.encode()[:40] + b"\x00\x01\x02\xff" + VALID_TEXT.encode()[40:])
    assert_one_line_error(run("evaluate", str(path)), str(path), "binary file")


@pytest.mark.parametrize("raw", [b"\xff\xfe" + "model: x\n".encode("utf-16-le"), VALID_TEXT.replace("llama3.1-8b", "llama\xe9").encode("latin-1")])
def test_non_utf8_file(tmp_path, raw):
    path = tmp_path / "problem.yaml"
    path.write_bytes(raw)
    assert_one_line_error(run("evaluate", str(path)), str(path), "not UTF-8 text")


def test_control_character(tmp_path):
    path = write(tmp_path, VALID_TEXT.replace("h100-sxm", "h100\x07sxm"))
    assert_one_line_error(run("evaluate", path), path, "character #x0007 is not allowed")


@pytest.mark.parametrize("text,fragments", [
    ("model: {hf_config: [a, b]}\n", ["model.hf_config", "path of a config.json"]),
    ("yes: 1\n", ["True", "keys must be text", "quote it"]),
    ("training: {global_batch_size: .inf, seq_len: 8192}\n", ["training.global_batch_size", "finite"]),
    ("training: {global_batch_size: .nan, seq_len: 8192}\n", ["training.global_batch_size", "finite"]),
    ("training: {global_batch_size: 100000000000000000000000, seq_len: 8192}\n", ["training.global_batch_size", "too large"]),
    ("cluster: [16, 8]\n", ["cluster", "valid dictionary"]),
    ("model: !!python/object/apply:os.system [echo hi]\n", ["YAML error", "python/object/apply:os.system"]),
])
def test_structural_errors(tmp_path, text, fragments):
    key = text.split(":")[0]
    body = {k: v for k, v in VALID.items() if k != key}  # the section the line replaces
    path = write(tmp_path, yaml.safe_dump(body, sort_keys=False) + text)
    assert_one_line_error(run("evaluate", path), path, *fragments)


def test_huge_value_is_not_echoed(tmp_path):
    path = write(tmp_path, VALID_TEXT.replace("num_gpus: 16", "num_gpus: '" + "9x" * 50000 + "'"))
    result = run("evaluate", path)
    assert_one_line_error(result, path, "cluster.num_gpus", "...")
    assert len(result.stderr) < 400


def test_file_too_large(tmp_path):
    path = write(tmp_path, VALID_TEXT + "# padding\n" * 120000)
    assert_one_line_error(run("evaluate", path), path, "file too large")


def test_anchors_and_merge_keys_still_work(tmp_path):
    body = yaml.safe_dump({k: v for k, v in VALID.items() if k not in ("cluster", "search")}, sort_keys=False)
    text = body + "cluster: &c\n  <<: {num_gpus: 16, gpus_per_node: 4}\n  gpus_per_node: 8\n"
    result = run("evaluate", write(tmp_path, text), "--json")
    assert result.returncode == 0, result.stderr  # a key overriding a merged one is no duplicate
    assert json.loads(result.stdout)["config"]["dp"] == 4


# --------------------------------------------------------------------------------------
# --version, --help, JSON provenance, pipes, Ctrl-C, --out
# --------------------------------------------------------------------------------------
COMMANDS = ("evaluate", "ettr", "solve", "compare", "calibrate", "validate", "export", "batch", "report", "sensitivity")


def test_version():
    from importlib.metadata import version

    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"mofa {version('mofa')}"


def test_every_option_documents_its_default():
    """--help of each command: every option (but -h) is explained and says its default, or
    that it is required."""
    import argparse

    from mofa.cli import HelpFormatter, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    for name, command in sub.choices.items():
        text = " ".join(command.format_help().split())
        for action in command._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            shown = HelpFormatter(f"mofa {name}")._get_help_string(action) % {"default": action.default}
            assert action.help and ("(default: " in shown or "(required)" in shown), (name, action.option_strings, shown)
            assert " ".join(shown.split()) in text, (name, action.option_strings)
    result = run("solve", "--help")
    assert result.returncode == 0 and "(default: cpsat)" in result.stdout and "(default: 1)" in result.stdout


def test_json_outputs_carry_version_and_input(tmp_path):
    from importlib.metadata import version

    from conftest import PROBLEMS

    v = version("mofa")
    problem = write(tmp_path, VALID)
    out = json.loads(run("evaluate", problem, "--json").stdout)
    assert out["mofa_version"] == v and out["input"] == problem
    tuning = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")
    out = json.loads(run("solve", tuning, "--json", "--out", str(tmp_path / "out")).stdout)
    assert out["mofa_version"] == v and out["input"] == tuning
    written = json.loads((tmp_path / "out" / "result.json").read_text())
    assert written["mofa_version"] == v and written["input"] == tuning
    points = sorted(str(p) for p in (PROBLEMS / "validation").glob("korthikanti_*.yaml"))
    for command in (["validate", *points], ["calibrate", *points, "--hardware", "a100-80gb", "--knobs", "gemm,attention", "--no-loo"]):
        result = run(*command, "--json")
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        assert out["mofa_version"] == v and out["input"] == points, command[0]
    out = json.loads(run("ettr", "--nodes", "4", "--failure-rate", "0.01", "--repair-time", "60", "--save-time", "2", "--step-time", "10", "--json").stdout)
    assert out["mofa_version"] == v


def test_compare_rows_carry_version_and_input(monkeypatch, capsys):
    """compare's JSON stays a list; each entry carries the version and its problem file (the
    searches are replaced: this is about the output, test_search runs the real ones)."""
    from importlib.metadata import version

    from conftest import PROBLEMS
    from mofa.cli import main
    from optimizer import search, space
    from optimizer.result import SolveResult

    monkeypatch.setattr(search, "solve", lambda problem, method, objective=None, top_k=1, time_limit_s=None: SolveResult(method, objective or "step", "infeasible", __import__("numpy").zeros(0), None, 0.1, 0))
    monkeypatch.setattr(space.SearchSpace, "from_problem", classmethod(lambda cls, problem: type("S", (), {"size": 1})()))
    path = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")
    assert main(["compare", path, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and rows[0]["mofa_version"] == version("mofa") and rows[0]["input"] == path == rows[0]["problem"]


def environment(buffered: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return env if buffered else {**env, "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [["evaluate", "{problem}", "--json"], ["--help"], ["solve", "--help"]])
def test_closed_pipe_ends_quietly(tmp_path, args, buffered):
    """The reader goes away before mofa writes (`mofa ... | head -0`): no traceback, no
    'Exception ignored', exit 141 (128 + SIGPIPE), buffered output or not."""
    problem = write(tmp_path, VALID)
    child = subprocess.Popen([sys.executable, "-m", "mofa", *[a.format(problem=problem) for a in args]],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(buffered))
    child.stdout.close()
    err = child.stderr.read()
    code = child.wait(timeout=120)
    assert err == ""
    # argparse swallows the failed write of --help itself: nothing is left to fail, exit 0
    assert code == 141 or (code == 0 and "--help" in args)


def test_head_of_a_long_output(tmp_path):
    """A shell pipeline: `mofa solve ... --json --top 100 | head -1`."""
    from conftest import PROBLEMS

    cmd = f"{sys.executable} -m mofa solve {PROBLEMS / 'tuning' / 'llama2_70b_128gpu.yaml'} --json --top 100 | head -1"
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, timeout=300)
    assert result.stdout == "{\n" and result.stderr == ""
    assert result.returncode in (0, 141)


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    from mofa.cli import main
    from mofa.commands import evaluate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "run", interrupted)
    assert main(["evaluate", "x.yaml"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "mofa evaluate: interrupted\n" and captured.out == ""


def test_ctrl_c_of_a_process():
    """SIGINT to a real process while a command runs (before any search that might catch it
    itself): one line on stderr, exit 130, no traceback."""
    import signal

    child = subprocess.Popen([sys.executable, "-c", "import sys, time; from mofa.cli import main; import mofa.commands.evaluate as e; "
                              "e.run = lambda a: (print('running', flush=True), time.sleep(60)); sys.exit(main(['evaluate', 'x.yaml']))"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_in_a_terminal)
    assert child.stdout.readline() == "running\n"
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130 and err == "mofa evaluate: interrupted\n" and out == ""


def test_solve_out_replaces_a_stale_set_and_refuses_other_files(tmp_path):
    from conftest import PROBLEMS

    problem = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")
    out = tmp_path / "out"
    out.mkdir()
    (out / "export_errors.txt").write_text("megatron: from an older run\n")
    (out / "megatron_args.sh").write_text("# an earlier version's name\n")
    (out / "result.json").write_text("{}")
    result = run("solve", problem, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["best.yaml", "bridge_overrides.txt", "export_errors.txt", "megatron_launch.sh", "result.json"]
    assert "older run" not in (out / "export_errors.txt").read_text()
    (out / "notes.md").write_text("mine")
    result = run("solve", problem, "--out", str(out))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"mofa solve: cannot write to --out {out}: holds files mofa did not write (notes.md); give a new or empty folder"
    assert (out / "notes.md").read_text() == "mine" and (out / "best.yaml").exists()


@pytest.mark.parametrize("stops_search", [False, True])
def test_ctrl_c_after_a_cp_sat_solve_is_still_python_s(stops_search):
    """OR-Tools' own SIGINT handling leaves the process's SIGINT at the OS default after a solve
    (a later Ctrl-C ended `mofa` with no message and no answer). Solvers made by cp_solver leave
    Ctrl-C to Python, or (the skeleton search's, which Ctrl-C stops as a time limit would) get
    Python's handler back from cp_solver.solve; either way a SIGINT after a solve raises
    KeyboardInterrupt. In a child process: were the handler lost, the child would die of the
    signal (return code -2) instead of printing."""
    code = ("import os, signal, time; from ortools.sat.python import cp_model; from optimizer.cp_solver import cp_solver, solve\n"
            "m = cp_model.CpModel(); x = m.NewIntVar(0, 10, 'x'); m.Maximize(x)\n"
            f"assert solve(cp_solver(1.0, ctrl_c_stops_search={stops_search}), m) == cp_model.OPTIMAL\n"
            "try:\n    os.kill(os.getpid(), signal.SIGINT); time.sleep(5); print('no interrupt')\n"
            "except KeyboardInterrupt:\n    print('KeyboardInterrupt')\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=sigint_as_in_a_terminal)
    assert child.returncode == 0 and child.stdout == "KeyboardInterrupt\n", (child.returncode, child.stdout, child.stderr)


def test_ctrl_c_in_the_layout_search_keeps_the_configuration(monkeypatch):
    """`mofa solve --pipeline-layouts`: a Ctrl-C while the layout search runs ends that search
    only; the solved configuration is reported (and launched) with its own split, and the
    layout report says it was interrupted."""
    import optimizer.layout_report
    from conftest import PROBLEMS
    from mofa.commands._common import load_for_search
    from mofa.commands.solve import render_layout, solve_output

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(optimizer.layout_report, "layout_report", interrupted)
    path = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")
    out, plans = solve_output(load_for_search(path, []), path, "cpsat", None, 1, None, layout_time_limit_s=5.0)
    assert out["status"] == "optimal" and out["best"] is not None and plans
    assert out["pipeline_layout"]["interrupted"] and "interrupted (Ctrl-C)" in render_layout(out["pipeline_layout"])
    assert plans[0].pipeline_layout is None


LLAMA2_PP4_VP2 = ["search.pp=[4]", "search.vp=[2]", "features.zero_stage=[1]", "features.activation_offload=off",
                  "search.pp_schedule=[interleaved_1f1b]"]


def test_ctrl_c_in_a_layout_round_launches_the_best_layout_so_far(monkeypatch):
    """`mofa solve --pipeline-layouts` on Llama 2 70B, pp 4 x vp 2: a Ctrl-C in the layout
    search's first CP-SAT solve (a round of its regular phase, the split an incumbent) ends it
    with the best layout so far, reported as stopped by Ctrl-C with its proven gap and
    launched where it beats the split, as a time limit would; the configuration is the one
    solved."""
    import optimizer.cp_solver
    from conftest import PROBLEMS
    from mofa.commands._common import load_for_search
    from mofa.commands.solve import render_layout, solve_output

    path = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")
    sets = LLAMA2_PP4_VP2 + ["features.recompute=[none, selective]"]
    calls, real = [], optimizer.cp_solver.solve

    def solve(solver, model, callback=None, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(solver, model, callback, **kwargs)

    whole, _ = solve_output(load_for_search(path, sets), path, "cpsat", None, 1, None, layout_time_limit_s=10.0)
    monkeypatch.setattr(optimizer.cp_solver, "solve", solve)
    out, plans = solve_output(load_for_search(path, sets), path, "cpsat", None, 1, None, layout_time_limit_s=10.0)
    report = out["pipeline_layout"]
    assert len(calls) == 1 and out["status"] == "optimal" and out["best"]["config"] == whole["best"]["config"]
    assert report["interrupted"] and not whole["pipeline_layout"]["interrupted"]
    assert "stopped by Ctrl-C: the best so far" in render_layout(report)
    assert report["step_time_s"] <= report["megatron_split_step_time_s"] and 0.0 <= report["gap"] <= 1.0
    assert report["step_time_s"] >= whole["pipeline_layout"]["step_time_s"] * (1 - 1e-9) or not whole["pipeline_layout"]["optimal"]
    if whole["pipeline_layout"]["optimal"]:  # its bound is the least makespan: no proven bound exceeds it
        assert report["makespan_lower_bound_s"] <= whole["pipeline_layout"]["makespan_lower_bound_s"] * (1 + 1e-9)
    if report["applied"]:
        assert plans[0].pipeline_layout == report["layout"] or report["launched_as"] != "pipeline_layout"


def test_ctrl_c_before_the_one_n_search_launches_one_n(monkeypatch):
    """With full recompute: a Ctrl-C that ends the search over per-stage recompute counts
    (its answer marked interrupted here, as solve_layout marks it) skips the search with one N;
    the answer launched is one Megatron's --recompute-num-layers gives (one_n_after_ctrl_c),
    reported as stopped by Ctrl-C."""
    import dataclasses

    import optimizer.layout_report
    from conftest import PROBLEMS
    from mofa.commands._common import load_for_search
    from mofa.commands.solve import render_layout, solve_output

    path = str(PROBLEMS / "tuning" / "llama2_70b_128gpu.yaml")
    sets = LLAMA2_PP4_VP2 + ["features.recompute=[full]"]
    real_two_phase, real_solve_layout, after = optimizer.layout_report.two_phase, optimizer.layout_report.solve_layout, []

    def two_phase(*args, **kwargs):
        first, second = real_two_phase(*args, **kwargs)
        after.append("two_phase")
        return first, dataclasses.replace(second, interrupted=True)

    def solve_layout(*args, **kwargs):
        if after:  # a search after two_phase (its own two searches are not counted)
            after.append("solve_layout")
        return real_solve_layout(*args, **kwargs)

    monkeypatch.setattr(optimizer.layout_report, "two_phase", two_phase)
    monkeypatch.setattr(optimizer.layout_report, "solve_layout", solve_layout)
    out, plans = solve_output(load_for_search(path, sets), path, "cpsat", None, 1, None, layout_time_limit_s=10.0)
    report = out["pipeline_layout"]
    assert after == ["two_phase"]  # the search with one N did not run
    assert report["interrupted"] and "stopped by Ctrl-C: the best so far" in render_layout(report)
    assert report["recompute_num_layers"] is not None and 0.0 <= report["gap"] <= 1.0
    assert report["step_time_s"] <= report["megatron_split_step_time_s"] * (1 + 1e-12)
    if not report["recompute_expressible"]:
        assert report["best_any_recompute"]["step_time_s"] <= report["step_time_s"] * (1 + 1e-12)
    if report["applied"]:
        assert plans[0].recompute_num_layers == (report["recompute_num_layers"] or None)
