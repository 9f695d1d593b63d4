//! `nodeagent._native`: the hot paths of nodeagent (watch store, semantic equality, slice planner).

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
