//! `nodeagent._native.PMap`: the persistent ordered map behind each snapshot field.
//!
//! A snapshot must stay unchanged for a consumer holding it while the next one is built, and
//! building the next must cost in proportion to what changed: copying a 100,000-entry dict
//! touches every object (reference counts) and took ~20 ms. A persistent B-tree shares all
//! untouched nodes between versions, so an update costs O(changes * log n).

use std::sync::Arc;

use compact_str::CompactString;
use im::OrdMap;
use pyo3::prelude::*;

/// The consumer's key object and the decoded object (or raw bytes).
struct Val {
    key: Py<PyAny>,
    obj: Py<PyAny>,
}

/// (namespace, name, key object, object or None to remove).
type Change = (String, String, Py<PyAny>, Option<Py<PyAny>>);

/// Keys are "namespace\0name": neither part can contain NUL, so byte order of the joined key
/// is exactly (namespace, name) order.
/// Inline up to 24 bytes: B-tree nodes are copied on write, and copying inline keys touches
/// no other memory.
fn join(namespace: &str, name: &str) -> CompactString {
    let mut s = CompactString::with_capacity(namespace.len() + name.len() + 1);
    s.push_str(namespace);
    s.push('\0');
    s.push_str(name);
    s
}

#[pyclass(frozen, module = "nodeagent._native")]
pub struct PMap {
    map: OrdMap<CompactString, Arc<Val>>,
}

#[pymethods]
impl PMap {
    #[new]
    fn new() -> Self {
        PMap { map: OrdMap::new() }
    }

    fn __len__(&self) -> usize {
        self.map.len()
    }

    /// The object stored for namespace/name, or None.
    fn get(&self, py: Python<'_>, namespace: &str, name: &str) -> Option<Py<PyAny>> {
        self.map
            .get(&join(namespace, name))
            .map(|v| v.obj.clone_ref(py))
    }

    fn contains(&self, namespace: &str, name: &str) -> bool {
        self.map.contains_key(&join(namespace, name))
    }

    /// A new map with `changes` applied: (namespace, name, key object, object or None to
    /// remove). This map is unchanged; both share every untouched node.
    fn updated(&self, changes: Vec<Change>) -> PMap {
        let mut map = self.map.clone();
        for (namespace, name, key, obj) in changes {
            let k = join(&namespace, &name);
            match obj {
                Some(obj) => {
                    map.insert(k, Arc::new(Val { key, obj }));
                }
                None => {
                    map.remove(&k);
                }
            }
        }
        PMap { map }
    }

    /// Key objects in (namespace, name) order.
    fn keys(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.map.values().map(|v| v.key.clone_ref(py)).collect()
    }

    /// Objects in (namespace, name) order.
    fn values(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.map.values().map(|v| v.obj.clone_ref(py)).collect()
    }

    /// (key object, object) pairs in (namespace, name) order.
    fn items(&self, py: Python<'_>) -> Vec<(Py<PyAny>, Py<PyAny>)> {
        self.map
            .values()
            .map(|v| (v.key.clone_ref(py), v.obj.clone_ref(py)))
            .collect()
    }
}
