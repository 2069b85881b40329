//! An MP4's sample tables checked against the file's size before FFmpeg
//! reads them.
//!
//! FFmpeg's `mov` demuxer builds one index entry (24 bytes) per sample a
//! track claims, before a frame is decoded: a 35 KB file whose `stsz` box
//! claims 89 million samples of a constant size costs it 2 GB and seconds
//! of work, and a `trun` box can claim as many with no bytes per sample.
//! Every real sample is at least one byte of the file, so a table that
//! claims more samples (or more bytes of samples) than the file holds is
//! refused here, from the box headers alone: the index FFmpeg builds is
//! then at most a small multiple of the file's size.

use crate::errors::{Error, Result};

/// Boxes whose children are boxes (the path to every sample table).
const CONTAINERS: [&[u8; 4]; 9] = [
    b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf", b"mvex", b"edts",
];

/// Refuses an ISO base media file (MP4, MOV) whose sample tables claim
/// more samples than `data` could hold; anything else passes untouched.
pub fn check(data: &[u8]) -> Result<()> {
    walk(data, data.len() as u64, 0)
}

fn walk(boxes: &[u8], file_len: u64, depth: usize) -> Result<()> {
    let mut at = 0usize;
    while let Some(header) = boxes.get(at..at + 8) {
        let size32 = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let kind: &[u8; 4] = header[4..8].try_into().expect("4 bytes");
        let (size, head) = match size32 {
            0 => ((boxes.len() - at) as u64, 8),
            1 => match boxes.get(at + 8..at + 16) {
                Some(large) => (u64::from_be_bytes(large.try_into().expect("8 bytes")), 16),
                None => return Ok(()),
            },
            n => (u64::from(n), 8),
        };
        if size < head as u64 {
            return Ok(()); // a broken box: FFmpeg's own parser stops there
        }
        let end = at
            .saturating_add(usize::try_from(size).unwrap_or(usize::MAX))
            .min(boxes.len());
        let body = &boxes[(at + head).min(end)..end];
        if CONTAINERS.contains(&kind) && depth < 16 {
            walk(body, file_len, depth + 1)?;
        } else {
            check_table(kind, body, file_len)?;
        }
        if end >= boxes.len() {
            break;
        }
        at = end;
    }
    Ok(())
}

/// One leaf box: its claimed samples against the file's size.
fn check_table(kind: &[u8; 4], body: &[u8], file_len: u64) -> Result<()> {
    let word = |offset: usize| -> Option<u64> {
        body.get(offset..offset + 4)
            .map(|b| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
    };
    let claimed = match kind {
        // version/flags, sample_size, sample_count: a constant size claims
        // count * size bytes; a table claims count samples of >= 1 byte.
        b"stsz" => match (word(4), word(8)) {
            (Some(size), Some(count)) => count.saturating_mul(size.max(1)),
            _ => return Ok(()),
        },
        // version/flags, reserved + field size, sample_count.
        b"stz2" => word(8).unwrap_or(0),
        // version/flags, sample_count, ...
        b"trun" => word(4).unwrap_or(0),
        // version/flags, entry_count, then (sample_count, delta) pairs.
        b"stts" | b"ctts" => match word(4) {
            Some(entries) => (0..entries.min(body.len() as u64 / 8))
                .filter_map(|i| word(8 + 8 * i as usize))
                .fold(0u64, u64::saturating_add),
            None => 0,
        },
        _ => 0,
    };
    if claimed > file_len {
        let name = String::from_utf8_lossy(kind);
        return Err(Error::Video(format!(
            "the MP4's {name} box claims {claimed} bytes of samples in a file of {file_len} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut b = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        b.extend_from_slice(kind);
        b.extend_from_slice(body);
        b
    }

    fn nest(kinds: &[&[u8; 4]], inner: Vec<u8>) -> Vec<u8> {
        kinds
            .iter()
            .rev()
            .fold(inner, |inside, kind| leaf(kind, &inside))
    }

    fn stsz(size: u32, count: u32) -> Vec<u8> {
        let mut body = vec![0; 4];
        body.extend_from_slice(&size.to_be_bytes());
        body.extend_from_slice(&count.to_be_bytes());
        leaf(b"stsz", &body)
    }

    #[test]
    fn a_constant_size_table_claiming_more_than_the_file_is_refused() {
        let path: [&[u8; 4]; 5] = [b"moov", b"trak", b"mdia", b"minf", b"stbl"];
        let mut file = nest(&path, stsz(100, 89_000_000));
        file.extend(leaf(b"mdat", &[0; 64]));
        let refused = check(&file).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("stsz box claims 8900000000 bytes"),
            "{refused}"
        );
        let honest = nest(&path, stsz(1, 4));
        assert_eq!(check(&honest), Ok(()));
    }

    #[test]
    fn time_tables_and_fragments_count_their_samples() {
        let mut stts = vec![0, 0, 0, 0, 0, 0, 0, 1];
        stts.extend_from_slice(&u32::MAX.to_be_bytes());
        stts.extend_from_slice(&1u32.to_be_bytes());
        assert!(check(&nest(
            &[b"moov", b"trak", b"mdia", b"minf", b"stbl"],
            leaf(b"stts", &stts)
        ))
        .is_err());
        let mut trun = vec![0; 4];
        trun.extend_from_slice(&50_000_000u32.to_be_bytes());
        assert!(check(&nest(&[b"moof", b"traf"], leaf(b"trun", &trun))).is_err());
    }

    #[test]
    fn other_bytes_and_broken_boxes_pass_to_ffmpegs_own_checks() {
        assert_eq!(check(b""), Ok(()));
        assert_eq!(check(b"\x1a\x45\xdf\xa3 not an mp4 at all"), Ok(()));
        assert_eq!(check(b"\0\0\0\x04moov"), Ok(()));
        assert_eq!(check(b"\0\0\0\x01moov\0\0"), Ok(()));
    }
}
