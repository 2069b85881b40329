"""The ``shortest_edge`` family: ``size: {shortest_edge}`` (CLIP,
LLaVA-1.5; the worker still does its centre crop). A CLIP config with
``size: {height, width}`` is the fixed family's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pixelwire.resize.families import fixed
from pixelwire.resize.policy import ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy


@dataclass(frozen=True, kw_only=True)
class ShortestEdgePolicy(ResizePolicy):
    """The shortest edge to ``shortest_edge``, the other in proportion."""

    family: ClassVar[str] = "shortest_edge"
    shortest_edge: int

    @property
    def shape(self) -> str:
        return f"shortest_edge:{self.shortest_edge}"

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        # transformers' get_resize_output_image_size(default_to_square=False)
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)


def read(image: ImageConfig) -> ResizePolicy:
    filter_ = image.resize_filter()
    fixed.check_whole_image(image)
    size = image.size()
    if "height" in size:
        return fixed.sized(image, filter_)
    edge = size.get("shortest_edge")
    if not isinstance(edge, int) or edge <= 0 or size.get("longest_edge"):
        raise NoPolicy(f"{image.name}: size {size} is not {{shortest_edge}}")
    return ShortestEdgePolicy(filter=filter_, kernel=image.kernel, shortest_edge=edge)
