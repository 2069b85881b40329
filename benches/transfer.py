"""Transfer benchmark (same as `pixelwire bench transfer`); see
pixelwire.benchmarks for what is measured."""

from __future__ import annotations

import argparse
import json

from pixelwire.benchmarks import as_dicts, transfer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-naive", action="store_true", help="skip the nixl Python API baseline")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument(
        "--device",
        default="auto",
        help="read destinations, comma-separated (cpu, cuda[:N]); auto: cpu, and cuda where there is one",
    )
    parser.add_argument("--sizes", help="image sizes in MiB, comma-separated (default: the bench's)")
    args = parser.parse_args()
    devices = None if args.device == "auto" else args.device.split(",")
    sizes = [round(float(s) * 1024 * 1024) for s in args.sizes.split(",")] if args.sizes else None
    rows = transfer(sizes=sizes, repeats=args.repeats, naive=not args.no_naive, devices=devices)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(as_dicts(rows), out, indent=2)


if __name__ == "__main__":
    main()
