//! `nodeagent._native`: the hot paths of nodeagent (watch store, semantic equality, slice planner).

use pyo3::prelude::*;

/// The watch store allocates and frees an object buffer (~1 KB) per event; mimalloc's
/// thread-local free lists make that markedly cheaper than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod inventory;
mod json;
pub mod planner;
mod pytypes;
pub mod store;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<store::Store>()?;
    store::register(m)?;
    m.add_class::<store::pmap::PMap>()?;
    planner::register(m)?;
    inventory::register(m)?;
    Ok(())
}
