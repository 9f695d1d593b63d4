//! Plugin inventories converted and validated (`nodeagent._native.inventory_*`): the native and
//! seed plugin messages decoded from their wire bytes into the v1 device model, the seed's
//! per-device and per-attribute drops, the native message's shape rules and the v1 DRA rules of
//! the whole inventory; and a valid inventory's desired slices (`desired_slices`). The Python
//! side decodes the JSON this returns with msgspec; the Python reference these are
//! property-tested against lives in `tests/support/dra_reference/`.

pub mod desired;
pub mod model;
pub mod names;
pub mod rules;
pub mod wire;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::types::PyBytes;

type RejectionTuple = (String, Option<String>, String);
/// (the inventory without devices, per pool its devices in batches), all JSON.
type Split<'py> = (Bound<'py, PyBytes>, Vec<Vec<Bound<'py, PyBytes>>>);

/// Devices per JSON batch: one msgspec decode of 128 devices holds the GIL well under 1 ms.
const BATCH: usize = 128;

fn split<'py>(py: Python<'py>, (head, pools): (String, Vec<Vec<String>>)) -> Split<'py> {
    (
        PyBytes::new(py, head.as_bytes()),
        pools
            .iter()
            .map(|batches| {
                batches
                    .iter()
                    .map(|b| PyBytes::new(py, b.as_bytes()))
                    .collect()
            })
            .collect(),
    )
}

/// ((inventory JSON without devices, per pool its devices as JSON arrays of at most 128),
/// broken v1 rules) of a native `Inventory` message's wire bytes.
/// `max_string`: the byte limit of string and version attributes.
#[pyfunction]
fn inventory_native<'py>(
    py: Python<'py>,
    driver: PyBackedStr,
    message: PyBackedBytes,
    max_string: usize,
) -> PyResult<(Split<'py>, Vec<String>)> {
    let (json, errors) = py
        .detach(|| {
            wire::native(&driver, &message).map(|inv| {
                (
                    model::to_json_split(&inv, BATCH),
                    rules::validate(&inv, max_string),
                )
            })
        })
        .map_err(PyValueError::new_err)?;
    Ok((split(py, json), errors))
}

/// (inventory JSON as `inventory_native` gives it, rejected (device, attribute or None, rule),
/// broken v1 rules) of a seed
/// `NodeListAndWatchResourcesResponse`'s wire bytes, as one pool named `pool`.
#[pyfunction]
fn inventory_seed<'py>(
    py: Python<'py>,
    driver: PyBackedStr,
    pool: PyBackedStr,
    message: PyBackedBytes,
    max_string: usize,
) -> PyResult<(Split<'py>, Vec<RejectionTuple>, Vec<String>)> {
    let (json, rejected, errors) = py
        .detach(|| {
            wire::seed(&message).map(|instances| {
                let (inv, rejected) = rules::from_seed(&driver, &pool, instances, max_string);
                let rejected = rejected
                    .into_iter()
                    .map(|r| (r.device.into(), r.attribute.map(String::from), r.rule))
                    .collect::<Vec<_>>();
                (
                    model::to_json_split(&inv, BATCH),
                    rejected,
                    rules::validate(&inv, max_string),
                )
            })
        })
        .map_err(PyValueError::new_err)?;
    Ok((split(py, json), rejected, errors))
}

/// The broken v1 rules of an inventory given as `msgspec.json.encode(inventory)`.
#[pyfunction]
fn inventory_errors(
    py: Python<'_>,
    inventory: PyBackedBytes,
    max_string: usize,
) -> PyResult<Vec<String>> {
    py.detach(|| model::from_json(&inventory).map(|inv| rules::validate(&inv, max_string)))
        .map_err(PyValueError::new_err)
}

/// Per pool of a validated inventory (given as `msgspec.json.encode(inventory)`), its desired
/// slice specs as JSON, quantities in canonical form; ValueError naming an invalid quantity.
#[pyfunction]
fn desired_slices<'py>(
    py: Python<'py>,
    inventory: PyBackedBytes,
    node_name: PyBackedStr,
) -> PyResult<Vec<Vec<Bound<'py, PyBytes>>>> {
    let pools = py
        .detach(|| model::from_json(&inventory).and_then(|inv| desired::slices(inv, &node_name)))
        .map_err(PyValueError::new_err)?;
    Ok(pools
        .iter()
        .map(|specs| {
            specs
                .iter()
                .map(|s| PyBytes::new(py, s.as_bytes()))
                .collect()
        })
        .collect())
}

/// The first shape rule a native `Inventory` message's wire bytes break, or None.
#[pyfunction]
fn native_message_error(py: Python<'_>, message: PyBackedBytes) -> PyResult<Option<String>> {
    py.detach(|| wire::native("", &message).map(|inv| rules::check_message(&inv).err()))
        .map_err(PyValueError::new_err)
}

/// The v1 device name of a seed instance name, or None when it cannot have one.
#[pyfunction]
fn seed_device_name(name: &str) -> Option<String> {
    rules::seed_device_name(name)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(inventory_native, m)?)?;
    m.add_function(wrap_pyfunction!(inventory_seed, m)?)?;
    m.add_function(wrap_pyfunction!(inventory_errors, m)?)?;
    m.add_function(wrap_pyfunction!(desired_slices, m)?)?;
    m.add_function(wrap_pyfunction!(native_message_error, m)?)?;
    m.add_function(wrap_pyfunction!(seed_device_name, m)?)?;
    Ok(())
}
