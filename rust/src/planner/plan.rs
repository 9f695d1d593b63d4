//! The plan for one pool: which observed slices stay, are updated, created or deleted, and the
//! pool generation, following the upstream `resourceslice` controller (v0.34+) with O(n) matching.

use std::borrow::Borrow;
use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use super::canon;
use super::semantic::{self, Canonical};

pub struct Observed {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    generation: i64,
    pool_name: Option<String>,
    pool_count: Option<i64>,
    canonical: Canonical,
    device_names: Vec<String>,
}

pub struct Desired {
    pub pool_name: String,
    canonical: Canonical,
    device_names: Vec<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub generation: i64,
    /// Observed indices left alone.
    pub unchanged: Vec<usize>,
    /// (observed index, desired index)
    pub updates: Vec<(usize, usize)>,
    /// Desired indices to create.
    pub creates: Vec<usize>,
    /// Observed indices to delete.
    pub deletes: Vec<usize>,
}

pub fn parse_desired(index: usize, bytes: &[u8]) -> Result<Desired, String> {
    let p = canon::spec(bytes).map_err(|e| format!("desired slice {index}: {e}"))?;
    let mut device_names = p.device_names;
    device_names.sort_unstable();
    Ok(Desired {
        pool_name: p.pool.name.unwrap_or_default(),
        canonical: Canonical::new(p.key, p.times),
        device_names,
    })
}

pub fn parse_observed(index: usize, bytes: &[u8]) -> Result<Observed, String> {
    let p = canon::observed(bytes).map_err(|e| format!("observed slice {index}: {e}"))?;
    if p.name.is_empty() {
        return Err(format!("observed slice {index}: metadata.name is missing"));
    }
    let mut device_names = p.device_names;
    device_names.sort_unstable();
    Ok(Observed {
        name: p.name,
        uid: p.uid,
        resource_version: p.resource_version,
        // A generation that is not an integer cannot be current; treat it as the oldest.
        generation: p.pool.generation.unwrap_or(i64::MIN),
        pool_name: p.pool.name,
        pool_count: p.pool.count,
        canonical: Canonical::new(p.key, p.times),
        device_names,
    })
}

