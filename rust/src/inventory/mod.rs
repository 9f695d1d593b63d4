//! Plugin inventories converted and validated (`nodeagent._native.inventory_*`): the native and
//! seed plugin messages decoded from their wire bytes into the v1 device model, the seed's
//! per-device and per-attribute drops, the native message's shape rules and the v1 DRA rules of
//! the whole inventory; and a valid inventory's desired slices, written at conversion time from
//! the model in hand (`desired_slices` for an inventory given as JSON). The Python
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

/// Per pool, its desired slice specs as JSON.
type Specs<'py> = Vec<Vec<Bound<'py, PyBytes>>>;
/// (the inventory's JSON as `model::to_json_split` writes it, broken rules, desired slices).
type Converted = (
    (String, Vec<Vec<String>>),
    Vec<String>,
    Option<Vec<Vec<String>>>,
);
/// `inventory_seed`'s answer.
type Seed<'py> = (
    Split<'py>,
    Vec<RejectionTuple>,
    Vec<String>,
    Option<Specs<'py>>,
);

/// The inventory's JSON, its broken v1 rules and, when it breaks none and `node_name` is given,
/// its desired slices (`desired::slices`), written from the model already in hand: the
/// publisher's input needs no second encode and parse of the inventory. A quantity the
/// slices cannot canonicalise is one more broken rule.
fn converted(inv: model::Inventory, max_string: usize, node_name: Option<&str>) -> Converted {
    let json = model::to_json_split(&inv, BATCH);
    let mut errors = rules::validate(&inv, max_string);
    let specs = match node_name {
        Some(node) if errors.is_empty() => match desired::slices(inv, node) {
            Ok(specs) => Some(specs),
            Err(e) => {
                errors.push(e);
                None
            }
        },
        _ => None,
    };
    (json, errors, specs)
}

fn specs_bytes<'py>(py: Python<'py>, pools: &[Vec<String>]) -> Specs<'py> {
    pools
        .iter()
        .map(|specs| {
            specs
                .iter()
                .map(|s| PyBytes::new(py, s.as_bytes()))
                .collect()
        })
        .collect()
}

/// ((inventory JSON without devices, per pool its devices as JSON arrays of at most 128),
/// broken v1 rules, desired slices or None) of a native `Inventory` message's wire bytes.
/// `max_string`: the byte limit of string and version attributes; `node_name`: the node of the
/// desired slices (None: none are written; neither are they for an inventory breaking a rule).
#[pyfunction]
#[pyo3(signature = (driver, message, max_string, node_name=None))]
fn inventory_native<'py>(
    py: Python<'py>,
    driver: PyBackedStr,
    message: PyBackedBytes,
    max_string: usize,
    node_name: Option<PyBackedStr>,
) -> PyResult<(Split<'py>, Vec<String>, Option<Specs<'py>>)> {
    let node = node_name.as_deref();
    let (json, errors, specs) = py
        .detach(|| wire::native(&driver, &message).map(|inv| converted(inv, max_string, node)))
        .map_err(PyValueError::new_err)?;
    let specs = specs.map(|s| specs_bytes(py, &s));
    Ok((split(py, json), errors, specs))
}

/// (inventory JSON as `inventory_native` gives it, rejected (device, attribute or None, rule),
/// broken v1 rules, desired slices or None as `inventory_native` gives them) of a seed
/// `NodeListAndWatchResourcesResponse`'s wire bytes, as one pool named `pool`.
#[pyfunction]
#[pyo3(signature = (driver, pool, message, max_string, node_name=None))]
fn inventory_seed<'py>(
    py: Python<'py>,
    driver: PyBackedStr,
    pool: PyBackedStr,
    message: PyBackedBytes,
    max_string: usize,
    node_name: Option<PyBackedStr>,
) -> PyResult<Seed<'py>> {
    let node = node_name.as_deref();
    let (json, rejected, errors, specs) = py
        .detach(|| {
            wire::seed(&message).map(|instances| {
                let (inv, rejected) = rules::from_seed(&driver, &pool, instances, max_string);
                let rejected = rejected
                    .into_iter()
                    .map(|r| (r.device.into(), r.attribute.map(String::from), r.rule))
                    .collect::<Vec<_>>();
                let (json, errors, specs) = converted(inv, max_string, node);
                (json, rejected, errors, specs)
            })
        })
        .map_err(PyValueError::new_err)?;
    let specs = specs.map(|s| specs_bytes(py, &s));
    Ok((split(py, json), rejected, errors, specs))
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
) -> PyResult<Specs<'py>> {
    let pools = py
        .detach(|| model::from_json(&inventory).and_then(|inv| desired::slices(inv, &node_name)))
        .map_err(PyValueError::new_err)?;
    Ok(specs_bytes(py, &pools))
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
