"""What a published slot, image or video, puts in its descriptor, and
what its descriptor says of it."""

from __future__ import annotations

from typing import Any

from pixelwire import _native
from pixelwire.descriptor import PublishedSlot


def slot_fields(agent: str, fields: _native.PublishedSlot) -> dict[str, Any]:
    """The descriptor fields of a slot ``agent`` published, image or video."""
    return {
        "nixl_metadata": fields["metadata"],
        "metadata_version": fields["metadata_version"],
        "metadata_pruned": fields["metadata_pruned"],
        "addr": fields["addr"],
        "size": fields["size"],
        "content_hash": fields["content_hash"],
        "agent": agent,
        "slot": fields["slot"],
        "generation": fields["generation"],
        "expires_at": fields["expires_at"],
        "notification": fields["notification"],
    }


def handout(decoded: PublishedSlot) -> int:
    """Which hand-out of its slot a descriptor is, from its notification."""
    named = _native.parse_notification(decoded.notification)
    return 0 if named is None else named[2]


def release_slot(native: _native.NativePublisher, fields: _native.PublishedSlot) -> None:
    """Ends the hand-out of a slot just published (its publish was abandoned)."""
    native.release(fields["slot"], fields["generation"], fields["handout"])
