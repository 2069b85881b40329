//! Fuzz harnesses for pixelwire (issue #11).
//!
//! Each `*_one` function takes one fuzzer input. The libFuzzer binaries in
//! `fuzz_targets/` call them, and `tests/regressions.rs` replays every file
//! under `regressions/<target>/` through them on stable Rust, so a crash the
//! fuzzer found stays a test.
//!
//! Panics: pixelwire's decoders run inside `catch_unwind` (`decode::guard`),
//! which turns a panic of a third-party decoder into a typed error and hides
//! it from the panic hook. The harness puts its own hook in front of that:
//!
//! * a panic whose location is pixelwire's own code (not a crate from the
//!   cargo registry) is a bug even when caught: the harness re-raises it
//!   outside the guard, so libFuzzer records a crash;
//! * a caught panic inside a third-party crate is what the guard is for: it
//!   is logged once per location to stderr, and its input is saved under
//!   `$PIXELWIRE_FUZZ_GUARDED_DIR` (when set) for the report. With
//!   `PIXELWIRE_FUZZ_STRICT=1` it is a crash too.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::{Mutex, Once};

use pixelwire::decode::{self, DecodeOptions, Limits, Mode};
use pixelwire::resize::{self, Filter, Kernel, ResizeSpec};
use pixelwire::{json_body, wire};

mod video;
pub use video::{video_one, VIDEO_HEADER};

thread_local! {
    /// Set by the hook when a panic in pixelwire's own code was caught.
    static OWN_PANIC: Cell<Option<&'static str>> = const { Cell::new(None) };
    /// Set by the hook when a caught third-party panic had a new location.
    static NEW_GUARDED: Cell<bool> = const { Cell::new(false) };
}

static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn is_third_party(file: &str) -> bool {
    file.contains("/.cargo/registry/") || file.contains("/.cargo/git/") || file.contains("/vendor/")
}

/// Installs the hook in front of pixelwire's (which itself wraps libFuzzer's
/// abort-on-panic hook). Idempotent.
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Any input that reaches `guard` makes pixelwire install its hook now.
        let _ = decode::probe(b"BM", &Limits::default());
        let inner = std::panic::take_hook();
        let strict = std::env::var_os("PIXELWIRE_FUZZ_STRICT").is_some_and(|v| v != "0");
        std::panic::set_hook(Box::new(move |info| {
            let loc = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_else(|| "<unknown>".into());
            let file = info.location().map(|l| l.file()).unwrap_or("");
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let third_party =
                is_third_party(file) || file.starts_with("/rustc/") || file.is_empty();
            if third_party && !strict {
                let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
                if seen.get_or_insert_with(HashSet::new).insert(loc.clone()) {
                    eprintln!("pixelwire-fuzz: caught third-party panic at {loc}: {msg}");
                    NEW_GUARDED.with(|g| g.set(true));
                }
            } else {
                // pixelwire's own code (or, when strict, anything): must
                // surface even if `guard` catches it.
                let text: &'static str = Box::leak(format!("{loc}: {msg}").into_boxed_str());
                OWN_PANIC.with(|p| p.set(Some(text)));
            }
            // pixelwire's hook: silent inside `guard`, else libFuzzer's
            // (print + abort) or the default one.
            inner(info);
        }));
    });
}

