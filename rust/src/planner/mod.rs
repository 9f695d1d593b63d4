//! The ResourceSlice planner: semantic equality of slice specs and the per-pool plan
//! (`nodeagent._native.plan_pool`).

pub mod canon;
pub mod plan;
pub mod semantic;

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use crate::pytypes::{slice_error, slice_error_of, NamedTuple};

type UpdateTuple = (usize, usize, String, String);
type DeleteTuple = (usize, String, String, String);
type PlanTuple = (
    i64,
    Vec<usize>,
    Vec<UpdateTuple>,
    Vec<usize>,
    Vec<DeleteTuple>,
);

static PLAN_UPDATE: NamedTuple = NamedTuple::new(
    "PlanUpdate",
    &["observed", "desired", "name", "resource_version"],
    "An observed slice (by index) to rewrite with a desired spec (by index); the update carries \
     the observed name and resourceVersion.",
);
static PLAN_DELETE: NamedTuple = NamedTuple::new(
    "PlanDelete",
    &["observed", "name", "uid", "resource_version"],
    "An observed slice (by index) to delete, with UID and resourceVersion preconditions.",
);
static POOL_PLAN: NamedTuple = NamedTuple::new(
    "PoolPlan",
    &["generation", "unchanged", "updates", "creates", "deletes"],
    "The plan for one pool: its generation, the observed indices left as they are, the updates, \
     the desired indices to create and the deletes.",
);

