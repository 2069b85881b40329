"""One decoder, N decodes of one generated JPEG: a target for callgrind.

Wall-clock ratios between decoders that run the same libjpeg-turbo scatter by
more than the differences in question on shared machines; instruction counts
do not. Run under callgrind and sum the lines of each extension module::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=pw.out \\
        python benches/decode_instructions.py pixelwire --size 3840x2160 --decodes 3
    callgrind_annotate --threshold=100 pw.out | grep _native.abi3.so

Both decoders decode the input once before the counted decodes, so the
module's total divided by ``decodes + 1`` is the cost of one decode.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import simplejpeg  # type: ignore[import-untyped]

import pixelwire

from bench_common import DEFAULT_SOURCE, encoded_photos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("decoder", choices=["pixelwire", "simplejpeg", "none"])
    parser.add_argument("--size", default="3840x2160", help="WIDTHxHEIGHT")
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--subsampling", type=int, default=2, help="Pillow's: 0 = 4:4:4, 2 = 4:2:0")
    parser.add_argument("--decodes", type=int, default=3)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    params = {"quality": args.quality, "subsampling": args.subsampling}
    ((_, _, _, data),) = encoded_photos(args.source, [(width, height)], [("JPEG", params)])
    pixelwire.decode_image(data)
    simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False)
    for _ in range(args.decodes if args.decoder != "none" else 0):
        if args.decoder == "pixelwire":
            pixelwire.decode_image(data)
        else:
            simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False)


if __name__ == "__main__":
    main()
