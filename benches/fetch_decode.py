"""From a base64 ``data:`` URL to pixels: pixelwire against vLLM's path.

The inputs are data URLs of 1080p and 4K images made once at start-up from a
real photograph of the test corpus (scaled with Pillow's LANCZOS filter and
centre-cropped, as in ``decode_vs_peers.py``): JPEG at quality 90 and PNG at
Pillow's default compression, base64-encoded into ``data:image/...;base64,``
strings.

Paths timed, each from the URL string to an (H, W, 3) uint8 numpy array:

* ``pixelwire``: ``pixelwire.decode_data_url`` (native, validating base64)
  then ``pixelwire.decode_image``, called directly;
* ``load_image``: ``await pixelwire.fetch.load_image(url, fetcher=...)`` on
  a running event loop: the same work plus the hop of the decode (and of the
  base64 decode, for URLs of 1 MiB and more) to a worker thread;
* ``vllm``: what vLLM's media connector does for a data URL:
  ``urllib.parse.urlparse``, split the media type from the payload,
  ``pybase64.b64decode(payload, validate=True)``, then Pillow ``Image.open``,
  ``load``, ``convert("RGB")`` only when the mode differs, and ``numpy.asarray``.

Each path is also split into its two stages (base64 and image decode) so the
ratios can be read per stage. Times are the median of several runs after a
warm-up; ratios are vLLM's time over pixelwire's (above 1: pixelwire faster).

Usage::

    python benches/fetch_decode.py [--quick] [--json PATH] [--source PHOTO]
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pybase64

import pixelwire
from pixelwire.fetch import Fetcher, load_image

from bench_common import QUALITY, bench_parser, encoded_photos, environment, median_seconds, pillow_decode

Pixels = npt.NDArray[np.uint8]

SIZES: tuple[tuple[int, int], ...] = ((1920, 1080), (3840, 2160))


def vllm_base64(url: str) -> bytes:
    """vLLM's data-URL handling up to the encoded image bytes."""
    spec = urllib.parse.urlparse(url)
    header, payload = spec.path.split(",", 1)
    _media_type, encoding = header.split(";", 1)
    if encoding != "base64":
        raise ValueError("only base64 data URLs")
    decoded: bytes = pybase64.b64decode(payload, validate=True)
    return decoded


def vllm_decode(data: bytes) -> Pixels:
    """vLLM's path: Pillow open, load, convert, then the array."""
    return pillow_decode(data)


def vllm_path(url: str) -> Pixels:
    return vllm_decode(vllm_base64(url))


def pixelwire_base64(url: str) -> bytes:
    return pixelwire.decode_data_url(url)[1]


def pixelwire_path(url: str) -> Pixels:
    return pixelwire.decode_image(pixelwire.decode_data_url(url)[1])


@dataclass
class Input:
    format: str
    width: int
    height: int
    data: bytes
    url: str

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass
class Row:
    format: str
    size: str
    encoded_bytes: int
    url_chars: int
    ms: dict[str, float] = field(default_factory=dict)
    max_abs_diff: int = 0


def make_inputs(source: Path) -> list[Input]:
    mimes = {"JPEG": "image/jpeg", "PNG": "image/png"}
    return [
        Input(fmt, w, h, data, f"data:{mimes[fmt]};base64," + base64.b64encode(data).decode("ascii"))
        for fmt, w, h, data in encoded_photos(source, SIZES, [("JPEG", {"quality": QUALITY}), ("PNG", {})])
    ]


def median_ms(fn: Callable[[], object], reps: int, warmup: int) -> float:
    return median_seconds(fn, reps, warmup) * 1e3


def measure(inputs: list[Input], quick: bool) -> list[Row]:
    reps = 3 if quick else 11
    warmup = 1 if quick else 2
    loop = asyncio.new_event_loop()
    fetcher = Fetcher()
    rows: list[Row] = []
    try:
        for item in inputs:
            row = Row(item.format, item.label, len(item.data), len(item.url))
            ours = pixelwire_path(item.url)
            theirs = vllm_path(item.url)
            assert ours.shape == theirs.shape
            row.max_abs_diff = int(np.abs(ours.astype(np.int16) - theirs.astype(np.int16)).max())
            url, data = item.url, item.data

            def run_load_image(url: str = url) -> None:
                loop.run_until_complete(load_image(url, fetcher=fetcher))

            timed: dict[str, Callable[[], object]] = {
                "pixelwire": partial(pixelwire_path, url),
                "load_image": run_load_image,
                "vllm": partial(vllm_path, url),
                "pixelwire_base64": partial(pixelwire_base64, url),
                "vllm_base64": partial(vllm_base64, url),
                "pixelwire_decode": partial(pixelwire.decode_image, data),
                "vllm_decode": partial(vllm_decode, data),
            }
            for name, fn in timed.items():
                row.ms[name] = median_ms(fn, reps, warmup)
            rows.append(row)
            print(f"  measured {item.format} {item.label}", file=sys.stderr, flush=True)
    finally:
        loop.run_until_complete(fetcher.close())
        loop.close()
    return rows


def print_table(rows: list[Row]) -> None:
    print("\nURL string to pixels, median ms (lower is better); ratio = vllm / pixelwire")
    header = (
        f"{'format':<6} {'size':>9} {'url MB':>7} | {'pixelwire':>9} {'load_image':>10} {'vllm':>8} "
        f"{'ratio':>6} | {'b64 pw':>7} {'b64 vllm':>8} {'ratio':>6} | {'dec pw':>7} {'dec vllm':>8} "
        f"{'ratio':>6} | max|d|"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        m = r.ms
        print(
            f"{r.format:<6} {r.size:>9} {r.url_chars / 1e6:>7.2f} | {m['pixelwire']:>9.2f} "
            f"{m['load_image']:>10.2f} {m['vllm']:>8.2f} {m['vllm'] / m['pixelwire']:>5.2f}x | "
            f"{m['pixelwire_base64']:>7.2f} {m['vllm_base64']:>8.2f} "
            f"{m['vllm_base64'] / m['pixelwire_base64']:>5.2f}x | "
            f"{m['pixelwire_decode']:>7.2f} {m['vllm_decode']:>8.2f} "
            f"{m['vllm_decode'] / m['pixelwire_decode']:>5.2f}x | {r.max_abs_diff}"
        )


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__).parse_args(argv)
    env = environment(args.source, pybase64=pybase64.get_version())
    print(
        f"pixelwire {env['pixelwire']}, Pillow {env['pillow']} "
        f"(libjpeg-turbo {env['pillow_libjpeg_turbo']}, zlib {env['pillow_zlib']}), "
        f"pybase64 {env['pybase64']}, numpy {env['numpy']}, {env['cpu_count']} CPUs"
    )
    print(f"source photo: {args.source}")
    rows = measure(make_inputs(args.source), args.quick)
    print_table(rows)
    if args.json is not None:
        payload = {"environment": env, "quick": args.quick, "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
