//! Bytes that pixelwire hands to another party's decoder, identified first.
//!
//! vLLM's own video and audio loaders (OpenCV's, PyAV's, torchcodec's
//! FFmpeg) open their input with every demuxer and protocol FFmpeg has:
//! concat scripts, playlists (HLS, DASH), SDP descriptions and others that
//! open *other* resources (files on the host, UDP ports). So nothing goes
//! to those loaders unless it is first identified here, from its own bytes,
//! as one real media container, and the identification must be the one
//! FFmpeg's probe reaches:
//!
//! - the container's signature sits at offset 0 and is one FFmpeg's probe
//!   scores at (or next to) its maximum: a demuxer that matches text must
//!   score strictly more to win, and a tie at the maximum finds no format;
//! - a file that FFmpeg would probe past a leading ID3v2 tag (it skips one
//!   in front of any format) is an MP3 only if an MPEG audio frame follows;
//! - the probes that match text past the start are refused outright: a
//!   line beginning `c=IN IP` (SDP, anywhere in the probe buffer) and a
//!   `<MPD` before the first NUL byte (DASH manifests).
//!
//! Images go to vLLM's Pillow, which tries every image plugin it has
//! (EPS through Ghostscript, PSD, SGI, TGA with no signature at all, ...):
//! an image is identified from the signature at its offset 0 as one of the
//! formats pixelwire's own decoders tell by a signature (TGA, which has
//! none, is left out), as Pillow names them.
//!
//! The set is small on purpose: formats that a loader gets from clients in
//! practice. Anything else is refused with [`Error::UnidentifiedMedia`].

use crate::errors::{Error, Result};

/// Which loader the bytes go to: the containers accepted differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    Video,
    Audio,
    Image,
}

impl Medium {
    fn name(self) -> &'static str {
        match self {
            Medium::Video => "video",
            Medium::Audio => "audio",
            Medium::Image => "image",
        }
    }

    fn accepted(self) -> &'static str {
        match self {
            Medium::Video => "MP4/MOV, Matroska/WebM or AVI",
            Medium::Audio => "WAV, FLAC, Ogg, MP3 or ADTS AAC, AIFF, MP4/M4A or Matroska/WebM",
            Medium::Image => "JPEG, PNG, GIF, WebP, BMP, TIFF, ICO, PNM or QOI",
        }
    }
}

/// The containers [`identify`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Container {
    IsoBmff,
    Matroska,
    Avi,
    Wav,
    Flac,
    Ogg,
    Mp3,
    Aiff,
    Jpeg,
    Png,
    Gif,
    Webp,
    Bmp,
    Tiff,
    Ico,
    Pnm,
    Qoi,
}

impl Container {
    pub fn name(self) -> &'static str {
        match self {
            Container::IsoBmff => "mp4",
            Container::Matroska => "matroska",
            Container::Avi => "avi",
            Container::Wav => "wav",
            Container::Flac => "flac",
            Container::Ogg => "ogg",
            Container::Mp3 => "mpeg-audio",
            Container::Aiff => "aiff",
            // Images: the format names Pillow gives them.
            Container::Jpeg => "JPEG",
            Container::Png => "PNG",
            Container::Gif => "GIF",
            Container::Webp => "WEBP",
            Container::Bmp => "BMP",
            Container::Tiff => "TIFF",
            Container::Ico => "ICO",
            Container::Pnm => "PPM",
            Container::Qoi => "QOI",
        }
    }

    fn carries(self, medium: Medium) -> bool {
        match self {
            Container::IsoBmff | Container::Matroska => true,
            Container::Avi => medium == Medium::Video,
            Container::Wav
            | Container::Flac
            | Container::Ogg
            | Container::Mp3
            | Container::Aiff => medium == Medium::Audio,
            Container::Jpeg
            | Container::Png
            | Container::Gif
            | Container::Webp
            | Container::Bmp
            | Container::Tiff
            | Container::Ico
            | Container::Pnm
            | Container::Qoi => medium == Medium::Image,
        }
    }
}

