//! A request body's large `data:` URLs, found before the body is parsed.
//!
//! A chat body that resends its conversation carries every earlier image
//! again as a `data:` URL: megabytes of base64 that a JSON parser written
//! for small values scans byte by byte, and counts, every turn. [`scan`]
//! walks the raw body once at memchr speed and cuts out each string value
//! that is a large `data:` URL, leaving a short placeholder in a skeleton
//! that parses to the same document with those strings swapped. It also
//! bounds the document's values, as the frontend checks before parsing.
//!
//! The skeleton parses exactly as the body would, valid or not: the scan
//! tracks string boundaries the way a JSON tokenizer does (outside a
//! string, `"` opens one; inside, `\` escapes the next byte), and it cuts
//! only strings whose every byte is printable ASCII other than `\`, which
//! are valid string tokens wherever a tokenizer would read them; object
//! keys are never cut. A body that may not be UTF-8 (a NUL in its first
//! four bytes: JSON's UTF-16 and UTF-32 forms) is not cut at all.

use memchr::{memchr2, memchr3};

/// What [`scan`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct ScannedBody {
    /// The body with each cut string replaced by the JSON string
    /// `placeholder(n)` (n counting from 0); the body itself when nothing
    /// was cut.
    pub skeleton: Option<Vec<u8>>,
    /// An upper bound on the document's JSON values: one, plus one per
    /// `{`, `[` and `,` outside strings (every value but the outermost is
    /// an array element or an object member).
    pub values: usize,
    /// Each cut string's contents (without its quotes), as byte ranges of
    /// the body, in order.
    pub cut: Vec<(usize, usize)>,
}

/// Cuts `data:` URL string values of at least `min_len` bytes out of `raw`;
/// each leaves `"<prefix><n>"` in the skeleton (`prefix` is the caller's,
/// unguessable by a client, JSON-safe: it is written as given).
pub fn scan(raw: &[u8], min_len: usize, prefix: &str) -> ScannedBody {
    let may_cut = raw.len() >= 4 && !raw[..4].contains(&0);
    let mut skeleton: Vec<u8> = Vec::new();
    let mut copied = 0; // raw[..copied] is in the skeleton already
    let mut cut = Vec::new();
    let mut values = 1;
    let mut at = 0;
    while let Some(found) = memchr3(b'"', b'{', b'[', &raw[at..]).map(|n| at + n) {
        values += count_commas(&raw[at..found]);
        at = found + 1;
        if raw[found] != b'"' {
            values += 1;
            continue;
        }
        // A string: its contents are raw[found + 1..end].
        let (end, escaped) = string_end(raw, found + 1);
        let Some(end) = end else {
            at = raw.len(); // unterminated: the parser says so
            break;
        };
        at = end + 1;
        let contents = &raw[found + 1..end];
        if may_cut
            && !escaped
            && contents.len() >= min_len.max(5)
            && contents[..5].eq_ignore_ascii_case(b"data:")
            && printable_ascii(contents)
            && !is_key(&raw[end + 1..])
        {
            skeleton.extend_from_slice(&raw[copied..found]);
            skeleton.push(b'"');
            skeleton.extend_from_slice(prefix.as_bytes());
            skeleton.extend_from_slice(cut.len().to_string().as_bytes());
            skeleton.push(b'"');
            copied = end + 1;
            cut.push((found + 1, end));
        }
    }
    values += count_commas(&raw[at.min(raw.len())..]);
    let skeleton = (!cut.is_empty()).then(|| {
        skeleton.extend_from_slice(&raw[copied..]);
        skeleton
    });
    ScannedBody {
        skeleton,
        values,
        cut,
    }
}

/// The index of the `"` closing a string whose contents start at `from`
/// (None: unterminated), and whether the string holds an escape.
fn string_end(raw: &[u8], from: usize) -> (Option<usize>, bool) {
    let mut escaped = false;
    let mut at = from;
    while let Some(found) = memchr2(b'"', b'\\', &raw[at..]).map(|n| at + n) {
        if raw[found] == b'"' {
            return (Some(found), escaped);
        }
        escaped = true;
        at = found + 2; // the escaped byte, whatever it is, is not the end
        if at > raw.len() {
            break;
        }
    }
    (None, escaped)
}

