//! NIXL's library loaded, and the wire's forms outside the two sides of
//! the transfer: `data:` URLs, request bodies scanned for them, content
//! hashes, notifications.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::args::Encoded;

/// Decodes an RFC 2397 base64 `data:` URL: returns (media type, bytes).
#[pyfunction]
fn decode_data_url<'py>(py: Python<'py>, url: &str) -> PyResult<(String, Bound<'py, PyBytes>)> {
    let parsed = py.detach(|| crate::wire::parse_data_url(url))?;
    Ok((parsed.media_type, PyBytes::new(py, &parsed.bytes)))
}

/// A request body's large `data:` URL string values cut out
/// (`json_body::scan`): (skeleton or None, bound on its JSON values, each
/// cut string's contents as a (start, end) byte range of `raw`).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn scan_json_body<'py>(
    py: Python<'py>,
    raw: &[u8],
    min_len: usize,
    prefix: &str,
) -> (Option<Bound<'py, PyBytes>>, usize, Vec<(usize, usize)>) {
    let scanned = py.detach(|| crate::json_body::scan(raw, min_len, prefix));
    let skeleton = scanned.skeleton.map(|s| PyBytes::new(py, &s));
    (skeleton, scanned.values, scanned.cut)
}

/// The descriptors' `content_hash` of a buffer (`wire::content_hash`).
#[pyfunction]
fn content_hash(py: Python<'_>, data: Encoded<'_>) -> String {
    let bytes = data.as_slice();
    py.detach(|| crate::wire::content_hash(bytes))
}

/// Whether `text` has the form of a `content_hash`.
#[pyfunction]
fn is_content_hash(text: &str) -> bool {
    crate::wire::is_content_hash(text)
}

/// Makes NIXL's C API loadable from the installed wheel's copy.
#[pyfunction]
fn load_nixl(path: &str) -> PyResult<()> {
    Ok(crate::agent::load_library(path)?)
}

/// The notification that ends a hand-out of a published slot
/// (`pw1:<slot>:<generation>`, `:<handout>` after it for a hand-out other
/// than the first): the frontend mints it, a reader sends it back after its
/// READ.
#[pyfunction]
#[pyo3(signature = (slot, generation, handout = 0))]
fn notification_for(slot: u64, generation: u64, handout: u64) -> String {
    crate::wire::notification_for(slot, generation, handout)
}

/// (slot, generation, hand-out) a notification names, if it is one in its
/// one written form.
#[pyfunction]
fn parse_notification(text: &str) -> Option<(u64, u64, u64)> {
    crate::wire::parse_notification(text.as_bytes())
        .filter(|&(s, g, h)| crate::wire::notification_for(s, g, h) == text)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(load_nixl, m)?)?;
    m.add_function(wrap_pyfunction!(decode_data_url, m)?)?;
    m.add_function(wrap_pyfunction!(scan_json_body, m)?)?;
    m.add_function(wrap_pyfunction!(content_hash, m)?)?;
    m.add_function(wrap_pyfunction!(is_content_hash, m)?)?;
    m.add_function(wrap_pyfunction!(notification_for, m)?)?;
    m.add_function(wrap_pyfunction!(parse_notification, m)?)?;
    Ok(())
}
