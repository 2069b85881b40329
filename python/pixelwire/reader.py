"""Worker side: :class:`Reader` READs the pixels a descriptor names into its
own registered memory (or a CUDA buffer), checks them, and hands them back
as the caller asked; the READ's notification frees the frontend's slot."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pixelwire import _native
from pixelwire.config import Mode, Output, ReaderSettings
from pixelwire.default_fetcher import default_fetcher
from pixelwire.descriptor import Decoded, PassThrough, RemoteImage, parse_descriptor
from pixelwire.nixl import ensure_nixl
from pixelwire.outputs import OUTPUTS, as_output, pillow, rgb_image_over, torch_module

if TYPE_CHECKING:
    from pixelwire.fetch import Fetcher


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread. The result comes back in a list that
    is emptied here: the future asyncio resolves is kept by the loop until the
    awaiting task next waits, and must not keep a receive slot lent that long
    (reads in place do not wait at all)."""
    box = await asyncio.to_thread(lambda: [fn(*args)])
    return box.pop()


class _LoopCompletions:
    """Reads that finish, announced to one event loop: reads started with
    :attr:`signal` make its file descriptor readable when they end, the loop
    watches it, and a finished ticket's result is then taken in place. No
    Python thread waits for each read (a hand-off to one and back costs a
    thread wake-up and several GIL hand-offs)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.signal = _native.ReadSignal()
        self._waiting: dict[
            int, tuple[_native.ReadTicket | _native.DeviceReadTicket, asyncio.Future[None]]
        ] = {}
        self._retired = False
        loop.add_reader(self.signal.fileno(), self._wake)

    def _wake(self) -> None:
        # Cleared first: a read that ends after this line raises it again.
        self.signal.clear()
        for key, (ticket, future) in list(self._waiting.items()):
            if ticket.done:
                del self._waiting[key]
                if not future.done():
                    future.set_result(None)
        self._unwatch_if_retired()

    async def finished(self, ticket: _native.ReadTicket | _native.DeviceReadTicket) -> None:
        """Returns once `ticket` (started with :attr:`signal`) is done."""
        key = id(ticket)
        future = self.loop.create_future()
        self._waiting[key] = (ticket, future)
        try:
            # Checked after registering: a read that ended before then may
            # have raised the signal for an earlier wake-up.
            if not ticket.done:
                await future
        finally:
            self._waiting.pop(key, None)
            self._unwatch_if_retired()

    def retire(self) -> None:
        """Stops watching once the reads waited for now have finished (on
        the loop's thread)."""
        self._retired = True
        self._unwatch_if_retired()

    def _unwatch_if_retired(self) -> None:
        if self._retired and not self._waiting and not self.loop.is_closed():
            self.loop.remove_reader(self.signal.fileno())


class Reader:
    """Worker side: owns one NIXL agent and a registered receive pool.

    The agent opens with :meth:`open` (or ``async with``, or the first read)
    and ends with :meth:`close`; :attr:`is_open` says which.
    """

    def __init__(
        self, settings: ReaderSettings | None = None, *, fetcher: Fetcher | None = None, **fields: Any
    ) -> None:
        """``settings`` (:class:`pixelwire.config.ReaderSettings`, its
        defaults when None), with any of its fields given by keyword
        instead: ``Reader(timeout=30, verify=True)``. ``fetcher`` fetches
        pass-through URLs (one is made on first use when None)."""
        self._fetcher = fetcher
        self._own_fetcher = fetcher is None
        self.settings = dataclasses.replace(settings or ReaderSettings(), **fields)
        self._native: _native.NativeReader | None = None
        # Read completions for the loop that first awaited a read (other
        # loops wait for theirs in a thread); False where a loop cannot
        # watch a file descriptor.
        self._completions: _LoopCompletions | bool | None = None
        self._cuda_lock = threading.Lock()
        # device index -> (registered staging tensor, registration id): pinned
        # host memory ("pinned") or device memory ("direct"). One a failed
        # READ may still write is the native reader's (it quarantines it).
        self._cuda_staging: dict[int, tuple[Any, int]] = {}
        # device index -> the stream chunks are copied to the device on
        self._cuda_streams: dict[int, Any] = {}

    # -- lifecycle -------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the NIXL agent and its receive pool exist."""
        return self._native is not None

    def open(self) -> Reader:
        """Creates the NIXL agent and its receive pool (idempotent; blocking:
        from async code, ``async with`` does it off the loop)."""
        if self._native is None:
            ensure_nixl()
            self._native = _native.NativeReader(self.settings)
        return self

    async def close(self) -> None:
        """Deregisters CUDA staging and the receive pool, ends the agent and
        closes a fetcher this reader made."""
        native, self._native = self._native, None
        completions, self._completions = self._completions, None
        if isinstance(completions, _LoopCompletions):
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is completions.loop:
                completions.retire()
            elif not completions.loop.is_closed():
                completions.loop.call_soon_threadsafe(completions.retire)
        # After any CUDA read in flight (it holds the lock).
        await _locked(self._cuda_lock)
        try:
            for stream in self._cuda_streams.values():
                # The last read's copies may still read its staging buffer.
                stream.synchronize()
            if native is not None:
                # Deregistered before the tensors go back to torch's
                # allocator (a quarantined one when its quarantine ends: the
                # native reader holds its tensor until then).
                for _, registration in self._cuda_staging.values():
                    native.deregister(registration)
            self._cuda_staging.clear()
            self._cuda_streams.clear()
        finally:
            self._cuda_lock.release()
        if self._own_fetcher and self._fetcher is not None:
            await self._fetcher.close()
            self._fetcher = None

    async def __aenter__(self) -> Reader:
        await asyncio.to_thread(self.open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _opened(self) -> _native.NativeReader:
        self.open()
        assert self._native is not None
        return self._native

    # -- use ------------------------------------------------------------------

    @property
    def fetcher(self) -> Fetcher:
        """The Fetcher pass-through URLs are fetched with (made on first use
        when none was given)."""
        if self._fetcher is None:
            self._fetcher = default_fetcher()
        return self._fetcher

    @property
    def remote_count(self) -> int:
        """Frontends whose NIXL metadata this reader holds (0 when closed)."""
        return self._native.remote_count if self._native is not None else 0

    def stats(self) -> dict[str, int]:
        """Receive-pool usage: bytes_in_use, registered_bytes, remotes,
        registered_caller_buffers (CUDA staging), and what failed READs may
        still write: quarantined_slots, quarantined_caller_buffers, and
        abandoned_reads (READs given up on that UCX may still be serving;
        the reader must be open)."""
        if self._native is None:
            raise RuntimeError("stats(): the Reader is not open (open() or `async with` it first)")
        return dict(self._native.stats())

    async def load(
        self,
        item: Decoded | PassThrough | dict[str, Any],
        *,
        output: Output = "pil",
        device: str = "cpu",
        mode: Mode = "RGB",
    ) -> Any:
        """One call for both switch settings: a decoded descriptor is read
        over NIXL; a URL item is fetched with this reader's Fetcher (same
        guard) and decoded here with the same decoder, in `mode`."""
        _check_output(output)
        if isinstance(item, PassThrough):
            url: Any = item.url
        else:
            url = item.get("url") if isinstance(item, dict) else None
        if url is None:
            assert not isinstance(item, PassThrough)
            return await self.read_decoded(item, output=output, device=device)
        if not isinstance(url, str):
            raise _native.DescriptorError("a pass-through item's url must be a string")
        data = await self.fetcher.fetch(url)
        pixels = await asyncio.to_thread(_native.decode_image, data, mode=mode)
        return as_output(pixels, output, device)

    async def read_decoded(
        self,
        desc: Decoded | dict[str, Any],
        *,
        output: Output = "pil",
        device: str = "cpu",
        shape: Any | None = None,
    ) -> Any:
        """Reads the pixels a descriptor names; returns a PIL image, a numpy
        array (H, W, C) or a torch tensor (H, W, C), all owning their pixels."""
        _check_output(output)  # before the descriptor's own errors
        return await self.read_remote(parse_descriptor(desc, shape), output=output, device=device)

    async def read_remote(self, image: RemoteImage, *, output: Output = "pil", device: str = "cpu") -> Any:
        """:meth:`read_decoded` of a descriptor already parsed
        (:func:`pixelwire.descriptor.parse_descriptor`), for a caller that
        looked at it first: it is checked (expiry, ``max_pixels``) and read,
        not parsed again."""
        _check_output(output)
        image.check(self.settings.max_pixels, time.time())
        if image.frames is not None and output == "pil":
            raise ValueError("video frames are read as output='numpy' or 'torch'")
        native = self._opened()
        if device != "cpu":
            if output != "torch":
                raise ValueError("a CUDA destination needs output='torch'")
            return await self._read_cuda(native, image, device)
        flat = await self._read_host(native, image)
        if not isinstance(flat, np.ndarray):
            # A receive slot lent zero-copy: the array keeps it until freed.
            flat = np.frombuffer(memoryview(flat), dtype=np.uint8)
        if image.layout == "RGBX":
            h, w, _ = image.shape
            if output == "pil":
                return rgb_image_over(flat, w, h)
            return as_output(np.ascontiguousarray(flat.reshape(h, w, 4)[:, :, :3]), output)
        shape = image.shape if image.frames is None else (image.frames, *image.shape)
        return as_output(flat.reshape(shape), output)

    async def _read_host(self, native: _native.NativeReader, image: RemoteImage) -> Any:
        """The pixels in host memory. The READ starts at once on a native
        thread; small images are waited for in place up to ``inline_wait``
        (see ``config.READ_INLINE_BYTES``); the loop awaits the rest, and
        anything slower, through a file descriptor the read raises when it
        ends (:class:`_LoopCompletions`)."""
        completions = self._completions_here()
        ticket = native.start_read(image, completions.signal if completions is not None else None)
        flat = ticket.wait(self.settings.inline_wait) if image.size <= self.settings.inline_bytes else None
        if flat is None and completions is not None:
            await completions.finished(ticket)
            flat = ticket.wait(0)
        if flat is None:
            flat = await _in_thread(ticket.wait)
        return flat

    def _completions_here(self) -> _LoopCompletions | None:
        """This loop's read completions, made on first use (again once the
        loop they were made for has closed: successive ``asyncio.run``
        calls); None for another loop than that one, or one that cannot
        watch a file descriptor."""
        loop = asyncio.get_running_loop()
        if isinstance(self._completions, _LoopCompletions) and self._completions.loop.is_closed():
            self._completions = None
        if self._completions is None:
            try:
                self._completions = _LoopCompletions(loop)
            except (NotImplementedError, OSError, _native.PixelwireError):
                self._completions = False
        if isinstance(self._completions, _LoopCompletions) and self._completions.loop is loop:
            return self._completions
        return None

    async def _read_cuda(self, native: _native.NativeReader, image: RemoteImage, device: str) -> Any:
        """READ for a CUDA destination through a registered staging buffer
        (one per device, grown by replacing it, used by one read at a time):
        pinned host memory whose chunks the native reader copies to the
        device as they land (hashed too, when the reader verifies), on a
        native thread waited for like a host read's (in place for small
        images, else through the loop); or device memory
        UCX writes directly. The slot header is checked after the last
        chunk; pixels go out only if it (and the hash) holds, so a copy
        started from a chunk is discarded with everything else when it does
        not. A staging buffer a failed READ may still write is quarantined
        by the native reader, which keeps it until the transfer has surely
        ended, and the next read gets a new one.

        The device tensor is allocated, in the slot's shape, while the READ
        runs (the first chunk to land waits for it). The tensor comes back once the READ is
        checked, with the last chunk's copy possibly still queued: the
        caller's current stream (when the read starts) is made to wait for
        the copies, so the pixels are there for anything it runs (as with
        ``tensor.to("cuda", non_blocking=True)``); another stream must wait
        on that one first."""
        import torch

        index = _device_index(device)
        if index is None:
            index = torch.cuda.current_device()
        if self.settings.cuda_staging == "direct":
            return await asyncio.to_thread(self._read_cuda_direct, native, image, index)
        await _locked(self._cuda_lock)
        held = True
        try:
            staging, _ = self._staging(native, index, image.size, "Dram")
            stream = self._cuda_streams.get(index)
            if stream is None:
                stream = self._cuda_streams[index] = torch.cuda.Stream(device=index)
            # The loop watches its own completion signal; another loop's
            # read gets a signal of its own, waited for in a thread.
            completions = self._completions_here()
            signal = completions.signal if completions is not None else _native.ReadSignal()
            ticket = native.start_read_to_cuda(
                image,
                staging_addr=staging.data_ptr(),
                device=index,
                stream=stream.cuda_stream,
                chunk_bytes=self.settings.cuda_chunk_bytes,
                signal=signal,
            )

            def finish_abandoned() -> None:
                ticket.wait()
                stream.synchronize()

            def let_go(*buffers: object) -> None:
                # The read goes on into the staging buffer and `buffers`:
                # both are kept, and the lock held, until it and its copies end.
                nonlocal held
                held = False
                threading.Thread(
                    target=_then_release,
                    args=(finish_abandoned, self._cuda_lock, *buffers),
                    daemon=True,
                ).start()

            out = None
            try:
                # While the READ runs: the tensor (in the slot's shape), and
                # the stream made to wait for the copies (the caller's
                # current one).
                out = torch.empty(_pixels_shape(image), dtype=torch.uint8, device=torch.device("cuda", index))
                caller_stream = torch.cuda.current_stream(index)
                ticket.copy_into(out.data_ptr(), ready_on=caller_stream.cuda_stream)
            except BaseException:
                ticket.withhold()  # unless given, no copy is queued: only the READ to wait for
                let_go(out)  # kept all the same, in case it was given
                raise
            # Small images are waited for in place, as host reads are.
            if image.size > self.settings.inline_bytes or ticket.wait(self.settings.inline_wait) is None:
                try:
                    if completions is not None:
                        await completions.finished(ticket)
                    else:
                        await asyncio.to_thread(select.select, [signal.fileno()], [], [])
                except asyncio.CancelledError:
                    let_go(out)
                    raise
                ticket.wait()
        finally:
            if held:
                self._cuda_lock.release()
        if image.pixel_bytes == image.shape[2]:
            return out
        with torch.cuda.stream(caller_stream):  # the stream the copies are ordered before
            return _without_padding(out, image)

    def _read_cuda_direct(self, native: _native.NativeReader, image: RemoteImage, index: int) -> Any:
        """READ straight into registered device memory (``cuda_staging="direct"``)."""

        with self._cuda_lock:
            tensor, _ = self._staging(native, index, image.size, "Vram")
            native.read_into(image, local_addr=tensor.data_ptr(), mem_type="Vram", device=index)
            # A copy: the staging buffer is the next read's.
            return _without_padding(tensor[: image.size], image)

    def _staging(
        self, native: _native.NativeReader, index: int, size: int, mem_type: Literal["Dram", "Vram"]
    ) -> tuple[Any, int]:
        """Device `index`'s registered staging buffer, of at least `size`
        bytes (the caller holds ``_cuda_lock``). One too small, or one a
        failed READ may still write (the native reader quarantines it), is
        given up for a new one: deregistered now, or by the native reader,
        which keeps its tensor, once the quarantine ends."""
        import torch

        staging = self._cuda_staging.get(index)
        if staging is not None and (staging[0].numel() < size or native.quarantined(staging[1])):
            stream = self._cuda_streams.get(index)
            if stream is not None:
                # Copies of the last read may still read it.
                stream.synchronize()
            native.deregister(staging[1])
            staging = None
        if staging is None:
            size = max(size, self.settings.region_bytes)
            if mem_type == "Dram":
                tensor = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                registration = native.register(
                    addr=tensor.data_ptr(), size=size, mem_type="Dram", device=0, owner=tensor
                )
            else:
                tensor = torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", index))
                registration = native.register(
                    addr=tensor.data_ptr(), size=size, mem_type="Vram", device=index, owner=tensor
                )
            staging = self._cuda_staging[index] = (tensor, registration)
        return staging


def _pixels_shape(image: RemoteImage) -> tuple[int, ...]:
    """(H, W, bytes a pixel) of an image's slot; (T, H, W, 3) of a video's."""
    h, w, _ = image.shape
    return (h, w, image.pixel_bytes) if image.frames is None else (image.frames, h, w, image.pixel_bytes)


def _without_padding(slot: Any, image: RemoteImage) -> Any:
    """A new contiguous tensor of the slot's pixels (flat, or in the slot's
    shape) without the fourth byte of an RGBX layout (a plain copy
    otherwise)."""
    import torch

    pixels = slot.view(_pixels_shape(image))
    return pixels[..., : image.shape[2]].clone(memory_format=torch.contiguous_format)


def _check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be 'pil', 'numpy' or 'torch', not {output!r}")
    # Before any work: without the library, the error says what to install.
    if output == "pil":
        pillow()
    elif output == "torch":
        torch_module()


@functools.lru_cache(maxsize=64)
def _device_index(device: str) -> int | None:
    """The index a device string names; None for the current device
    (parsed once a string: a read is tens of microseconds)."""
    import torch

    index: int | None = torch.device(device).index
    return index


async def _locked(lock: threading.Lock) -> None:
    """Acquires `lock` without blocking the event loop (in a thread when it
    is held); a caller cancelled meanwhile does not keep it."""
    if lock.acquire(blocking=False):
        return
    acquiring = asyncio.ensure_future(asyncio.to_thread(lock.acquire))
    try:
        await asyncio.shield(acquiring)
    except asyncio.CancelledError:
        acquiring.add_done_callback(lambda _: lock.release())
        raise


def _then_release(finish: Callable[[], None], lock: threading.Lock, *keep: object) -> None:
    """Runs `finish()` (the end of an abandoned read) and then releases
    `lock`; `keep` holds the read's buffers until then."""
    try:
        finish()
    except _native.PixelwireError:
        pass  # nobody waits for an abandoned read; its staging is quarantined natively if need be
    finally:
        del keep
        lock.release()