/// Plans one pool. Observed slices are considered in name order, desired ones in list order.
pub fn plan<D: Borrow<Desired>, O: Borrow<Observed>>(desired: &[D], observed: &[O]) -> Plan {
    let desired: Vec<&Desired> = desired.iter().map(Borrow::borrow).collect();
    let observed: Vec<&Observed> = observed.iter().map(Borrow::borrow).collect();
    let mut order: Vec<usize> = (0..observed.len()).collect();
    order.sort_by(|&a, &b| observed[a].name.cmp(&observed[b].name));

    let mut out = Plan::default();
    let max_gen = observed
        .iter()
        .map(|o| o.generation)
        .max()
        .unwrap_or(0)
        .max(0);
    let mut deletes = Vec::new();
    let mut current = Vec::new();
    for &j in &order {
        if observed[j].generation < max_gen {
            deletes.push(j);
        } else {
            current.push(j);
        }
    }
    if desired.is_empty() {
        deletes.extend(current);
        deletes.sort_unstable();
        out.deletes = deletes;
        out.generation = max_gen;
        return out;
    }

    // match_of[i] = observed index matched to desired i.
    let mut match_of: Vec<Option<usize>> = vec![None; desired.len()];
    let mut taken = vec![false; observed.len()];
    if current.len() == 1 && desired.len() == 1 {
        match_of[0] = Some(current[0]);
        taken[current[0]] = true;
    } else {
        // 1. Semantically identical content, by exact canonical key.
        let mut by_key: HashMap<u64, VecDeque<usize>> = HashMap::default();
        for &j in &current {
            by_key
                .entry(observed[j].canonical.hash)
                .or_default()
                .push_back(j);
        }
        for (i, d) in desired.iter().enumerate() {
            if let Some(q) = by_key.get_mut(&d.canonical.hash) {
                if let Some(p) = q
                    .iter()
                    .position(|&j| semantic::equal(&d.canonical, &observed[j].canonical))
                {
                    let j = q.remove(p).unwrap_or_default();
                    match_of[i] = Some(j);
                    taken[j] = true;
                }
            }
        }
        // 2. The same set of device names (upstream's sameSlice).
        let mut by_names: HashMap<&[String], VecDeque<usize>> = HashMap::default();
        for &j in current.iter().filter(|&&j| !taken[j]) {
            by_names
                .entry(observed[j].device_names.as_slice())
                .or_default()
                .push_back(j);
        }
        for (i, d) in desired.iter().enumerate() {
            if match_of[i].is_some() {
                continue;
            }
            if let Some(j) = by_names
                .get_mut(d.device_names.as_slice())
                .and_then(VecDeque::pop_front)
            {
                match_of[i] = Some(j);
                taken[j] = true;
            }
        }
        // 3. Leftovers are rewritten in place rather than deleted and created.
        let spare: Vec<usize> = current.iter().copied().filter(|&j| !taken[j]).collect();
        let mut spare = spare.into_iter();
        for m in match_of.iter_mut().filter(|m| m.is_none()) {
            match spare.next() {
                Some(j) => {
                    *m = Some(j);
                    taken[j] = true;
                }
                None => break,
            }
        }
    }
    deletes.extend(current.iter().copied().filter(|&j| !taken[j]));
    deletes.sort_unstable();

    let count = desired.len() as i64;
    let mut changed = Vec::new();
    let mut same = Vec::new();
    for (i, m) in match_of.iter().enumerate() {
        match m {
            Some(j) => {
                let o = observed[*j];
                let d = desired[i];
                let pool_same = o.pool_name.as_deref() == Some(d.pool_name.as_str())
                    && o.pool_count == Some(count);
                if pool_same && semantic::equal(&d.canonical, &o.canonical) {
                    same.push(*j);
                } else {
                    changed.push((*j, i));
                }
            }
            None => out.creates.push(i),
        }
    }
    if out.creates.is_empty() && changed.len() <= 1 {
        out.generation = max_gen;
    } else {
        // A bump makes every kept slice stale, so all of them are rewritten.
        out.generation = max_gen + 1;
        changed = match_of
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.map(|j| (j, i)))
            .collect();
        same.clear();
    }
    same.sort_unstable();
    out.unchanged = same;
    out.updates = changed;
    out.deletes = deletes;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(devs: &str) -> Desired {
        parse_desired(
            0,
            format!(r#"{{"pool":{{"name":"p"}},"devices":[{devs}]}}"#).as_bytes(),
        )
        .unwrap()
    }

    fn observed(name: &str, gen: i64, count: i64, devs: &str) -> Observed {
        let raw = format!(
            r#"{{"metadata":{{"name":"{name}","uid":"u-{name}","resourceVersion":"1"}},
                "spec":{{"pool":{{"name":"p","generation":{gen},"resourceSliceCount":{count}}},
                "devices":[{devs}]}}}}"#
        );
        parse_observed(0, raw.as_bytes()).unwrap()
    }

    #[test]
    fn unchanged_pool_makes_no_writes() {
        let d = [desired(r#"{"name":"a"}"#), desired(r#"{"name":"b"}"#)];
        let o = [
            observed("y", 2, 2, r#"{"name":"b"}"#),
            observed("x", 2, 2, r#"{"name":"a"}"#),
        ];
        let p = plan(&d, &o);
        assert_eq!(p.generation, 2);
        assert_eq!(p.unchanged, [0, 1]);
        assert!(p.updates.is_empty() && p.creates.is_empty() && p.deletes.is_empty());
    }

    #[test]
    fn new_slice_bumps_and_obsolete_generation_is_deleted() {
        let d = [desired(r#"{"name":"a"}"#), desired(r#"{"name":"b"}"#)];
        let o = [
            observed("old", 1, 1, r#"{"name":"z"}"#),
            observed("x", 2, 1, r#"{"name":"a"}"#),
        ];
        let p = plan(&d, &o);
        assert_eq!(p.generation, 3);
        assert_eq!(p.updates, [(1, 0)]);
        assert_eq!(p.creates, [1]);
        assert_eq!(p.deletes, [0]);
    }
}
