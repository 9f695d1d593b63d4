//! Semantic canonical form of a ResourceSlice spec (`equality.Semantic.DeepEqual` rules).
//!
//! Two specs are semantically equal iff their canonical trees are equal and their taints'
//! `timeAdded` instants are compatible. The tree drops null, empty lists and empty maps (Go's
//! DeepEqual treats nil and empty alike), a false `allNodes` (upstream compares it as a plain
//! bool), and `spec.pool` (compared separately by the planner); it keeps list order; it spells
//! quantities at the Quantity paths (device capacity, counter values) by value, an absent or null
//! value being zero, and at the optional Quantity paths (a capacity's `requestPolicy` default,
//! `validValues` and `validRange` min/max/step; a device's `nodeAllocatableResources` multipliers
//! and overheads) by value, a null one being absent; and it moves taint `timeAdded` out into a side list, because upstream's
//! `DevicesDeepEqual` allows +-1 s there and treats an unset time as equal to any.
//! `canon.rs` writes the tree as canonical bytes straight from the JSON input: an exact hash key.

use std::hash::Hasher;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Canonical {
    /// The canonical bytes (`canon.rs`).
    pub key: Vec<u8>,
    /// Every taint's `timeAdded`, in device then taint order.
    pub times: Vec<Option<String>>,
    /// A hash of `key`, computed once so that matching costs one lookup per slice.
    pub hash: u64,
}

impl Canonical {
    pub fn new(key: Vec<u8>, times: Vec<Option<String>>) -> Self {
        let mut h = rustc_hash::FxHasher::default();
        h.write(&key);
        Canonical {
            hash: h.finish(),
            key,
            times,
        }
    }
}

/// Nanoseconds since the epoch of a taint's `timeAdded` as kube-apiserver decodes it, or None:
/// every time the validator lets through is compared by its instant (a server stores
/// `2024-01-01T00:00:00,5Z` as `2024-01-01T00:00:00Z`; compared as text, it was rewritten for
/// ever).
pub fn parse_time(s: &str) -> Option<i128> {
    crate::inventory::names::parse_rfc3339(s)
}

fn times_compatible(a: &Option<String>, b: &Option<String>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => match (parse_time(x), parse_time(y)) {
            (Some(tx), Some(ty)) => (tx - ty).abs() <= 1_000_000_000,
            _ => x == y,
        },
        _ => true,
    }
}

/// Whether two canonical forms with equal keys are semantically equal.
pub fn times_match(a: &Canonical, b: &Canonical) -> bool {
    a.times.len() == b.times.len()
        && a.times
            .iter()
            .zip(&b.times)
            .all(|(x, y)| times_compatible(x, y))
}

pub fn equal(a: &Canonical, b: &Canonical) -> bool {
    a.hash == b.hash && a.key == b.key && times_match(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Canonical {
        let p = super::super::canon::spec(s.as_bytes()).unwrap();
        Canonical::new(p.key, p.times)
    }

    #[test]
    fn semantic_rules() {
        let a = c(
            r#"{"driver":"d","devices":[{"name":"a","capacity":{"m":{"value":"1Gi"}},"attributes":{}}]}"#,
        );
        let b = c(
            r#"{"driver":"d","devices":[{"name":"a","capacity":{"m":{"value":"1073741824"}}}],"sharedCounters":null}"#,
        );
        assert!(equal(&a, &b));
        let d = c(r#"{"driver":"d","devices":[{"name":"a","capacity":{"m":{"value":"1G"}}}]}"#);
        assert!(!equal(&a, &d));
    }

    #[test]
    fn taint_times() {
        let t = |x: &str| {
            c(&format!(
                r#"{{"devices":[{{"name":"a","taints":[{{"key":"k","effect":"NoSchedule"{x}}}]}}]}}"#
            ))
        };
        let base = t(r#","timeAdded":"2024-01-01T00:00:00Z""#);
        assert!(equal(&base, &t(r#","timeAdded":"2024-01-01T00:00:01Z""#)));
        assert!(equal(
            &base,
            &t(r#","timeAdded":"2024-01-01T01:00:00+01:00""#)
        ));
        assert!(!equal(&base, &t(r#","timeAdded":"2024-01-01T00:00:02Z""#)));
        assert!(equal(&base, &t("")));
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_time("2000-03-01T00:00:00.5Z"),
            Some(951_868_800_500_000_000)
        );
        assert_eq!(parse_time("2023-02-29T00:00:00Z"), None);
        assert!(equal(
            &base,
            &t(r#","timeAdded":"2024-01-01T00:00:00.1234567891Z""#)
        ));
    }
}
