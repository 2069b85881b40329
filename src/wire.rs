//! Bytes on the wire: base64 and `data:` URLs, compressed NIXL metadata,
//! slot headers, a descriptor's source, notifications and the pixel
//! content hash.

use std::io::{Read, Write};

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

use crate::errors::{Error, Result};

/// Standard alphabet; padding may be present or not (both occur in data
/// URLs in the wild), anything else outside the alphabet is an error.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

pub fn decode_base64(text: &[u8]) -> Result<Vec<u8>> {
    BASE64
        .decode(text)
        .map_err(|e| Error::InvalidData(format!("invalid base64: {e}")))
}

/// Base64 as browsers read it in `data:` URLs (WHATWG "forgiving base64":
/// ASCII whitespace ignored, padding optional), SIMD-accelerated.
pub fn decode_base64_forgiving(text: &[u8]) -> Result<Vec<u8>> {
    base64_simd::forgiving_decode_to_vec(text)
        .map_err(|_| Error::InvalidData("invalid base64".into()))
}

pub fn encode_base64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// A parsed RFC 2397 `data:` URL.
#[derive(Debug, PartialEq, Eq)]
pub struct DataUrl {
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// Parses `data:[<media type>][;params];base64,<payload>`. Only base64
/// payloads carry images; a percent-encoded one is refused. Error messages
/// never echo the payload.
pub fn parse_data_url(url: &str) -> Result<DataUrl> {
    let rest = url
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("data:"))
        .map(|_| &url[5..])
        .ok_or_else(|| Error::InvalidData("not a data: URL".into()))?;
    let comma = rest
        .find(',')
        .ok_or_else(|| Error::InvalidData("data: URL has no ',' before its payload".into()))?;
    let (header, payload) = (&rest[..comma], &rest[comma + 1..]);
    let mut parts = header.split(';');
    let media_type = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err(Error::InvalidData(format!(
            "data: URL with media type {media_type:?} is not base64-encoded; only base64 data URLs are accepted"
        )));
    }
    let bytes = decode_base64_forgiving(payload.as_bytes()).map_err(|e| {
        Error::InvalidData(format!("data: URL payload ({} chars): {e}", payload.len()))
    })?;
    Ok(DataUrl { media_type, bytes })
}

/// `"b64:" + base64(zlib(metadata))`, the form dynamo's decoded-media
/// descriptors carry NIXL agent metadata in.
pub fn pack_metadata(raw: &[u8]) -> String {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(raw).expect("writing to a Vec cannot fail");
    let compressed = z.finish().expect("writing to a Vec cannot fail");
    format!("b64:{}", encode_base64(&compressed))
}

/// Inverse of [`pack_metadata`], bounded so a hostile descriptor cannot
/// inflate without limit.
pub fn unpack_metadata(packed: &str, max_len: usize) -> Result<Vec<u8>> {
    let body = packed
        .strip_prefix("b64:")
        .ok_or_else(|| Error::Descriptor("nixl_metadata must start with 'b64:'".into()))?;
    let compressed = decode_base64(body.as_bytes())
        .map_err(|e| Error::Descriptor(format!("nixl_metadata: {e}")))?;
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(&compressed[..])
        .take(max_len as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::Descriptor(format!("nixl_metadata is not valid zlib data: {e}")))?;
    if out.len() > max_len {
        return Err(Error::Descriptor(format!(
            "nixl_metadata inflates past {max_len} bytes"
        )));
    }
    Ok(out)
}

/// Bytes reserved before every published image's pixels for its slot
/// header, which the worker READs back after the pixels (a seqlock over
/// NIXL): a slot freed or reused while its pixels were in flight no longer
/// carries the header the descriptor names. 64 keeps the pixels on a cache
/// line of their own.
pub const SLOT_HEADER_BYTES: usize = 64;
const SLOT_MAGIC: [u8; 8] = *b"pwslot\x00\x02";

/// What a live slot's header says: which slot, which occupant, how many
/// pixel bytes. A free slot's generation field is 0, which no occupant has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    pub slot: u64,
    pub generation: u64,
    pub len: u64,
}

