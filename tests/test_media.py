"""The seam a new medium plugs into (pixelwire.media): a medium registered
here, in this test only, with one handler per layer, goes through the
frontend's pipeline, the descriptor's parse and the worker's reference
dispatch, and gets the shared rules of each (the request's encoded-bytes
cap, the slot fields' checks, the signature, the part kind check) without
any other file knowing of it."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

import pixelwire
from pixelwire import DescriptorError, _native
from pixelwire.config import Layout
from pixelwire.descriptor import DESCRIPTOR_MEDIA, MediumFields, PublishedSlot, parse_descriptor
from pixelwire.descriptor_checks import checked_shape
from pixelwire.fetch import Fetcher
from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.media import FRONTEND_MEDIA
from pixelwire.frontend.pipeline import MediaPipeline
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.media import MEDIA, Medium, UnknownMedium
from pixelwire.media_parts import MediaPart
from pixelwire.metrics import MediaMetrics
from pixelwire.publisher import Publisher
from pixelwire.publisher.images import ImageBatch, ImageOptions
from pixelwire.publisher.slots import slot_fields
from pixelwire.signing import SignatureError, encode_reference
from pixelwire.vllm.reading import WORKER_MEDIA, ReadRequest, read_reference

from reference import CORPUS

SECRET = b"s" * 32
TOY = Medium("toy", part="toy")


@dataclass(frozen=True)
class ToyPublished(PublishedSlot):
    """A toy medium's published slot: its own shape and record, the slot fields shared."""

    shape: tuple[int, int, int]
    colour: str

    def medium_metadata(self) -> dict[str, Any]:
        return {"Toy": {"colour": self.colour}}


class ToyDescriptor:
    def claims(self, desc: dict[str, Any]) -> bool:
        info = desc.get("metadata")
        return isinstance(info, dict) and "Toy" in info

    def fields(self, desc: dict[str, Any], shape: Any, layout: Layout) -> MediumFields:
        colour = desc["metadata"]["Toy"].get("colour")
        if not isinstance(colour, str):
            raise DescriptorError("a toy needs its colour")
        return MediumFields(checked_shape(shape), record={"colour": colour})