/// The plan as Python sees it: a `PoolPlan` of `PlanUpdate`s and `PlanDelete`s.
fn plan_result(py: Python<'_>, plan: PlanTuple) -> PyResult<Bound<'_, PyAny>> {
    let (generation, unchanged, updates, creates, deletes) = plan;
    let updates = updates
        .into_iter()
        .map(|u| PLAN_UPDATE.make(py, u))
        .collect::<PyResult<Vec<_>>>()?;
    let deletes = deletes
        .into_iter()
        .map(|d| PLAN_DELETE.make(py, d))
        .collect::<PyResult<Vec<_>>>()?;
    POOL_PLAN.make(py, (generation, unchanged, updates, creates, deletes))
}

/// Whether two ResourceSlice specs (JSON) are semantically equal, ignoring `pool`.
#[pyfunction]
fn slice_spec_equal(py: Python<'_>, a: PyBackedBytes, b: PyBackedBytes) -> PyResult<bool> {
    py.detach(|| {
        let parse = |x: &[u8]| canon::spec(x).map(|p| semantic::Canonical::new(p.key, p.times));
        Ok(semantic::equal(&parse(&a)?, &parse(&b)?))
    })
    .map_err(PyValueError::new_err::<String>)
}

/// A desired slice spec, decoded and canonicalized once (`prepare_desired`).
#[pyclass(frozen, module = "nodeagent._native")]
pub struct PreparedDesired {
    inner: Arc<plan::Desired>,
}

/// An observed ResourceSlice, decoded and canonicalized once (`prepare_observed`); cache it by
/// uid and resourceVersion.
#[pyclass(frozen, module = "nodeagent._native")]
pub struct PreparedObserved {
    inner: Arc<plan::Observed>,
}

#[pymethods]
impl PreparedObserved {
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    #[getter]
    fn uid(&self) -> &str {
        &self.inner.uid
    }
    #[getter]
    fn resource_version(&self) -> &str {
        &self.inner.resource_version
    }
}

#[pymethods]
impl PreparedDesired {
    #[getter]
    fn pool_name(&self) -> &str {
        &self.inner.pool_name
    }
}

/// Decodes and canonicalizes each slice; on failure, every bad one (index, message).
fn prepare_each<T>(
    py: Python<'_>,
    items: &[PyBackedBytes],
    parse: impl Fn(usize, &[u8]) -> Result<T, String> + Send + Sync,
) -> PyResult<Vec<Arc<T>>>
where
    T: Send + Sync,
{
    py.detach(|| {
        let mut good = Vec::with_capacity(items.len());
        let mut bad = Vec::new();
        for (i, b) in items.iter().enumerate() {
            match parse(i, b) {
                Ok(v) => good.push(Arc::new(v)),
                Err(e) => bad.push((i, e)),
            }
        }
        if bad.is_empty() {
            Ok(good)
        } else {
            Err(bad)
        }
    })
    .map_err(|bad| slice_error_of(py, bad))
}

/// Decodes and canonicalizes desired slice specs; SliceError (a ValueError) naming every
/// invalid one.
#[pyfunction]
fn prepare_desired(py: Python<'_>, specs: Vec<PyBackedBytes>) -> PyResult<Vec<PreparedDesired>> {
    let out = prepare_each(py, &specs, plan::parse_desired)?;
    Ok(out
        .into_iter()
        .map(|inner| PreparedDesired { inner })
        .collect())
}

/// Decodes and canonicalizes observed slices; SliceError (a ValueError) naming every invalid
/// one, so that the caller can set those aside and prepare the rest in one more call.
#[pyfunction]
fn prepare_observed(
    py: Python<'_>,
    objects: Vec<PyBackedBytes>,
) -> PyResult<Vec<PreparedObserved>> {
    let out = prepare_each(py, &objects, plan::parse_observed)?;
    Ok(out
        .into_iter()
        .map(|inner| PreparedObserved { inner })
        .collect())
}

fn check_pools(d: &[impl std::borrow::Borrow<plan::Desired>]) -> Result<(), String> {
    let mut names = d.iter().map(|x| x.borrow().pool_name.as_str());
    if let Some(first) = names.next() {
        if let Some(other) = names.find(|n| *n != first) {
            return Err(format!(
                "desired slices name different pools: {first:?} and {other:?}"
            ));
        }
    }
    Ok(())
}

fn plan_tuple(p: plan::Plan, o: &[impl std::borrow::Borrow<plan::Observed>]) -> PlanTuple {
    let meta = |j: usize| {
        let x: &plan::Observed = o[j].borrow();
        (x.name.clone(), x.uid.clone(), x.resource_version.clone())
    };
    (
        p.generation,
        p.unchanged,
        p.updates
            .into_iter()
            .map(|(j, i)| {
                let (name, _, rv) = meta(j);
                (j, i, name, rv)
            })
            .collect(),
        p.creates,
        p.deletes
            .into_iter()
            .map(|j| {
                let (name, uid, rv) = meta(j);
                (j, name, uid, rv)
            })
            .collect(),
    )
}

/// Plans one pool from prepared slices; see `_native.pyi`.
#[pyfunction]
fn plan_prepared<'py>(
    py: Python<'py>,
    desired: Vec<Bound<'py, PreparedDesired>>,
    observed: Vec<Bound<'py, PreparedObserved>>,
) -> PyResult<Bound<'py, PyAny>> {
    let d: Vec<Arc<plan::Desired>> = desired.iter().map(|x| x.get().inner.clone()).collect();
    let o: Vec<Arc<plan::Observed>> = observed.iter().map(|x| x.get().inner.clone()).collect();
    let plan = py
        .detach(|| {
            check_pools(&d)?;
            Ok(plan_tuple(plan::plan(&d, &o), &o))
        })
        .map_err(PyValueError::new_err::<String>)?;
    plan_result(py, plan)
}

/// Plans one pool; see `_native.pyi`.
#[pyfunction]
fn plan_pool(
    py: Python<'_>,
    desired: Vec<PyBackedBytes>,
    observed: Vec<PyBackedBytes>,
) -> PyResult<Bound<'_, PyAny>> {
    let plan = py.detach(|| -> Result<PlanTuple, String> {
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
        check_pools(&d)?;
        Ok(plan_tuple(plan::plan(&d, &o), &o))
    });
    plan_result(py, plan.map_err(PyValueError::new_err)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(slice_spec_equal, m)?)?;
    m.add_function(wrap_pyfunction!(plan_pool, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_desired, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_observed, m)?)?;
    m.add_function(wrap_pyfunction!(plan_prepared, m)?)?;
    m.add_class::<PreparedDesired>()?;
    m.add_class::<PreparedObserved>()?;
    for t in [&POOL_PLAN, &PLAN_UPDATE, &PLAN_DELETE] {
        m.add(t.name, t.class(m.py())?)?;
    }
    m.add("SliceError", slice_error(m.py())?)?;
    Ok(())
}