impl SlotHeader {
    /// Offsets inside the header: magic, slot, len, then the generation,
    /// which is written last when a slot is published and first (to 0) when
    /// it is freed.
    pub const GENERATION_AT: usize = 24;

    /// The header's first 24 bytes (magic, slot, len); the generation goes
    /// at [`SlotHeader::GENERATION_AT`].
    pub fn prefix(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&SLOT_MAGIC);
        out[8..16].copy_from_slice(&self.slot.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Whether `bytes` (a header as READ from the frontend) is this one.
    pub fn is_in(&self, bytes: &[u8]) -> bool {
        bytes.len() >= Self::GENERATION_AT + 8
            && bytes[..24] == self.prefix()
            && bytes[Self::GENERATION_AT..Self::GENERATION_AT + 8] == self.generation.to_le_bytes()
    }
}

/// Where a descriptor's pixels are and how to check them: what a reader
/// READs (`crate::reader`).
#[derive(Clone, Debug)]
pub struct Source {
    /// The frontend's agent name; empty for descriptors that carry none
    /// (dynamo's RdmaMetadata): the metadata names it.
    pub agent: String,
    pub metadata: String,
    /// Ordered versions of a frontend's metadata (pixelwire descriptors);
    /// `None`: only equal metadata is known to be current.
    pub metadata_version: Option<u64>,
    /// The last version of the frontend's metadata that dropped a region:
    /// a reader that has loaded it (or later) adds what is new without
    /// reconnecting. `None`: unknown, reconnect.
    pub metadata_pruned: Option<u64>,
    pub addr: usize,
    pub len: usize,
    pub content_hash: Option<String>,
    /// The slot header just before the pixels (pixelwire descriptors).
    pub header: Option<SlotHeader>,
    pub notification: String,
}

/// The notification a reader attaches to its READ so the frontend ends its
/// hand-out of the slot: `pw1:<slot>:<generation>` for the first hand-out
/// (the publish's), `pw1:<slot>:<generation>:<handout>` for each later one
/// (a cache hit's), so each hand-out is ended once, by its own reader.
pub fn notification_for(slot: u64, generation: u64, handout: u64) -> String {
    if handout == 0 {
        format!("pw1:{slot}:{generation}")
    } else {
        format!("pw1:{slot}:{generation}:{handout}")
    }
}

/// Inverse of [`notification_for`] on the raw bytes a peer sent: (slot,
/// generation, hand-out); `None` for anything else (including bytes that are
/// not UTF-8).
pub fn parse_notification(msg: &[u8]) -> Option<(u64, u64, u64)> {
    let text = std::str::from_utf8(msg).ok()?;
    let mut parts = text.strip_prefix("pw1:")?.split(':');
    let slot = parts.next()?.parse().ok()?;
    let generation = parts.next()?.parse().ok()?;
    let handout = match parts.next() {
        None => 0,
        Some(n) => n.parse().ok()?,
    };
    match parts.next() {
        None => Some((slot, generation, handout)),
        Some(_) => None,
    }
}

/// The agent name raw NIXL metadata carries (NIXL 1.5's serialisation:
/// `nixlSerDes|Agent<u64 LE length><name>|...`), read before the metadata is
/// loaded so a descriptor that names one agent cannot load another's.
pub fn metadata_agent_name(raw: &[u8]) -> Result<String> {
    let bad = || Error::Descriptor("nixl_metadata is not NIXL agent metadata".into());
    let rest = raw.strip_prefix(b"nixlSerDes|Agent").ok_or_else(bad)?;
    let (len, rest) = rest.split_at_checked(8).ok_or_else(bad)?;
    let len = u64::from_le_bytes(len.try_into().map_err(|_| bad())?);
    let len = usize::try_from(len).map_err(|_| bad())?;
    let name = rest.get(..len).ok_or_else(bad)?;
    if len == 0 || rest.get(len) != Some(&b'|') {
        return Err(bad());
    }
    String::from_utf8(name.to_vec()).map_err(|_| bad())
}

/// The content hash covers the pixels in pieces of this many bytes (the
/// last may be shorter), each hashed on its own, so that both sides can
/// hash pieces on several threads, and a reader as each lands.
pub const HASH_PIECE_BYTES: usize = 256 * 1024;
/// What a content hash starts with: the function and the piece size.
const HASH_FORM: &str = "xxh3-256k:";

/// One piece's digest (xxh3-64).
pub fn piece_digest(piece: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(piece)
}

/// The content hash from the pieces' digests in order: `xxh3-256k:` and
/// the xxh3-64 of their little-endian bytes, as 16 lowercase hex digits.
pub fn combine_piece_digests(digests: &[u64]) -> String {
    let bytes: Vec<u8> = digests.iter().flat_map(|d| d.to_le_bytes()).collect();
    format!("{HASH_FORM}{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
}

/// The content hash of all the pixels, its pieces hashed in parallel (on
/// the current rayon pool).
pub fn content_hash(pixels: &[u8]) -> String {
    use rayon::prelude::*;
    let digests: Vec<u64> = if pixels.len() > HASH_PIECE_BYTES {
        pixels
            .par_chunks(HASH_PIECE_BYTES)
            .map(piece_digest)
            .collect()
    } else {
        pixels.chunks(HASH_PIECE_BYTES).map(piece_digest).collect()
    };
    combine_piece_digests(&digests)
}

/// Whether `text` has the form [`content_hash`] gives (ASCII only).
pub fn is_content_hash(text: &str) -> bool {
    text.strip_prefix(HASH_FORM).is_some_and(|hex| {
        hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_hashes_have_one_form() {
        assert!(is_content_hash(&content_hash(b"pixels")));
        assert!(is_content_hash(&content_hash(b"")));
        for bad in [
            "",
            "0123456789abcdef",
            "xxh3-256k:0123456789abcde",
            "xxh3-256k:0123456789abcdef0",
            "xxh3-256k:0123456789ABCDEF",
            "xxh3-256k:0123456789abcdeg",
            "xxh3-1m:0123456789abcdef",
            "XXH3-256K:0123456789abcdef",
        ] {
            assert!(!is_content_hash(bad), "{bad}");
        }
        // Not ASCII digits only in name: a Unicode digit is refused too.
        assert!(!is_content_hash("xxh3-256k:0123456789abcd\u{0663}"));
    }

    #[test]
    fn data_urls() {
        let url = "data:image/png;base64,aGVsbG8=";
        assert_eq!(
            parse_data_url(url).unwrap(),
            DataUrl {
                media_type: "image/png".into(),
                bytes: b"hello".to_vec()
            }
        );
        assert_eq!(
            parse_data_url("DATA:;base64,aGVsbG8").unwrap().bytes,
            b"hello"
        );
        assert!(parse_data_url("data:image/png,hello").is_err());
        assert!(parse_data_url("data:image/png;base64,@@@").is_err());
        assert!(parse_data_url("http://x").is_err());
        let secret = "data:image/png;base64,c2VjcmV0!";
        let msg = parse_data_url(secret).unwrap_err().to_string();
        assert!(!msg.contains("c2VjcmV0"));
    }

    #[test]
    fn metadata_round_trip_and_bounds() {
        let raw = vec![7u8; 5000];
        let packed = pack_metadata(&raw);
        assert!(packed.starts_with("b64:"));
        assert_eq!(unpack_metadata(&packed, 5000).unwrap(), raw);
        assert!(unpack_metadata(&packed, 4999).is_err());
        assert!(unpack_metadata("b64:!!!", 10).is_err());
        assert!(unpack_metadata("b64:aGVsbG8=", 10).is_err());
        assert!(unpack_metadata("zz", 10).is_err());
    }

    #[test]
    fn agent_names_are_read_from_metadata() {
        let mut raw = b"nixlSerDes|Agent".to_vec();
        raw.extend_from_slice(&5u64.to_le_bytes());
        raw.extend_from_slice(b"front|Conns...");
        assert_eq!(metadata_agent_name(&raw).unwrap(), "front");
        assert!(metadata_agent_name(&raw[..20]).is_err());
        assert!(metadata_agent_name(b"abc").is_err());
        let mut long = b"nixlSerDes|Agent".to_vec();
        long.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(metadata_agent_name(&long).is_err());
    }

    #[test]
    fn notification_round_trip() {
        assert_eq!(
            parse_notification(notification_for(7, 9, 0).as_bytes()),
            Some((7, 9, 0))
        );
        assert_eq!(notification_for(7, 9, 0), "pw1:7:9");
        assert_eq!(
            parse_notification(notification_for(7, 9, 4).as_bytes()),
            Some((7, 9, 4))
        );
        assert_eq!(parse_notification(b"pw1:x:1"), None);
        assert_eq!(parse_notification(b"pw1:1:2:x"), None);
        assert_eq!(parse_notification(b"pw1:1:2:3:4"), None);
        assert_eq!(parse_notification(b"hello"), None);
        assert_eq!(parse_notification(b"pw1:\xff:1"), None);
    }

    #[test]
    fn slot_headers_name_one_occupant() {
        let header = SlotHeader {
            slot: 3,
            generation: 11,
            len: 4096,
        };
        let mut bytes = [0u8; SLOT_HEADER_BYTES];
        bytes[..24].copy_from_slice(&header.prefix());
        assert!(!header.is_in(&bytes), "generation 0: a free slot");
        bytes[24..32].copy_from_slice(&11u64.to_le_bytes());
        assert!(header.is_in(&bytes));
        assert!(!SlotHeader {
            generation: 12,
            ..header
        }
        .is_in(&bytes));
        assert!(!SlotHeader {
            len: 4095,
            ..header
        }
        .is_in(&bytes));
        assert!(!SlotHeader { slot: 4, ..header }.is_in(&bytes));
        assert!(!header.is_in(&bytes[..31]));
    }

    #[test]
    fn the_hash_is_of_the_pieces_digests_in_order() {
        let h = content_hash(b"abc");
        assert_eq!(
            h,
            format!(
                "xxh3-256k:{:016x}",
                xxhash_rust::xxh3::xxh3_64(&xxhash_rust::xxh3::xxh3_64(b"abc").to_le_bytes())
            )
        );
        assert_eq!(
            content_hash(b""),
            format!("xxh3-256k:{:016x}", xxhash_rust::xxh3::xxh3_64(b""))
        );
    }

    fn bytes_of(len: usize) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    #[test]
    fn pieces_hashed_apart_give_the_hash_of_the_whole() {
        let piece = HASH_PIECE_BYTES;
        for len in [0, 1, piece - 1, piece, piece + 1, 3 * piece + piece / 2] {
            let bytes = bytes_of(len);
            let digests: Vec<u64> = bytes.chunks(piece).map(piece_digest).collect();
            assert_eq!(digests.len(), len.div_ceil(piece), "{len}");
            assert_eq!(
                combine_piece_digests(&digests),
                content_hash(&bytes),
                "{len}"
            );
        }
    }

    #[test]
    fn any_changed_byte_or_piece_order_changes_the_hash() {
        let piece = HASH_PIECE_BYTES;
        let bytes = bytes_of(3 * piece + 5);
        let whole = content_hash(&bytes);
        for at in [0, piece - 1, piece, 2 * piece + 7, 3 * piece + 4] {
            let mut changed = bytes.clone();
            changed[at] ^= 1;
            assert_ne!(content_hash(&changed), whole, "byte {at}");
        }
        let mut swapped = bytes.clone();
        let (first, rest) = swapped.split_at_mut(piece);
        first.swap_with_slice(&mut rest[..piece]);
        assert_ne!(content_hash(&swapped), whole, "pieces swapped");
        assert_ne!(
            content_hash(&bytes[..bytes.len() - 1]),
            whole,
            "one byte short"
        );
    }
}