class ToyParts:
    """At the frontend: the part's bytes, fetched within the request's
    limits, become a toy reference naming their length."""

    async def decoded_here(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        data = await pipeline.fetch(part)
        return f"toy:{len(data)}"

    def passed_on(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        return part.url


@dataclass(frozen=True)
class ToyPublish:
    """A toy's decode-and-publish: an image's, published as a toy."""

    batch: ImageBatch

    def executor(self) -> concurrent.futures.Executor:
        return self.batch.executor()

    def run(self, native: _native.NativePublisher, control: _native.BatchControl) -> Any:
        return self.batch.run(native, control)

    def release(self, native: _native.NativePublisher, result: Any) -> None:
        self.batch.release(native, result)

    def described(self, agent: str, result: Any, published_at: float) -> ToyPublished:
        ((fields, digest),) = result
        return ToyPublished(
            **slot_fields(agent, fields),
            shape=fields["shape"],
            colour="teal",
            published_at=published_at,
            source_sha256=digest,
        )


class ToyReads:
    async def read(self, descriptor: dict[str, Any], request: ReadRequest) -> Any:
        remote = parse_descriptor(descriptor)
        request.metrics.handled_medium(TOY.metrics_label, "nixl")
        return remote.medium, remote.record, remote.shape


@pytest.fixture
def toy() -> Iterator[Medium]:
    """The toy medium, registered in each layer for one test."""
    registries: list[Any] = [MEDIA, DESCRIPTOR_MEDIA, FRONTEND_MEDIA, WORKER_MEDIA]
    handlers = [TOY, ToyDescriptor(), ToyParts(), ToyReads()]
    for registry, handler in zip(registries, handlers, strict=True):
        registry.register(TOY.name, handler)
    try:
        yield TOY
    finally:
        for registry in registries:
            registry.unregister(TOY.name)


def _metrics() -> tuple[MediaMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return MediaMetrics("worker", registry, lambda: 0.0, lambda: 0.0, reads=True), registry


def _toy_published(**changed: Any) -> ToyPublished:
    fields: dict[str, Any] = {
        "nixl_metadata": "b64:AAAA",
        "addr": 1 << 20,
        "size": 4 * 6 * 3,
        "shape": (4, 6, 3),
        "content_hash": "xxh3-256k:0123456789abcdef",
        "agent": "pixelwire-frontend-1",
        "slot": 3,
        "generation": 7,
        "expires_at": 1_900_000_000.5,
        "notification": "pw1:3:7",
        "colour": "teal",
    }
    return ToyPublished(**(fields | changed))


def _pipeline(parts: list[MediaPart], **settings: Any) -> MediaPipeline:
    config = FrontendConfig(upstream="http://127.0.0.1:9", secret=SECRET, **settings)
    publisher = Publisher(config.publisher)
    metrics = MediaMetrics("frontend", CollectorRegistry(), lambda: 0.0, lambda: 0.0)
    return MediaPipeline(config, Fetcher(), publisher, metrics, {}, parts)


def _toy_part(data: bytes) -> tuple[MediaPart, dict[str, Any]]:
    holder = {"toy_url": {"url": "data:application/octet-stream;base64," + base64.b64encode(data).decode()}}
    kind = cast(Any, TOY.part)
    return MediaPart(
        "messages[0].content[0]", kind, holder["toy_url"], "url", holder["toy_url"]["url"]
    ), holder


def test_a_registered_medium_goes_through_the_frontends_pipeline_within_the_requests_limits(
    toy: Medium,
) -> None:
    part, holder = _toy_part(b"x" * 100)
    asyncio.run(_pipeline([part]).run())
    assert holder["toy_url"]["url"] == "toy:100"
    # The request's encoded-bytes cap is the pipeline's, whatever the medium.
    part, holder = _toy_part(b"x" * 100)
    with pytest.raises(OpenAIError, match="max_image_bytes_per_request"):
        asyncio.run(_pipeline([part], max_image_bytes_per_request=99).run())
    assert holder["toy_url"]["url"].startswith("data:")


def test_an_unregistered_medium_is_refused_at_each_layer() -> None:
    part, _ = _toy_part(b"x")
    with pytest.raises(OpenAIError, match="no handler for medium 'toy'"):
        asyncio.run(_pipeline([part]).run())
    # Without its descriptor handler a toy's descriptor is taken for an
    # image's, and refused for lacking an image's fields.
    with pytest.raises(DescriptorError, match="color_type"):
        parse_descriptor(_toy_published())
    with pytest.raises(UnknownMedium):
        WORKER_MEDIA.get("toy")


def test_a_registered_mediums_descriptor_has_the_shared_slot_checks(toy: Medium) -> None:
    desc = _toy_published().to_dict()
    assert desc["metadata"] == {"Toy": {"colour": "teal"}} and desc["pixelwire"]["slot"] == 3
    remote = parse_descriptor(desc)
    assert (remote.medium, remote.record, remote.shape, remote.slot) == (
        "toy",
        {"colour": "teal"},
        (4, 6, 3),
        3,
    )
    with pytest.raises(DescriptorError, match="names another slot"):
        parse_descriptor(_toy_published(notification="pw1:4:7"))
    with pytest.raises(DescriptorError, match="a toy needs its colour"):
        parse_descriptor(desc | {"metadata": {"Toy": {}}})


def test_a_registered_mediums_reference_is_read_by_its_handler_and_only_from_its_part(
    toy: Medium, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIXELWIRE_SECRET", SECRET.decode())
    reference = encode_reference(_toy_published().to_dict(), SECRET)
    metrics, registry = _metrics()
    got = asyncio.run(read_reference(reference, ReadRequest(TOY.part, metrics)))
    assert got == ("toy", {"colour": "teal"}, (4, 6, 3))
    labels = {"medium": "toy", "path": "nixl"}
    assert registry.get_sample_value("pixelwire_worker_media_total", labels) == 1
    with pytest.raises(DescriptorError, match="names a toy, sent as an image part"):
        asyncio.run(read_reference(reference, ReadRequest("image", metrics)))
    forged = encode_reference(_toy_published(slot=4, notification="pw1:4:7").to_dict(), b"t" * 32)
    with pytest.raises(SignatureError, match="signature does not match"):
        asyncio.run(read_reference(forged, ReadRequest(TOY.part, metrics)))


def test_the_publisher_runs_a_registered_mediums_publish_and_the_reader_reads_it(toy: Medium) -> None:
    """``Publisher.publish`` runs a medium's own decode-and-publish off the
    loop; its descriptor parses as that medium and reads back over NIXL."""
    good = (CORPUS / "hopper.png").read_bytes()

    async def main() -> dict[str, int]:
        async with Publisher(pool_bytes=8 << 20) as publisher, pixelwire.Reader() as reader:
            options = ImageOptions("RGB", (255, 255, 255), "HWC", None)
            published = await publisher.publish(ToyPublish(ImageBatch([good], options, threads=1)))
            remote = parse_descriptor(published.to_dict())
            assert (remote.medium, remote.record) == ("toy", {"colour": "teal"})
            np.testing.assert_array_equal(
                await reader.read_remote(remote, output="numpy"), pixelwire.decode_image(good)
            )
            publisher.release(published)
            return publisher.stats()

    stats = asyncio.run(main())
    assert stats["published"] == 1, stats
