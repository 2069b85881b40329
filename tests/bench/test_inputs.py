"""The serving benchmark's media (`python/pixelwire/bench/inputs.py`): the
distinct copies of a video the multi-turn video workload sends, one per
conversation. Tiny clips made with the ffmpeg CLI; no servers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pixelwire.bench.inputs import distinct_video
from pixelwire.video import decode_video

import video_clips

MP4S = ["h264_high_bframes.mp4", "h264_short_gops.mp4"]


@pytest.mark.parametrize("name", MP4S)
def test_a_distinct_copy_of_an_mp4_has_bytes_of_its_own_and_the_same_frames(
    name: str, tmp_path: Path
) -> None:
    """Each seed's copy differs from the clip and from another seed's (a
    cache key of its own), and decodes to the clip's frames exactly."""
    clip = video_clips.make(name, video_clips.CLIPS[name], tmp_path)
    one, two = distinct_video(clip, 1), distinct_video(clip, 2)
    assert len({clip, one, two}) == 3 and one.startswith(clip)
    frames, metadata = decode_video(clip, num_frames=4)
    copied, copied_metadata = decode_video(one, num_frames=4)
    assert frames.shape[0] == 4
    np.testing.assert_array_equal(copied, frames)
    assert copied_metadata == metadata


def test_a_video_that_is_not_iso_bmff_gets_no_copy(tmp_path: Path) -> None:
    """A Matroska clip (no ftyp box first): a ValueError that names what is needed."""
    name = "h264_baseline.mkv"
    clip = video_clips.make(name, video_clips.CLIPS[name], tmp_path)
    with pytest.raises(ValueError, match="MP4 or MOV"):
        distinct_video(clip, 1)
