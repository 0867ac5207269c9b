"""`kvoffload-lab calibrate`: measure this GPU host for a model shape and write a simulator cost profile.

Thin CLI over `kvoffload.calibrate`: parses flags, runs the measurement (or loads an earlier raw run
with --from-raw), writes the raw JSON first and the profile second, and turns failed sanity checks
into an error. torch is imported only when measuring.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from kvoffload.calibrate.shapes import SHAPES, get_shape
from kvoffload.cli.args import add_command
from kvoffload.errors import UserError

log = logging.getLogger(__name__)


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        size = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, OverflowError):  # OverflowError: int(inf)
        size = 0
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size > 0; use bytes or a K/M/G suffix, e.g. 2G")
    return size


def register(sub: Any) -> None:
    parser = add_command(sub, "calibrate", run)
    parser.add_argument("--model-shape", required=True, choices=sorted(SHAPES), help="model shape to measure")
    parser.add_argument("--output", required=True, type=Path, help="profile YAML to write")
    parser.add_argument(
        "--raw-output",
        type=Path,
        help="raw JSON of every timing (default: the --output path with suffix .raw.json)",
    )
    parser.add_argument(
        "--disk-dir",
        type=Path,
        help="directory on the drive the nvme tier uses (default: the --output file's directory)",
    )
    parser.add_argument(
        "--disk-bytes", type=_size, default=None, help="scratch file size (default 2G, --quick 512M)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer points and repeats (minutes less)")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default); cpu runs toy grids for smoke tests only, its figures mean nothing",
    )
    parser.add_argument(
        "--from-raw",
        type=Path,
        help="skip measuring: build the profile from a raw JSON an earlier run wrote",
    )
    parser.add_argument("--name", help="profile name (default: the --output file's stem)")


def run(args: argparse.Namespace) -> int:
    """measure this GPU host and write a simulator cost profile

    Measure prefill throughput, decode step time, KV bytes per token, pinned host<->device copy bandwidth and
    a directory's drive throughput with PyTorch and random weights of a model shape (no download), and write a
    cost profile for the simulator with every figure's provenance.
    """
    from kvoffload.calibrate.raw import load_raw, write_raw
    from kvoffload.calibrate.runner import CalibrationOptions, run_calibration
    from kvoffload.calibrate.sanity import failures
    from kvoffload.calibrate.to_profile import write_profile

    output: Path = args.output
    if output.suffix not in (".yaml", ".yml"):
        raise UserError(f"--output {output}: a profile is YAML; give a path ending in .yaml")
    for flag, path in (("--output", output), ("--raw-output", args.raw_output)):
        if path is not None and path.is_dir():
            raise UserError(f"{flag} {path}: is a folder; give the file to write")
    if args.disk_dir is not None and not args.disk_dir.is_dir():
        # Checked now: the drive is measured after the GPU, which takes minutes.
        raise UserError(f"--disk-dir {args.disk_dir}: not an existing folder")
    if args.from_raw is not None:
        raw = load_raw(args.from_raw)
        if raw.shape.name != args.model_shape:
            raise UserError(
                f"--from-raw {args.from_raw} holds shape {raw.shape.name}, "
                f"not --model-shape {args.model_shape}"
            )
    else:
        spec = get_shape(args.model_shape)
        raw_path: Path = args.raw_output or output.with_suffix(".raw.json")
        disk_dir: Path = args.disk_dir or output.resolve().parent
        disk_bytes = args.disk_bytes or ((512 << 20) if args.quick or args.device == "cpu" else (2 << 30))
        options = CalibrationOptions(
            device=args.device,
            quick=args.quick,
            disk_dir=disk_dir,
            disk_bytes=disk_bytes,
            disk_repeats=3,
        )
        raw = run_calibration(spec, options, ["kvoffload-lab", *sys.argv[1:]])
        write_raw(raw, raw_path)
        log.info("raw timings written to %s", raw_path)
    failed = failures(raw.sanity)
    if failed:
        raise UserError(
            "calibrate: measured figures exceed the datasheet ceilings, so a timing is wrong and no "
            f"profile was written: {'; '.join(failed)}"
        )
    profile = write_profile(raw, output, args.name)
    form = profile.decode.form()
    print(f"wrote {output} ({raw.environment.device_name}, {raw.shape.name})")
    print("  prefill tokens/s: " + ", ".join(f"{c}: {t:.0f}" for c, t in profile.prefill.points))
    print(
        f"  decode step: {form.base_s * 1e3:.3f} ms + {form.per_seq_s * 1e6:.2f} us/seq "
        f"+ {form.per_context_token_s * 1e9:.3f} ns/context token"
    )
    print(
        f"  transfer: h2d {profile.transfer.host_to_device_gbps:.1f} GB/s, "
        f"d2h {profile.transfer.device_to_host_gbps:.1f} GB/s; disk: read {profile.disk.read_gbps:.2f} GB/s, "
        f"write {profile.disk.write_gbps:.2f} GB/s"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m kvoffload.cli.calibrate ...`: the same command without the other sub-commands' imports
    (for GPU hosts that have torch but not the controller's dependencies)."""
    parser = argparse.ArgumentParser(prog="kvoffload-lab")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except UserError as exc:
        print(f"kvoffload-lab: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
