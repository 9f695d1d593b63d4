//! `nodeagent._native`: the hot paths of nodeagent (watch store, semantic equality, slice planner).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The watch store allocates and frees an object buffer (~1 KB) per event; mimalloc's
/// thread-local free lists make that markedly cheaper than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod inventory;
mod json;
pub mod planner;
mod pytypes;
pub mod quantity;
pub mod store;

// --- quantities, for the reporter (Python) as for the planner and the inventory rules (Rust) ----

fn parse_quantity(s: &str) -> PyResult<quantity::Quantity> {
    quantity::parse(s).map_err(PyValueError::new_err)
}

/// (value in nanos, format name) of a quantity string; ValueError if invalid.
#[pyfunction]
fn quantity_parse(s: &str) -> PyResult<(i128, &'static str)> {
    let q = parse_quantity(s)?;
    Ok((q.nanos, q.format.name()))
}

/// The canonical spelling of a quantity (what the API server would print).
#[pyfunction]
fn quantity_canonical(s: &str) -> PyResult<String> {
    Ok(quantity::canonical(&parse_quantity(s)?))
}

/// -1, 0 or 1 comparing two quantities by value.
#[pyfunction]
fn quantity_cmp(a: &str, b: &str) -> PyResult<i8> {
    Ok(parse_quantity(a)?.cmp_value(&parse_quantity(b)?) as i8)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<store::Store>()?;
    store::register(m)?;
    m.add_class::<store::pmap::PMap>()?;
    m.add_function(wrap_pyfunction!(quantity_parse, m)?)?;
    m.add_function(wrap_pyfunction!(quantity_canonical, m)?)?;
    m.add_function(wrap_pyfunction!(quantity_cmp, m)?)?;
    planner::register(m)?;
    inventory::register(m)?;
    Ok(())
}
