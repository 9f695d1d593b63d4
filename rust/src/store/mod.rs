//! `nodeagent._native.Store`: one query's objects, fed raw watch bytes and List pages.

mod keymap;
mod parse;
pub mod pmap;
mod rv;
pub mod table;
mod uid;

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rustc_hash::FxHashMap;

use table::{make_key, split_key, DeltaKind, Table, Verdict};

use crate::pytypes::{IntEnum, NamedTuple};

static WATCH_FEED: NamedTuple = NamedTuple::new(
    "WatchFeed",
    &["resource_version", "error", "events", "malformed"],
    "What one `Store.feed` took in: the newest resourceVersion (None if none), the first ERROR \
     event (a WatchError, or None), the events applied, the messages of malformed events.",
);
static WATCH_ERROR: NamedTuple = NamedTuple::new(
    "WatchError",
    &["code", "reason", "message"],
    "An ERROR watch event's Status: code, reason, message.",
);
static DELTA: NamedTuple = NamedTuple::new(
    "Delta",
    &["kind", "namespace", "name", "resource_version", "raw"],
    "One coalesced change of `Store.drain`: its kind (a DeltaKind), the object's namespace, \
     name and resourceVersion, and its raw JSON (None for a delete).",
);
static DELTA_KIND: IntEnum = IntEnum::new(
    "DeltaKind",
    &[("ADD", 0), ("UPDATE", 1), ("DELETE", 2)],
    "The kind of a Delta (an int: 0 add, 1 update, 2 delete).",
);

/// The watch store of one query. Thread-safe: heavy calls release the GIL, so Trio may run them
/// in a worker thread while the event loop keeps going.
#[pyclass(frozen, module = "nodeagent._native")]
pub struct Store {
    inner: Mutex<Table>,
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock would be a bug in this crate; the table is still
        // structurally valid (every mutation completes before the next), so keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl Store {
    #[new]
    fn new() -> Self {
        Store {
            inner: Mutex::new(Table::new()),
        }
    }

    /// Ingests raw watch bytes (newline-delimited events, split anywhere). Returns a
    /// WatchFeed (newest resourceVersion or None, the first ERROR event as a WatchError or None,
    /// events applied, [messages of malformed events]).
    fn feed<'py>(&self, py: Python<'py>, chunk: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let out = py.detach(|| self.lock().feed(chunk));
        let error = match out.error {
            Some(s) => Some(WATCH_ERROR.make(py, (s.code, s.reason, s.message))?),
            None => None,
        };
        WATCH_FEED.make(py, (out.resource_version, error, out.events, out.malformed))
    }

    /// The connection ended: a buffered partial line will never be completed.
    fn end_stream(&self) {
        self.lock().end_stream();
    }

    /// A full (re)list starts.
    fn begin_list(&self) {
        self.lock().begin_list();
    }

    /// Ingests one List page. Returns (items stored, [messages of malformed items]); raises
    /// ValueError if the page is not valid JSON (nothing from it is stored, and the relist will
    /// not delete anything).
    fn list_page(&self, py: Python<'_>, page: &[u8]) -> PyResult<(usize, Vec<String>)> {
        py.detach(|| self.lock().list_page(page))
            .map(|o| (o.items, o.malformed))
            .map_err(PyValueError::new_err)
    }

    /// The relist is complete: keys the watch held that the list did not show are deleted.
    /// Returns how many were deleted.
    fn end_list(&self, py: Python<'_>, resource_version: &str) -> usize {
        py.detach(|| self.lock().end_list(resource_version))
    }

    /// Applies the result of a write made through the agent's client until `deadline`
    /// (or until the watch reports the same or a newer resourceVersion).
    /// Returns whether the object the store shows changed. Raises ValueError for malformed
    /// objects.
    fn apply_local(&self, obj: &[u8], deadline: f64) -> PyResult<bool> {
        let (key, obj) = table::local_obj(obj).map_err(PyValueError::new_err)?;
        Ok(self.lock().local_upsert(&key, obj, deadline))
    }

    /// Hides an object deleted through the agent's client until the watch confirms or
    /// `deadline` passes. Returns whether the store held it.
    fn delete_local(&self, namespace: &str, name: &str, deadline: f64) -> bool {
        let mut key = String::new();
        make_key(&mut key, namespace, name);
        self.lock().local_delete(&key, deadline)
    }

    /// Drops local overrides whose deadline is at or before `now`; returns how many.
    fn expire(&self, now: f64) -> usize {
        self.lock().expire(now)
    }

    /// Number of keys changed since the last drain (0 when a drain would give no delta).
    fn pending(&self) -> usize {
        self.lock().pending()
    }

    /// Returns the coalesced deltas since the last drain as a list of Delta
    /// (kind, namespace, name, resourceVersion, raw bytes or None); kind a DeltaKind (an int:
    /// 0=add, 1=update, 2=delete). An object deleted and re-created under the same name (another uid) since the
    /// last drain gives a delete (of the one shown) immediately followed by an add. `accept(namespace, name, raw)` is called only for added or changed objects
    /// and answers True (show), False (exclude) or None (reject: keep showing the last good
    /// version). If `accept` raises, nothing is drained.
    #[pyo3(signature = (accept=None))]
    fn drain<'py>(
        &self,
        py: Python<'py>,
        accept: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let mut table = self.lock();
        let mut verdicts: FxHashMap<String, Verdict> = FxHashMap::default();
        if let Some(accept) = accept {
            for (key, raw) in table.to_judge() {
                let (ns, name) = split_key(key);
                let res = accept.call1((ns, name, PyBytes::new(py, raw)))?;
                let v = if res.is_none() {
                    Verdict::Reject
                } else if res.is_truthy()? {
                    Verdict::Include
                } else {
                    Verdict::Exclude
                };
                verdicts.insert(key.to_owned(), v);
            }
        }
        let deltas = table.drain(|k| verdicts.get(k).copied().unwrap_or(Verdict::Include));
        let mut out = Vec::with_capacity(deltas.len());
        for (kind, key, rv) in deltas {
            let (ns, name) = split_key(&key);
            let raw = match kind {
                DeltaKind::Delete => None,
                _ => table.get(&key).map(|b| PyBytes::new(py, b)),
            };
            let kind = DELTA_KIND.member(py, kind as u8)?;
            out.push(DELTA.make(py, (kind, ns, name, rv, raw))?);
        }
        Ok(out)
    }

    /// The object the store currently holds for namespace/name (after local overrides).
    fn get<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        name: &str,
    ) -> Option<Bound<'py, PyBytes>> {
        let mut key = String::new();
        make_key(&mut key, namespace, name);
        self.lock().get(&key).map(|b| PyBytes::new(py, b))
    }

    /// (namespace, name) of every object visible to the consumer as of the last drain.
    fn shown_keys(&self) -> Vec<(String, String)> {
        let t = self.lock();
        t.shown_keys()
            .into_iter()
            .map(|k| {
                let (ns, n) = split_key(k);
                (ns.to_owned(), n.to_owned())
            })
            .collect()
    }

    /// Approximate bytes held by the store (object bytes, keys, table overhead).
    fn memory_usage(&self) -> usize {
        self.lock().memory_usage()
    }

    fn __len__(&self) -> usize {
        self.lock().len()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for t in [&WATCH_FEED, &WATCH_ERROR, &DELTA] {
        m.add(t.name, t.class(m.py())?)?;
    }
    m.add(DELTA_KIND.name, DELTA_KIND.class(m.py())?)?;
    Ok(())
}
