"""Video decoding with vLLM's video loaders' frames and metadata.

``decode_video(data, loader=..., num_frames=..., fps=...)`` returns what
``VIDEO_LOADER_REGISTRY.load(loader).load_bytes(data, ...)`` returns in vLLM
0.32 with its default ``opencv`` decoding backend: a C-contiguous uint8
``(T, H, W, 3)`` RGB array and the metadata dict. Decoding is pixelwire's
own FFmpeg 9.0.2 (the version opencv-python-headless 5.1 bundles), called
the way OpenCV calls it, so the frames are OpenCV's byte for byte.
"""

from pixelwire.video.decode import decode_video
from pixelwire.video.loaders import LOADERS, Loader, SourceMetadata

__all__ = ["LOADERS", "Loader", "SourceMetadata", "decode_video"]
