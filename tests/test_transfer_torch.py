"""torch outputs: a CPU tensor, and a CUDA destination where the worker
READs straight into GPU memory. Runs where torch is installed (the GPU
machine); skipped cleanly in CI, which has no torch."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pixelwire
from pixelwire._frontend_process import FrontendProcess
from pixelwire.benchmarks import ppm_of_size

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("layout", ["HWC", "RGBX"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_reads_equal_decode_image(device: str, layout: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    # Generated images (the corpus does not travel to the GPU machine);
    # decoding itself is covered by the parity tests.
    images = [ppm_of_size(size, seed=i) for i, size in enumerate([3 * 7, 64 << 10, 3 << 20, 24 << 20])]
    frontend = FrontendProcess()
    try:

        async def main() -> None:
            async with pixelwire.Reader() as reader:
                for data in images:
                    desc = frontend.publish(data, layout=layout)["desc"]
                    got = await reader.read_decoded(desc, output="torch", device=device)
                    assert got.is_cuda == (device == "cuda") and got.dtype == torch.uint8
                    assert got.is_contiguous() and got.shape[2] == 3
                    np.testing.assert_array_equal(got.cpu().numpy(), pixelwire.decode_image(data))

        asyncio.run(main())
    finally:
        frontend.close()
