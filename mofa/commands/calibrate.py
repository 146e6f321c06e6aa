"""`mofa calibrate`: fit a hardware efficiency profile to measured runs."""

from __future__ import annotations

import os
import sys

from mofa.atomic import write_atomically
from mofa.commands._common import add_json_option, stamped, to_json

NAME = "calibrate"
HELP = "fit a hardware profile to measured runs"
DESCRIPTION = (
    "Fit the efficiency knobs of a GPU chip to validation points (measured runs) by least squares, with "
    "cross-validation by source (or by point); points the model cannot explain are listed and left out."
)


def add_arguments(p) -> None:
    p.add_argument("data", nargs="+", help="validation files or folders of them (problems/validation)")
    p.add_argument("--hardware", required=True, help="fit the points on this GPU preset's chip (A100 40 and 80 GB pool)")
    p.add_argument("--knobs", help="comma-separated knobs to fit (default: those at least 10 points exercise, one per 10 points)")
    p.add_argument("--cross-validate", choices=["point", "source"], default="source",
                   help="what each out-of-sample prediction holds out: one point or its whole source (default: source)")
    p.add_argument("--no-loo", action="store_true", help="skip cross-validation (default: run it)")
    p.add_argument("--out", metavar="PROFILE.yaml", help="write the calibrated profile here (default: print it only)")
    add_json_option(p)


def run(args) -> int:
    import yaml

    from calibration.data import load_points
    from calibration.fit import KNOBS, calibrate
    from calibration.profile import profile_document
    from costmodel.presets import HARDWARE
    from costmodel.presets.hardware import chip_of
    from mofa.report import render_calibration

    if args.hardware not in HARDWARE:
        print(f"mofa calibrate: --hardware: unknown GPU preset '{args.hardware}' (known: {', '.join(sorted(HARDWARE))})", file=sys.stderr)
        return 2
    chip = chip_of(HARDWARE[args.hardware])
    points = [p for p in load_points(args.data) if chip_of(p.problem.hardware) == chip]
    if not points:
        print(f"mofa calibrate: none of the data runs on hardware '{args.hardware}' or its chip", file=sys.stderr)
        return 2
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"mofa calibrate: the directory of --out {args.out} does not exist", file=sys.stderr)
        return 2
    knobs = tuple(k.strip() for k in args.knobs.split(",")) if args.knobs else None
    unknown = [k for k in knobs or () if k not in KNOBS]
    if unknown:
        print(f"mofa calibrate: unknown knobs {unknown} (known: {', '.join(KNOBS)})", file=sys.stderr)
        return 2
    try:
        cal = calibrate(points, knobs, loo=not args.no_loo, cross_validate=args.cross_validate)
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