/// The one container `data` is, for a loader of `medium`; or why not.
pub fn identify(data: &[u8], medium: Medium) -> Result<Container> {
    let refuse = |why: String| {
        Error::UnidentifiedMedia(format!(
            "the {} is not one media container pixelwire can vouch for ({why}); accepted: {}",
            medium.name(),
            medium.accepted()
        ))
    };
    let found = if medium == Medium::Image {
        image_signature(data)
    } else {
        signature(data)
    };
    let Some(container) = found else {
        let head: String = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(refuse(format!("first bytes {head}")));
    };
    if !container.carries(medium) {
        return Err(refuse(format!(
            "{} is not a {} container here",
            container.name(),
            medium.name()
        )));
    }
    if medium == Medium::Image {
        return Ok(container);
    }
    if let Some(found) = text_probe_match(data) {
        return Err(refuse(format!(
            "it holds {found}, which FFmpeg would open as a description"
        )));
    }
    Ok(container)
}

/// The container whose signature starts `data`.
fn signature(data: &[u8]) -> Option<Container> {
    let at = |offset: usize, magic: &[u8]| data.get(offset..offset + magic.len()) == Some(magic);
    if iso_bmff(data) {
        Some(Container::IsoBmff)
    } else if at(0, &[0x1A, 0x45, 0xDF, 0xA3]) && matroska_doctype(data) {
        Some(Container::Matroska)
    } else if at(0, b"RIFF") && at(8, b"AVI ") {
        Some(Container::Avi)
    } else if (at(0, b"RIFF") || at(0, b"RF64")) && at(8, b"WAVE") {
        Some(Container::Wav)
    } else if at(0, b"fLaC") {
        Some(Container::Flac)
    } else if at(0, b"OggS\0") {
        Some(Container::Ogg)
    } else if at(0, b"FORM") && (at(8, b"AIFF") || at(8, b"AIFC")) {
        Some(Container::Aiff)
    } else if mpeg_audio_frame(data.get(id3v2_len(data)..).unwrap_or(&[])) {
        Some(Container::Mp3)
    } else {
        None
    }
}

/// The image format whose signature starts `data`, as Pillow's plugins
/// accept it.
fn image_signature(data: &[u8]) -> Option<Container> {
    let at = |offset: usize, magic: &[u8]| data.get(offset..offset + magic.len()) == Some(magic);
    if at(0, b"\xFF\xD8\xFF") {
        Some(Container::Jpeg)
    } else if at(0, b"\x89PNG\r\n\x1a\n") {
        Some(Container::Png)
    } else if at(0, b"GIF87a") || at(0, b"GIF89a") {
        Some(Container::Gif)
    } else if at(0, b"RIFF") && at(8, b"WEBP") {
        Some(Container::Webp)
    } else if at(0, b"BM") {
        Some(Container::Bmp)
    } else if at(0, b"II*\0") || at(0, b"MM\0*") || at(0, b"II+\0") || at(0, b"MM\0+") {
        Some(Container::Tiff)
    } else if at(0, &[0, 0, 1, 0]) {
        Some(Container::Ico)
    } else if at(0, b"qoif") {
        Some(Container::Qoi)
    } else if data.len() >= 2 && data[0] == b'P' && (b'1'..=b'6').contains(&data[1]) {
        Some(Container::Pnm)
    } else {
        None
    }
}

/// An ISO base media file (MP4, MOV, M4A, 3GP): a first box under 16 MiB
/// (its size's first byte is 0, so no text probe sees a string before it)
/// of a type FFmpeg's `mov` probe scores at its maximum, or a QuickTime
/// leading atom; not a JPEG 2000 file (the same box syntax).
fn iso_bmff(data: &[u8]) -> bool {
    let Some(head) = data.get(0..12) else {
        return false;
    };
    let size = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let kind = &head[4..8];
    if head[0] != 0 || !(size == 1 || size >= 8) {
        return false;
    }
    match kind {
        b"ftyp" => !matches!(&head[8..12], b"jp2 " | b"jpx " | b"jpm " | b"mjp2"),
        b"moov" | b"mdat" | b"wide" | b"free" | b"skip" => true,
        _ => false,
    }
}

