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

/// Seconds and nanoseconds since the epoch of an RFC 3339 timestamp
/// (`YYYY-MM-DDTHH:MM:SS[.f{1,9}](Z|+HH:MM|-HH:MM)`), or None.
pub fn parse_time(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let d = b.get(r)?;
        if d.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(d).ok()?.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut pos = 19;
    let mut frac: i128 = 0;
    if b[pos] == b'.' {
        let start = pos + 1;
        let mut end = start;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        let n = end - start;
        if n == 0 || n > 9 {
            return None;
        }
        frac = i128::from(num(start..end)?) * 10i128.pow(9 - n as u32);
        pos = end;
    }
    let offset: i64 = match b.get(pos)? {
        b'Z' if pos + 1 == b.len() => 0,
        &c @ (b'+' | b'-') if pos + 6 == b.len() && b[pos + 3] == b':' => {
            let (oh, om) = (num(pos + 1..pos + 3)?, num(pos + 4..pos + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if c == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if year < 1 || !(1..=12).contains(&month) || day < 1 || day > month_days[month as usize - 1] {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    Some(i128::from(secs) * 1_000_000_000 + frac)
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
    }
}
