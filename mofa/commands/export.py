"""`mofa export`: a launch configuration from a solve's or an evaluation's JSON result."""

from __future__ import annotations

import json
import sys

NAME = "export"
HELP = "write a launch configuration (Megatron-LM, Megatron-Bridge, torchtitan, DeepSpeed) of a result"
DESCRIPTION = ("Write the launch configuration of one configuration of a result (`mofa solve --json` or --out's result.json, "
               "or `mofa evaluate --json`) for a framework, from the typed launch plan the result stores. A configuration the "
               "framework cannot express or would reject is refused with the reason (exit 1). Bad input: exit 2.")

FORMAT_NAMES = ("megatron", "megatron-bridge", "torchtitan", "deepspeed")
EXIT_REFUSED = 1


def add_arguments(p) -> None:
    p.add_argument("result", help="result JSON file (mofa solve --json / result.json, or mofa evaluate --json)")
    p.add_argument("--format", required=True, choices=FORMAT_NAMES,
                   help="megatron: a bash launch script (torchrun + Megatron-LM flags); megatron-bridge: Hydra overrides; "
                        "torchtitan: a bash launch script (torchrun + torchtitan 0.3.0 flags); deepspeed: a DeepSpeed JSON config")
    p.add_argument("--out", metavar="FILE", help="write here, replacing the file atomically (default: print to standard output)")
    p.add_argument("--rank", type=int, default=1, metavar="K",
                   help="export the K-th best configuration of a solve result (1 = the best)")


def _fail(message: str) -> int:
    print(f"mofa export: {message}", file=sys.stderr)
    return 2


def load_plan(path: str, rank: int):
    """The typed launch plan stored in a result file; (plan, None) or (None, error)."""
    from pydantic import ValidationError

    from mofa.launch.plan import LaunchPlan

    try:
        with open(path, "rb") as fh:
            data = fh.read(64 * 1024 * 1024 + 1)
    except OSError as exc:
        return None, f"{path}: cannot read: {exc.strerror or exc}"
    if len(data) > 64 * 1024 * 1024:
        return None, f"{path}: larger than 64 MiB, not a result file"
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"{path}: not JSON ({str(exc).splitlines()[0][:120]})"
    if not isinstance(doc, dict):
        return None, f"{path}: not a mofa result (a JSON object with 'top' or 'plan')"
    if "top" in doc:
        top = doc["top"]
        if not isinstance(top, list):
            return None, f"{path}: 'top' is not a list"
        if not top:
            return None, f"{path}: the result has no configuration (status {doc.get('status', 'unknown')})"
        if not 1 <= rank <= len(top):
            return None, f"--rank {rank}: the result holds {len(top)} configuration(s)"
        entry = top[rank - 1]
    else:
        if rank != 1:
            return None, f"--rank {rank}: an evaluation holds one configuration"
        entry = doc
    if not isinstance(entry, dict) or "plan" not in entry:
        return None, f"{path}: configuration {rank} has no launch plan (written by an older mofa; solve or evaluate again)"
    try:
        return LaunchPlan.model_validate(entry["plan"]), None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        return None, f"{path}: plan.{where}: {err['msg']}"


def run(args) -> int:
    from mofa.atomic import write_atomically
    from mofa.launch import ExportError, export

    if args.rank < 1:
        return _fail("--rank must be at least 1")
    plan, error = load_plan(args.result, args.rank)
    if error:
        return _fail(error)
    try:
        text = export(plan, args.format)
    except ExportError as exc:
        print(f"mofa export: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if args.out:
        try:
            write_atomically(args.out, text)
        except OSError as exc:
            return _fail(f"cannot write --out {args.out}: {exc.strerror or exc}")
        if args.format in ("megatron", "torchtitan"):
            import os
            os.chmod(args.out, os.stat(args.out).st_mode | 0o111)
    else:
        sys.stdout.write(text)
    return 0