/// Whether the EBML header names Matroska or WebM as its document type
/// (FFmpeg's `matroska` probe scores an unknown type below its maximum).
fn matroska_doctype(data: &[u8]) -> bool {
    let head = &data[..data.len().min(64)];
    head.windows(11).any(|w| w == b"\x42\x82\x88matroska")
        || head.windows(7).any(|w| w == b"\x42\x82\x84webm")
}

/// The length of an ID3v2 tag at the start of `data` (0 when none), as
/// FFmpeg skips it before probing: a 10-byte header, a syncsafe size and a
/// 10-byte footer when its flag is set.
fn id3v2_len(data: &[u8]) -> usize {
    let Some(h) = data.get(0..10) else {
        return 0;
    };
    if &h[0..3] != b"ID3" || h[3] == 0xFF || h[4] == 0xFF || h[6..10].iter().any(|b| b & 0x80 != 0)
    {
        return 0;
    }
    let size = h[6..10]
        .iter()
        .fold(0usize, |n, b| (n << 7) | usize::from(*b));
    let footer = if h[5] & 0x10 != 0 { 10 } else { 0 };
    10 + size + footer
}

/// An MPEG audio frame header (MP3, MP2, or AAC's ADTS): 11 sync bits, then
/// a valid version, layer, bit rate and sample rate.
fn mpeg_audio_frame(data: &[u8]) -> bool {
    let Some(h) = data.get(0..4) else {
        return false;
    };
    if h[0] != 0xFF || h[1] & 0xE0 != 0xE0 {
        return false;
    }
    let version = (h[1] >> 3) & 3;
    let layer = (h[1] >> 1) & 3;
    if layer == 0 {
        // ADTS (AAC): version bits are the MPEG id and layer 0.
        return h[1] & 0xF6 == 0xF0 && (h[2] >> 2) & 0xF < 13;
    }
    let bitrate = h[2] >> 4;
    let rate = (h[2] >> 2) & 3;
    version != 1 && bitrate != 0 && bitrate != 15 && rate != 3
}

/// What in `data` a text-matching probe that opens other resources would
/// take it for: a line beginning `c=IN IP` (SDP's probe searches every
/// line of its buffer), or `<MPD` before the first NUL (DASH's searches
/// the buffer as a C string).
fn text_probe_match(data: &[u8]) -> Option<&'static str> {
    let sdp = b"c=IN IP";
    let mut line = 0;
    while line < data.len() {
        let start = if data[line] == b'\r' { line + 1 } else { line };
        if data.get(start..start + sdp.len()) == Some(sdp) {
            return Some("an SDP connection line");
        }
        match memchr(b'\n', &data[line..]) {
            Some(at) => line += at + 1,
            None => break,
        }
    }
    let text = &data[..memchr(0, data).unwrap_or(data.len())];
    if text.windows(4).any(|w| w.eq_ignore_ascii_case(b"<mpd")) {
        return Some("a DASH manifest");
    }
    None
}