/// Raises a caught own-code panic outside the guard; saves inputs that hit a
/// new third-party panic location.
fn after(target: &str, data: &[u8]) {
    if let Some(text) = OWN_PANIC.with(|p| p.take()) {
        panic!("panic inside pixelwire caught by decode::guard: {text}");
    }
    if NEW_GUARDED.with(|g| g.replace(false)) {
        if let Some(dir) = std::env::var_os("PIXELWIRE_FUZZ_GUARDED_DIR") {
            let dir = std::path::Path::new(&dir).join(target);
            let _ = std::fs::create_dir_all(&dir);
            let name = format!("guarded-{:016x}", fnv(data));
            let _ = std::fs::write(dir.join(name), data);
        }
    }
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn spec_from(bits: u8) -> ResizeSpec {
    ResizeSpec {
        filter: if bits & 1 == 0 {
            Filter::Bilinear
        } else {
            Filter::Bicubic
        },
        kernel: if bits & 2 == 0 {
            Kernel::Torchvision
        } else {
            Kernel::Pillow
        },
    }
}

/// Bytes of the decode target's header, before the image.
pub const DECODE_HEADER: usize = 8;

/// `decode`: 8 header bytes, then the image.
///
/// * `h[0]`: bits 0-1 mode (0 L, 1 RGB, 2/3 RGBA); bit 2 apply EXIF
///   orientation; bit 3 resize; bit 4 bicubic; bit 5 Pillow kernel; bit 6
///   `max_bytes` one below the image's length (must refuse); bit 7 decode
///   twice into differently pre-filled buffers and compare (every output byte
///   must be written).
/// * `h[1]`: bits 0-1 `max_side` (64, 512, 4096, 20000), bits 2-4
///   `max_pixels` (2^10 .. 2^22).
/// * `h[2]`, `h[3]`: resize target height and width (1..=96).
/// * `h[4..7]`: RGB background. `h[7]`: also run `decode::decode` when odd.
pub fn decode_one(data: &[u8]) {
    init();
    decode_inner(data);
    after("decode", data);
}

fn decode_inner(data: &[u8]) {
    if data.len() < DECODE_HEADER {
        return;
    }
    let (h, img) = data.split_at(DECODE_HEADER);
    let mode = match h[0] & 3 {
        0 => Mode::L,
        1 => Mode::Rgb,
        _ => Mode::Rgba,
    };
    let max_side = [64u32, 512, 4096, 20_000][(h[1] & 3) as usize];
    let max_pixels = 1u64 << (10 + 2 * ((h[1] >> 2) & 7).min(6));
    let tight = h[0] & 0x40 != 0 && !img.is_empty();
    let limits = Limits {
        max_bytes: if tight { img.len() - 1 } else { img.len() },
        max_pixels,
        max_side,
    };
    let opts = DecodeOptions {
        mode,
        background: [h[4], h[5], h[6]],
        limits,
        apply_exif_orientation: h[0] & 4 != 0,
    };
    let info = match decode::probe(img, &limits) {
        Ok(info) => info,
        Err(_) => return,
    };
    assert!(
        !tight,
        "probe accepted {} bytes over max_bytes {}",
        img.len(),
        limits.max_bytes
    );
    assert!(info.width >= 1 && info.height >= 1);
    assert!(
        info.width.max(info.height) <= max_side,
        "{info:?} over max_side {max_side}"
    );
    assert!(
        u64::from(info.width) * u64::from(info.height) <= max_pixels,
        "{info:?} over max_pixels {max_pixels}"
    );
    assert!((1..=8).contains(&info.orientation), "{info:?}");
    let shape = info.output_shape(&opts);
    assert_eq!(shape.channels, mode.channels());

    let mut out = vec![0u8; shape.len()];
    let first = decode::decode_into(img, &info, &opts, &mut out);
    if h[0] & 0x80 != 0 {
        let mut again = vec![0xA5u8; shape.len()];
        let second = decode::decode_into(img, &info, &opts, &mut again);
        assert_eq!(
            first.is_ok(),
            second.is_ok(),
            "decode_into is not deterministic"
        );
        if first.is_ok() {
            if let Some(i) = out.iter().zip(&again).position(|(a, b)| a != b) {
                panic!(
                    "decode_into left output bytes unwritten or nondeterministic: first difference at byte {i} of {} ({info:?}, {mode:?})",
                    out.len()
                );
            }
        }
    }
    if h[7] & 1 != 0 {
        // `decode`'s new buffers are not zero-filled for JPEG and still
        // WebP: fill them with a byte `decode_into`'s zeroed buffer does not
        // hold, so a byte the decoder left unwritten shows as a difference.
        #[cfg(fuzzing)]
        decode::poison::set(h[3] | 1);
        match decode::decode(img, &opts) {
            Ok((info2, pixels)) => {
                assert_eq!(info2, info);
                if first.is_ok() {
                    assert!(pixels == out, "decode and decode_into differ");
                }
            }
            Err(_) => assert!(first.is_err(), "decode failed where decode_into succeeded"),
        }
    }
    // A wrong-size buffer is refused, never written past.
    let mut short = vec![0u8; shape.len().saturating_sub(1)];
    assert!(decode::decode_into(img, &info, &opts, &mut short).is_err() || shape.len() == 0);

    if h[0] & 8 != 0 {
        let target = resize::Target {
            height: (h[2] as usize % 96) + 1,
            width: (h[3] as usize % 96) + 1,
            spec: spec_from(h[0] >> 4),
            via: None,
        };
        let rshape = decode::resized_shape(shape, Some(&target));
        let mut small = vec![0x5Au8; rshape.len()];
        let resized = decode::decode_resized_into(img, &info, &opts, Some(&target), &mut small);
        assert_eq!(
            resized.is_ok(),
            first.is_ok(),
            "decode_resized_into disagrees with decode_into"
        );
        if resized.is_ok() {
            let expect = resize::resize(
                &out,
                (shape.height, shape.width),
                shape.channels,
                (target.height, target.width),
                target.spec,
            )
            .expect("resize of a decoded image");
            assert!(
                small == expect,
                "decode_resized_into differs from decode_into + resize"
            );
        }
    }
}

/// `wire`: byte 0 picks a bound and variants, the rest is the text/bytes.
pub fn wire_one(data: &[u8]) {
    init();
    wire_inner(data);
    after("wire", data);
}

fn wire_inner(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let bound = [0usize, 1, 16, 64, 1024, 65536, 1 << 20, 4 << 20][(sel & 7) as usize];

    // base64: strict and forgiving. Whatever the strict decoder accepts the
    // forgiving one accepts with the same bytes; decoded bytes round-trip.
    let strict = wire::decode_base64(rest);
    let forgiving = wire::decode_base64_forgiving(rest);
    // The strict decoder (DecodePaddingMode::Indifferent) also takes short
    // padding ("aGk=" style with one '=' where two belong, see
    // regressions/wire/base64-short-padding), which WHATWG forgiving base64
    // refuses; compare only where the padding is canonical or absent.
    let canonical_padding = !rest.contains(&b'=') || rest.len() % 4 == 0;
    if let (Ok(bytes), true) = (&strict, canonical_padding) {
        match &forgiving {
            Ok(f) => assert_eq!(f, bytes, "strict and forgiving base64 disagree"),
            Err(e) => panic!("forgiving base64 refused what strict accepted: {e}"),
        }
    }
    if let Ok(bytes) = &strict {
        assert_eq!(
            &wire::decode_base64(wire::encode_base64(bytes).as_bytes()).unwrap(),
            bytes
        );
    }
    if let Ok(bytes) = &forgiving {
        assert_eq!(
            &wire::decode_base64(wire::encode_base64(bytes).as_bytes()).unwrap(),
            bytes
        );
    }

    // Text entry points.
    let text = String::from_utf8_lossy(rest);
    for url in [
        text.to_string(),
        format!("data:{text}"),
        format!("data:image/png;base64,{text}"),
    ] {
        if let Ok(parsed) = wire::parse_data_url(&url) {
            assert_eq!(parsed.media_type, parsed.media_type.to_ascii_lowercase());
        }
    }
    for packed in [text.to_string(), format!("b64:{text}")] {
        if let Ok(raw) = wire::unpack_metadata(&packed, bound) {
            assert!(
                raw.len() <= bound,
                "unpack_metadata returned {} > {bound}",
                raw.len()
            );
        }
    }
    // The frontend's body scan: the skeleton is the body with each cut range
    // (in order, inside it) replaced by its placeholder; every cut string
    // is a printable-ASCII data: URL of at least the length asked; the
    // values bound never exceeds the count of every '{', '[' and ','.
    let min_len = [0usize, 5, 8, 64][(sel >> 3 & 3) as usize];
    let scanned = json_body::scan(rest, min_len, "<P>");
    let naive = 1 + rest
        .iter()
        .filter(|b| matches!(b, b'{' | b'[' | b','))
        .count();
    assert!(
        scanned.values <= naive,
        "values {} > {naive}",
        scanned.values
    );
    let mut rebuilt = Vec::new();
    let mut copied = 0;
    for (n, &(start, end)) in scanned.cut.iter().enumerate() {
        assert!(
            copied < start && start <= end && end < rest.len(),
            "cut {start}..{end}"
        );
        assert_eq!((rest[start - 1], rest[end]), (b'"', b'"'));
        let contents = &rest[start..end];
        assert!(contents.len() >= min_len.max(5) && contents[..5].eq_ignore_ascii_case(b"data:"));
        assert!(contents
            .iter()
            .all(|&b| (0x20..0x7f).contains(&b) && b != b'\\' && b != b'"'));
        rebuilt.extend_from_slice(&rest[copied..start]);
        rebuilt.extend_from_slice(format!("<P>{n}").as_bytes());
        copied = end;
    }
    rebuilt.extend_from_slice(&rest[copied..]);
    assert_eq!(scanned.skeleton.unwrap_or_else(|| rest.to_vec()), rebuilt);

    // pack/unpack round trip on the raw bytes.
    if rest.len() <= bound {
        let packed = wire::pack_metadata(rest);
        assert_eq!(wire::unpack_metadata(&packed, bound).unwrap(), rest);
        if !rest.is_empty() {
            assert!(wire::unpack_metadata(&packed, rest.len() - 1).is_err());
        }
    }

    // Agent name out of raw NIXL metadata (also with the magic prepended).
    let mut framed = b"nixlSerDes|Agent".to_vec();
    framed.extend_from_slice(rest);
    for raw in [rest, &framed[..]] {
        if let Ok(name) = wire::metadata_agent_name(raw) {
            assert!(!name.is_empty());
            assert!(name.len() + 25 <= raw.len());
        }
    }

    // Notifications.
    let mut note = b"pw1:".to_vec();
    note.extend_from_slice(rest);
    for msg in [rest, &note[..]] {
        if let Some((slot, generation, handout)) = wire::parse_notification(msg) {
            assert_eq!(
                wire::parse_notification(
                    wire::notification_for(slot, generation, handout).as_bytes()
                ),
                Some((slot, generation, handout))
            );
        }
    }

    // Slot headers: a header built from the bytes is found in them only when
    // its fields are what the bytes say.
    if rest.len() >= 32 {
        let u = |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().unwrap());
        let header = wire::SlotHeader {
            slot: u(8),
            generation: u(24),
            len: u(16),
        };
        let found = header.is_in(rest);
        assert_eq!(
            found,
            rest[..8]
                == wire::SlotHeader {
                    slot: 0,
                    generation: 0,
                    len: 0
                }
                .prefix()[..8]
        );
        let mut built = header.prefix().to_vec();
        built.extend_from_slice(&header.generation.to_le_bytes());
        assert!(header.is_in(&built));
        assert!(!header.is_in(&built[..31]));
        let other = wire::SlotHeader {
            generation: header.generation ^ 1,
            ..header
        };
        assert!(!other.is_in(&built));
    }
    // The content hash: its one form, and the same from pieces hashed apart.
    let hash = wire::content_hash(rest);
    assert!(wire::is_content_hash(&hash), "{hash}");
    let digests: Vec<u64> = rest
        .chunks(wire::HASH_PIECE_BYTES)
        .map(wire::piece_digest)
        .collect();
    assert_eq!(wire::combine_piece_digests(&digests), hash);
}

