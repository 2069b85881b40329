//! pixelwire: native image decoding and NIXL pixel transfer for multimodal
//! LLM serving.
//!
//! The real work lives in plain Rust modules; `python/` holds the thin PyO3
//! wrappers and this file only wires the `pixelwire._native` module.

pub mod agent;
pub mod background;
pub mod cuda;
pub mod decode;
pub mod errors;
pub mod fair;
pub mod foreign;
pub mod identify;
pub mod json_body;
pub mod patches;
pub mod pool;
pub mod publisher;
mod python;
pub mod quarantine;
pub mod reader;
pub mod region;
pub mod remotes;
pub mod resize;
pub mod video;
pub mod wire;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    python::register(m)?;
    Ok(())
}
