//! Python classes the extension makes through Python itself (with abi3 before 3.12, a Rust
//! class cannot subclass a Python one): named tuples, int enums, and the exception that names
//! the bad slices of a list.

use pyo3::call::PyCallArgs;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

/// A class of this module made by a Python class factory (`namedtuple`, `IntEnum`):
/// `factory(name, spec, module="nodeagent._native")`, its docstring set.
fn class_from<'py>(
    py: Python<'py>,
    (module, factory): (&str, &str),
    args: impl PyCallArgs<'py>,
    doc: &str,
) -> PyResult<Py<PyType>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("module", "nodeagent._native")?;
    let class = py
        .import(module)?
        .getattr(factory)?
        .call(args, Some(&kwargs))?
        .cast_into::<PyType>()?;
    class.setattr("__doc__", doc)?;
    Ok(class.unbind())
}

/// A `collections.namedtuple` class of this module: results are tuples (callers may unpack or
/// compare them as such) whose fields also have names.
pub struct NamedTuple {
    pub name: &'static str,
    fields: &'static [&'static str],
    doc: &'static str,
    class: PyOnceLock<Py<PyType>>,
}

impl NamedTuple {
    pub const fn new(
        name: &'static str,
        fields: &'static [&'static str],
        doc: &'static str,
    ) -> Self {
        NamedTuple {
            name,
            fields,
            doc,
            class: PyOnceLock::new(),
        }
    }

    pub fn class<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyType>> {
        self.class
            .get_or_try_init(py, || {
                class_from(
                    py,
                    ("collections", "namedtuple"),
                    (self.name, self.fields.to_vec()),
                    self.doc,
                )
            })
            .map(|c| c.bind(py))
    }

    /// An instance from the field values, in field order.
    pub fn make<'py>(
        &self,
        py: Python<'py>,
        values: impl PyCallArgs<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.class(py)?.call1(values)
    }
}

/// An `enum.IntEnum` class of this module: its members compare, hash and index as the ints
/// they are, so code written for the plain ints keeps working.
pub struct IntEnum {
    pub name: &'static str,
    members: &'static [(&'static str, u8)],
    doc: &'static str,
    class: PyOnceLock<Py<PyType>>,
    values: PyOnceLock<Vec<Py<PyAny>>>,
}

impl IntEnum {
    pub const fn new(
        name: &'static str,
        members: &'static [(&'static str, u8)],
        doc: &'static str,
    ) -> Self {
        IntEnum {
            name,
            members,
            doc,
            class: PyOnceLock::new(),
            values: PyOnceLock::new(),
        }
    }

    pub fn class<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyType>> {
        self.class
            .get_or_try_init(py, || {
                class_from(
                    py,
                    ("enum", "IntEnum"),
                    (self.name, self.members.to_vec()),
                    self.doc,
                )
            })
            .map(|c| c.bind(py))
    }

    /// The member whose value is `v` (the first member if none is).
    pub fn member<'py>(&self, py: Python<'py>, v: u8) -> PyResult<Bound<'py, PyAny>> {
        let values = self.values.get_or_try_init(py, || {
            let class = self.class(py)?;
            self.members
                .iter()
                .map(|&(_, v)| class.call1((v,)).map(Bound::unbind))
                .collect::<PyResult<Vec<_>>>()
        })?;
        let i = self.members.iter().position(|&(_, x)| x == v).unwrap_or(0);
        Ok(values[i].bind(py).clone())
    }
}

static SLICE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

const SLICE_ERROR_SOURCE: &std::ffi::CStr = c"
class SliceError(ValueError):
    \"\"\"Slices that could not be decoded or canonicalised. `errors` lists (index, message) of
    every bad one of the list given, in order; `index` is the first one's; str() its message.\"\"\"

    __module__ = 'nodeagent._native'

    def __init__(self, message, errors):
        super().__init__(message, errors)

    def __str__(self):
        return self.args[0]

    @property
    def errors(self):
        return self.args[1]

    @property
    def index(self):
        return self.args[1][0][0]
";

/// The class `nodeagent._native.SliceError` (a ValueError).
pub fn slice_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    SLICE_ERROR
        .get_or_try_init(py, || {
            let m = PyModule::from_code(
                py,
                SLICE_ERROR_SOURCE,
                c"nodeagent/_native/slice_error.py",
                c"nodeagent._native_slice_error",
            )?;
            Ok(m.getattr("SliceError")?.cast_into::<PyType>()?.unbind())
        })
        .map(|c| c.bind(py))
}

/// A SliceError for `errors` (index, message; at least one).
pub fn slice_error_of(py: Python<'_>, errors: Vec<(usize, String)>) -> PyErr {
    let message = errors.first().map(|e| e.1.clone()).unwrap_or_default();
    match slice_error(py).and_then(|class| class.call1((message, errors))) {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}
