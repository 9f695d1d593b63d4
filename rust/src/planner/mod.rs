//! The ResourceSlice planner: Kubernetes quantities, semantic equality of slice specs and the
//! per-pool plan (`nodeagent._native.plan_pool`).

pub mod plan;
pub mod quantity;
pub mod semantic;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

type UpdateTuple = (usize, usize, String, String);
type DeleteTuple = (usize, String, String, String);
type PlanTuple = (
    i64,
    Vec<usize>,
    Vec<UpdateTuple>,
    Vec<usize>,
    Vec<DeleteTuple>,
);

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

/// Whether two ResourceSlice specs (JSON) are semantically equal, ignoring `pool`.
#[pyfunction]
fn slice_spec_equal(py: Python<'_>, a: PyBackedBytes, b: PyBackedBytes) -> PyResult<bool> {
    py.detach(|| {
        let parse = |x: &[u8]| serde_json::from_slice(x).map_err(|e| e.to_string());
        let (va, vb) = (parse(&a)?, parse(&b)?);
        Ok(semantic::equal(
            &semantic::canonicalize(&va),
            &semantic::canonicalize(&vb),
        ))
    })
    .map_err(PyValueError::new_err::<String>)
}

/// Plans one pool; see `_native.pyi`.
#[pyfunction]
fn plan_pool(
    py: Python<'_>,
    desired: Vec<PyBackedBytes>,
    observed: Vec<PyBackedBytes>,
) -> PyResult<PlanTuple> {
    py.detach(|| -> Result<PlanTuple, String> {
        let d = desired
            .iter()
            .enumerate()
            .map(|(i, b)| plan::parse_desired(i, b))
            .collect::<Result<Vec<_>, _>>()?;
        let o = observed
            .iter()
            .enumerate()
            .map(|(i, b)| plan::parse_observed(i, b))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(x) = d.iter().find(|x| x.pool_name != d[0].pool_name) {
            return Err(format!(
                "desired slices name different pools: {:?} and {:?}",
                d[0].pool_name, x.pool_name
            ));
        }
        let p = plan::plan(&d, &o);
        Ok((
            p.generation,
            p.unchanged,
            p.updates
                .into_iter()
                .map(|(j, i)| (j, i, o[j].name.clone(), o[j].resource_version.clone()))
                .collect(),
            p.creates,
            p.deletes
                .into_iter()
                .map(|j| {
                    let x = &o[j];
                    (j, x.name.clone(), x.uid.clone(), x.resource_version.clone())
                })
                .collect(),
        ))
    })
    .map_err(PyValueError::new_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quantity_parse, m)?)?;
    m.add_function(wrap_pyfunction!(quantity_canonical, m)?)?;
    m.add_function(wrap_pyfunction!(quantity_cmp, m)?)?;
    m.add_function(wrap_pyfunction!(slice_spec_equal, m)?)?;
    m.add_function(wrap_pyfunction!(plan_pool, m)?)?;
    Ok(())
}
