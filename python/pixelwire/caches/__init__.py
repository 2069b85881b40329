"""Every cache pixelwire keeps, each behind one interface
(:class:`~pixelwire.caches.interface.Cache`: its key, its budget and what
it holds, its hits and misses for the metrics), each keeping what it keeps:

* :mod:`~pixelwire.caches.published_images`: the frontend's published
  images, pinned in its pool, handed out again for a repeat;
* :mod:`~pixelwire.caches.data_urls`: ``data:`` URLs decoded lately (beside
  either side's image cache) or, in a frontend in worker mode, sent to the
  worker (by digest: a resent one goes on as a reference);
* :mod:`~pixelwire.caches.worker_images`: the vLLM plug-in's copies of the
  images it handed vLLM.
"""
