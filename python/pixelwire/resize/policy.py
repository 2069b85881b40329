"""What every resize family's policy is: the size a model's processor
resizes an image to, the size to ship it at, the native decoder's resize
steps, and the identity string that names it all (signed into descriptors
and compared between frontend and worker in the handshake, so a family's
identity never changes for a config it already read)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

Kernel = Literal["torchvision", "pillow"]
Filter = Literal["bicubic", "bilinear", "lanczos"]


@dataclass(frozen=True, kw_only=True)
class ResizePolicy(ABC):
    """The resize a model's processor applies; a family subclasses it with
    its own settings and arithmetic (:meth:`processor_target`, and
    :attr:`shape` for the identity)."""

    # The family's name, the first part of its identity.
    family: ClassVar[str]
    # Ships images the processor turns into outputs that differ from its
    # outputs on the original; opted into by --resize-approximate and
    # PIXELWIRE_RESIZE_APPROXIMATE.
    approximate: ClassVar[bool] = False
    filter: Filter = "bicubic"
    kernel: Kernel = "torchvision"

    @property
    @abstractmethod
    def shape(self) -> str:
        """The family's part of :attr:`identity`: its name and settings."""

    @abstractmethod
    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        """The (height, width) the processor resizes a (height, width) image
        (or the frames of a ``num_frames`` video, for a per-video family) to."""

    @property
    def identity(self) -> str:
        """One string naming everything that shapes the output; equal
        identities resize every image alike."""
        return f"{self.shape}:{self.kernel}:{self.filter}" + (":approximate" if self.approximate else "")

    def target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        """The (height, width) to ship a (height, width) image at: the size
        the processor resizes it to, or its own size when the processor would
        resize that result again (a side clamped to the factor at an extreme
        aspect ratio leaves it over the pixel budget): only a size the
        processor leaves alone gives its outputs exactly."""
        resized = self.processor_target(height, width, num_frames)
        if min(resized) < 1:
            # Pixtral's floor at an extreme aspect ratio: the processor
            # fails on the image, as it will on vLLM's own.
            return height, width
        if resized != (height, width) and not self.leaves_alone(*resized, num_frames):
            return height, width
        return resized

    def leaves_alone(self, height: int, width: int, num_frames: int | None = None) -> bool:
        """Whether the processor keeps a (height, width) image (or frames of
        a ``num_frames`` video) as it is."""
        return self.processor_target(height, width, num_frames) == (height, width)

    def steps(self, height: int, width: int) -> list[tuple[int, int]]:
        """The sizes the native decoder resizes a (height, width) image to,
        in turn (its ``resize=``): :meth:`target`, in one step unless the
        family's processor resizes twice."""
        return [self.target(height, width)]

    def video_target(
        self, height: int, width: int, frames: int, total_frames: int, fps: float = 0.0
    ) -> tuple[int, int]:
        """The (height, width) to ship each of ``frames`` frames sampled
        from a video of ``total_frames`` at (``total_frames`` and ``fps``:
        vLLM's ``total_num_frames`` and ``fps`` metadata): each frame's
        :meth:`target`, unless the family sizes a whole video."""
        return self.target(height, width, frames)