/// `resize`: 8 header bytes, then pixels (repeated to fill the source).
///
/// * `h[0]`, `h[1]`: source height (1..=64), width (1..=256)
/// * `h[2]`: channels (1..=5)
/// * `h[3]`, `h[4]`: target height (1..=64), width (1..=256)
/// * `h[5]`: bits 0-1 spec; bit 2 a zero dimension; bit 3 a short source;
///   bit 4 a short destination
/// * `h[6]`, `h[7]`: extra destination bytes past the output (must stay untouched)
pub fn resize_one(data: &[u8]) {
    init();
    resize_inner(data);
    after("resize", data);
}

fn resize_inner(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let (h, px) = data.split_at(8);
    let (mut ih, iw) = (h[0] as usize % 64 + 1, h[1] as usize + 1);
    let c = h[2] as usize % 5 + 1;
    let (oh, ow) = (h[3] as usize % 64 + 1, h[4] as usize + 1);
    let spec = spec_from(h[5]);
    if h[5] & 4 != 0 {
        ih = 0;
    }
    let mut in_len = ih * iw * c;
    let src: Vec<u8> = if px.is_empty() {
        vec![0; in_len]
    } else {
        px.iter().copied().cycle().take(in_len).collect()
    };
    if h[5] & 8 != 0 {
        in_len = in_len.saturating_sub(1);
    }
    let src = &src[..in_len];
    let mut out_len = oh * ow * c;
    if h[5] & 16 != 0 {
        out_len -= 1;
    }
    // A short destination gets no slack (else the slack would make it fit).
    let extra = if h[5] & 16 != 0 {
        0
    } else {
        (h[6] as usize) % 17
    };
    let fill = h[7];
    let mut a = vec![fill; out_len + extra];
    let mut b = vec![fill; out_len + extra];
    let ra = resize::resize_into(src, (ih, iw), c, &mut a, (oh, ow), spec);
    let rb = resize::resize_into_scalar(src, (ih, iw), c, &mut b, (oh, ow), spec);
    let must_fail = ih == 0 || h[5] & 8 != 0 || h[5] & 16 != 0;
    assert_eq!(
        ra.is_ok(),
        rb.is_ok(),
        "SIMD and scalar disagree on success: {ra:?} vs {rb:?}"
    );
    assert_eq!(ra.is_err(), must_fail, "{ih}x{iw}x{c} -> {oh}x{ow}: {ra:?}");
    if ra.is_ok() {
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
            panic!(
                "resize_into and resize_into_scalar differ at byte {i} of {}: {}x{}x{} -> {}x{} {:?}",
                out_len, ih, iw, c, oh, ow, spec
            );
        }
        assert!(
            a[out_len..].iter().all(|&v| v == fill),
            "resize wrote past the output"
        );
        if (ih, iw) == (oh, ow) {
            assert_eq!(&a[..out_len], src, "same-size resize is not a copy");
        }
    }
}
