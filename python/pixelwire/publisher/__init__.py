"""Frontend side: :class:`Publisher` decodes media straight into
NIXL-registered memory and hands out their descriptors.

The parts: :mod:`~pixelwire.publisher.publisher` the class (its agent and
pool, the calls images and videos come through), :mod:`~pixelwire.publisher.images`
a batch of images decoded and published side by side,
:mod:`~pixelwire.publisher.cached` the same through the cache of published
images, :mod:`~pixelwire.publisher.video` a video's sampled frames into one
slot, :mod:`~pixelwire.publisher.medium` what a medium's publish implements
for :meth:`Publisher.publish`, :mod:`~pixelwire.publisher.off_loop` how any publish runs off the
event loop and is cancelled, :mod:`~pixelwire.publisher.slots` what a slot
puts in its descriptor.
"""

from pixelwire.publisher.publisher import Publisher

__all__ = ["Publisher"]