fn memchr(byte: u8, data: &[u8]) -> Option<usize> {
    data.iter().position(|&b| b == byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp4() -> Vec<u8> {
        let mut v = b"\0\0\0\x18ftypisom\0\0\x02\0isomiso2".to_vec();
        v.extend_from_slice(b"\0\0\0\x08free");
        v
    }

    #[test]
    fn containers_are_named_for_their_medium() {
        assert_eq!(identify(&mp4(), Medium::Video), Ok(Container::IsoBmff));
        assert_eq!(identify(&mp4(), Medium::Audio), Ok(Container::IsoBmff));
        let avi = b"RIFF\x10\0\0\0AVI LIST";
        assert_eq!(identify(avi, Medium::Video), Ok(Container::Avi));
        assert!(identify(avi, Medium::Audio).is_err());
        let wav = b"RIFF\x24\0\0\0WAVEfmt \x10\0\0\0";
        assert_eq!(identify(wav, Medium::Audio), Ok(Container::Wav));
        assert!(identify(wav, Medium::Video).is_err());
        let mkv = b"\x1a\x45\xdf\xa3\xa3\x42\x86\x81\x01\x42\x82\x88matroska\x42\x87\x81\x04";
        assert_eq!(identify(mkv, Medium::Video), Ok(Container::Matroska));
        let mp3 = b"ID3\x03\0\0\0\0\0\x02ab\xff\xfb\x90\x44";
        assert_eq!(identify(mp3, Medium::Audio), Ok(Container::Mp3));
    }

    #[test]
    fn images_are_named_as_pillow_names_them_and_only_as_images() {
        let cases: [(&[u8], Container); 6] = [
            (b"\xff\xd8\xff\xe0\0\x10JFIF\0", Container::Jpeg),
            (b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", Container::Png),
            (b"GIF89a\x01\0\x01\0", Container::Gif),
            (b"RIFF\x24\0\0\0WEBPVP8 ", Container::Webp),
            (b"BM\x36\0\0\0\0\0\0\0\x36\0\0\0", Container::Bmp),
            (b"II*\0\x08\0\0\0", Container::Tiff),
        ];
        for (data, container) in cases {
            assert_eq!(identify(data, Medium::Image), Ok(container));
            assert!(identify(data, Medium::Video).is_err());
        }
        assert_eq!(
            identify(b"MM\0*\0\0\0\x08", Medium::Image),
            Ok(Container::Tiff)
        );
        assert_eq!(
            identify(b"P6\n1 1\n255\n\0\0\0", Medium::Image),
            Ok(Container::Pnm)
        );
        // Formats Pillow decodes that are not vouched for, and videos.
        for data in [
            &b"%!PS-Adobe-3.0 EPSF-3.0\n"[..],
            b"8BPS\0\x01\0\0\0\0\0\0",
            b"\x01\xda\x01\x01\0\x03",
            b"\0\0\x02\0\0\0\0\0\0\0\0\0\x10\0\x10\0\x18\0",
            b"\0\0\0\x14ftypjp2 \0\0\0\0jp2 ",
            b"",
        ] {
            assert!(matches!(
                identify(data, Medium::Image),
                Err(Error::UnidentifiedMedia(_))
            ));
        }
        assert!(identify(&mp4(), Medium::Image).is_err());
    }

    #[test]
    fn descriptions_that_open_other_resources_are_refused() {
        for text in [
            &b"ffconcat version 1.0\nfile a.mp4\n"[..],
            b"#EXTM3U\n#EXT-X-VERSION:3\nseg.ts\n",
            b"v=0\no=- 0 0 IN IP4 127.0.0.1\nc=IN IP4 127.0.0.2\nm=video 5004 RTP/AVP 96\n",
            b"<?xml version=\"1.0\"?><MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\">",
        ] {
            assert!(matches!(
                identify(text, Medium::Video),
                Err(Error::UnidentifiedMedia(_))
            ));
            assert!(matches!(
                identify(text, Medium::Audio),
                Err(Error::UnidentifiedMedia(_))
            ));
        }
        // An ID3 tag does not make whatever follows it an MP3.
        let tagged = b"ID3\x03\0\0\0\0\0\x02abffconcat version 1.0\n";
        assert!(identify(tagged, Medium::Audio).is_err());
        // A Matroska signature with SDP lines behind it (no NUL at a line start).
        let mut mkv = b"\x1a\x45\xdf\xa3\x9f\x42\x82\x88matroska\n".to_vec();
        mkv.extend_from_slice(b"c=IN IP4 127.0.0.2\nm=video 5004 RTP/AVP 96\n");
        assert!(identify(&mkv, Medium::Video).is_err());
        // Matroska whose document type FFmpeg does not score at its maximum.
        assert!(identify(b"\x1a\x45\xdf\xa3\x9f\x42\x82\x84abcd", Medium::Video).is_err());
        // A JPEG 2000 file has MP4's box syntax but is not a video.
        assert!(identify(b"\0\0\0\x14ftypjp2 \0\0\0\0jp2 ", Medium::Video).is_err());
        assert!(identify(b"", Medium::Video).is_err());
    }
}
