"""`mofa calibrate`: fit a hardware efficiency profile to measured runs."""

from __future__ import annotations

import os
import sys

from mofa.atomic import write_atomically
from mofa.commands._common import add_json_option, stamped, to_json

NAME = "calibrate"
HELP = "fit a hardware profile to measured runs"
DESCRIPTION = "Fit the efficiency knobs of a GPU preset to validation points (measured runs) by least squares, with leave-one-out cross-validation."


def add_arguments(p) -> None:
    p.add_argument("data", nargs="+", help="validation point files (problems/validation/*.yaml)")
    p.add_argument("--hardware", required=True, help="fit the points on this GPU preset")
    p.add_argument("--knobs", help="comma-separated knobs to fit (default: gemm, attention, node and cluster communication, scale decay, DP-overlap contention)")
    p.add_argument("--no-loo", action="store_true", help="skip leave-one-out cross-validation (default: run it)")
    p.add_argument("--out", metavar="PROFILE.yaml", help="write the calibrated profile here (default: print it only)")
    add_json_option(p)


def run(args) -> int:
    import yaml

    from calibration.data import load_points
    from calibration.fit import DEFAULT_KNOBS, KNOBS, calibrate
    from calibration.profile import profile_document
    from mofa.report import render_calibration

    points = [p for p in load_points(args.data) if p.hardware == args.hardware]
    if not points:
        print(f"mofa calibrate: none of the data runs on hardware '{args.hardware}'", file=sys.stderr)
        return 2
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"mofa calibrate: the directory of --out {args.out} does not exist", file=sys.stderr)
        return 2
    knobs = tuple(k.strip() for k in args.knobs.split(",")) if args.knobs else DEFAULT_KNOBS
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        print(f"mofa calibrate: unknown knobs {unknown} (known: {', '.join(KNOBS)})", file=sys.stderr)
        return 2
    try:
        cal = calibrate(points, knobs, loo=not args.no_loo)
    except ValueError as exc:
        print(f"mofa calibrate: {exc}", file=sys.stderr)
        return 2
    command = "mofa calibrate " + " ".join(sorted(os.path.relpath(d) for d in args.data)) + f" --hardware {args.hardware}"
    doc = profile_document(cal, command)
    if args.out:
        header = f"# Calibrated efficiency profile for {args.hardware}, written by:\n#   {command}\n"
        try:
            write_atomically(args.out, header + yaml.safe_dump(doc, sort_keys=False))
        except OSError as exc:
            print(f"mofa calibrate: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    print(to_json(stamped(doc, list(args.data))) if args.json else render_calibration(doc))
    return 0