/// Whether the bytes after a string make it an object key (`:` after
/// JSON whitespace).
fn is_key(after: &[u8]) -> bool {
    after
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|&b| b == b':')
}

/// Whether every byte is printable ASCII (0x20 to 0x7e), checked 64 bytes
/// at a time without a branch per byte (the compiler vectorises it: a cut
/// string is hundreds of kilobytes).
fn printable_ascii(bytes: &[u8]) -> bool {
    let outside = |chunk: &[u8]| {
        chunk
            .iter()
            .fold(false, |bad, &b| bad | (b.wrapping_sub(0x20) >= 0x5f))
    };
    let mut chunks = bytes.chunks_exact(64);
    !chunks.any(outside) && !outside(chunks.remainder())
}

fn count_commas(bytes: &[u8]) -> usize {
    memchr::memchr_iter(b',', bytes).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(n: usize) -> String {
        format!("data:image/png;base64,{}", "QUJD".repeat(n))
    }

    fn skeleton(raw: &str, min_len: usize) -> (String, Vec<String>, usize) {
        let scanned = scan(raw.as_bytes(), min_len, "P");
        let skeleton = scanned
            .skeleton
            .map_or(raw.to_string(), |s| String::from_utf8(s).unwrap());
        let cut = scanned
            .cut
            .iter()
            .map(|&(a, b)| raw[a..b].to_string())
            .collect();
        (skeleton, cut, scanned.values)
    }

    #[test]
    fn cuts_large_data_url_values_only() {
        let big = url(10);
        let raw = format!(
            r#"{{"a": "{big}", "{big}": 1, "b": ["{big}" , "data:x", "{big}\u0041"], "c": "x{big}"}}"#
        );
        let (skeleton, cut, _) = skeleton(&raw, 20);
        assert_eq!(
            skeleton,
            format!(
                r#"{{"a": "P0", "{big}": 1, "b": ["P1" , "data:x", "{big}\u0041"], "c": "x{big}"}}"#
            )
        );
        assert_eq!(cut, vec![big.clone(), big]);
    }

    #[test]
    fn strings_are_delimited_as_a_tokenizer_does() {
        let big = url(10);
        // An escaped quote does not end a string; "{", "[" and "," inside
        // strings are not counted.
        let raw = format!(r#"["a\"b,{{[", "{big}", "\\", "{big}"]"#);
        let (skeleton, cut, values) = skeleton(&raw, 20);
        assert_eq!(skeleton, r#"["a\"b,{[", "P0", "\\", "P1"]"#);
        assert_eq!(cut.len(), 2);
        assert_eq!(values, 1 + 1 + 3);
    }

    #[test]
    fn refuses_to_cut_what_might_change_the_parse() {
        let big = url(10);
        for raw in [
            format!("[\"{big}\u{7f}\"]"),    // not printable ASCII
            format!("[\"{big}\n\"]"),        // a raw control byte: invalid JSON
            format!("[\"{big}é\"]"),         // not ASCII
            format!("[\"{big}"),             // unterminated
            format!("[\"{}\"]", &big[..19]), // short
            format!("{{\"{big}\"\n :1}}"),   // a key
        ] {
            let scanned = scan(raw.as_bytes(), 20, "P");
            assert_eq!((scanned.skeleton, scanned.cut), (None, vec![]), "{raw:?}");
        }
        let utf16: Vec<u8> = format!("[\"{big}\"]")
            .bytes()
            .flat_map(|b| [b, 0])
            .collect();
        assert_eq!(scan(&utf16, 20, "P").skeleton, None);
    }

    #[test]
    fn bounds_values_like_counting_every_container_and_comma() {
        for raw in [
            "1",
            "[]",
            "[1,2,3]",
            r#"{"a":[{},[]],"b":"x,y"}"#,
            "[[[,",
            "\"unterminated,[{",
        ] {
            let naive = 1 + raw
                .bytes()
                .filter(|b| matches!(b, b'{' | b'[' | b','))
                .count();
            let values = scan(raw.as_bytes(), 20, "P").values;
            assert!(values <= naive, "{raw}");
        }
        assert_eq!(scan(b"[1,2,[3,{}]]", 20, "P").values, 1 + 3 + 3);
    }
}
