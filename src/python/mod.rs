//! Thin PyO3 wrappers over the plain-Rust core. Every heavy call runs with
//! the GIL released. This file only wires the modules: `decode` (decoding
//! and its options), `publisher` and `reader` (the two sides of the
//! transfer), `control` (cancelling a publish or a video's decode),
//! `tickets`, `video`, `patches`, `wire`, `errors`; `args` and `pixels` are
//! what they share.

use pyo3::prelude::*;

mod args;
mod control;
mod decode;
mod errors;
mod patches;
mod pixels;
mod publisher;
mod reader;
mod tickets;
mod video;
mod wire;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    wire::register(m)?;
    publisher::register(m)?;
    control::register(m)?;
    reader::register(m)?;
    tickets::register(m)?;
    video::register(m)?;
    decode::register(m)?;
    m.add_function(wrap_pyfunction!(patches::join_patch_rows, m)?)?;
    m.add_function(wrap_pyfunction!(patches::video_patch_rows, m)?)?;
    Ok(())
}
