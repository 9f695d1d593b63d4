//! Semantic canonical form of a ResourceSlice spec (`equality.Semantic.DeepEqual` rules).
//!
//! Two specs are semantically equal iff their canonical trees are equal and their taints'
//! `timeAdded` instants are compatible. The tree drops null, empty lists and empty maps (Go's
//! DeepEqual treats nil and empty alike), a false `allNodes` (upstream compares it as a plain
//! bool), and `spec.pool` (compared separately by the planner); it keeps list order; it spells
//! quantities at the Quantity paths (device capacity, counter values) by value, an absent or null
//! value being zero; and it moves taint `timeAdded` out into a side list, because upstream's
//! `DevicesDeepEqual` allows +-1 s there and treats an unset time as equal to any.
//! Serialized with sorted keys, the tree is a canonical string usable as an exact hash key.

use serde_json::{Map, Value};

use super::quantity;

#[derive(Debug, PartialEq, Eq)]
pub struct Canonical {
    /// The canonical tree serialized with sorted keys.
    pub key: String,
    /// Every taint's `timeAdded`, in device then taint order.
    pub times: Vec<Option<String>>,
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn generic(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(_, x)| !is_empty(x))
                .map(|(k, x)| (k.clone(), generic(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(generic).collect()),
        x => x.clone(),
    }
}

fn quantity_key(v: Option<&Value>) -> Value {
    let text = match v {
        None | Some(Value::Null) => return Value::String("0".to_owned()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => return generic(other),
    };
    match quantity::parse(&text) {
        Ok(q) => Value::String(quantity::value_key(&q)),
        // A value the API server would never return: compare it textually, never equal to a
        // valid quantity.
        Err(_) => Value::String(format!("!{text}")),
    }
}

/// `{name: {value: Quantity, ...}}` as in device capacity and counter sets.
fn quantity_map(v: &Value) -> Value {
    let Value::Object(entries) = v else {
        return generic(v);
    };
    let mut out = Map::new();
    for (name, entry) in entries {
        match entry {
            Value::Object(fields) => {
                let mut e: Map<String, Value> = fields
                    .iter()
                    .filter(|(k, x)| k.as_str() != "value" && !is_empty(x))
                    .map(|(k, x)| (k.clone(), generic(x)))
                    .collect();
                e.insert("value".to_owned(), quantity_key(fields.get("value")));
                out.insert(name.clone(), Value::Object(e));
            }
            Value::Null => {
                let mut e = Map::new();
                e.insert("value".to_owned(), Value::String("0".to_owned()));
                out.insert(name.clone(), Value::Object(e));
            }
            other => {
                out.insert(name.clone(), generic(other));
            }
        }
    }
    Value::Object(out)
}

fn counter_sets(v: &Value) -> Value {
    let Value::Array(sets) = v else {
        return generic(v);
    };
    Value::Array(
        sets.iter()
            .map(|set| match set {
                Value::Object(o) => Value::Object(
                    o.iter()
                        .filter(|(_, x)| !is_empty(x))
                        .map(|(k, x)| {
                            let c = if k == "counters" {
                                quantity_map(x)
                            } else {
                                generic(x)
                            };
                            (k.clone(), c)
                        })
                        .collect(),
                ),
                other => generic(other),
            })
            .collect(),
    )
}

fn taints(v: &Value, times: &mut Vec<Option<String>>) -> Value {
    let Value::Array(list) = v else {
        return generic(v);
    };
    Value::Array(
        list.iter()
            .map(|t| match t {
                Value::Object(o) => {
                    times.push(match o.get("timeAdded") {
                        Some(Value::String(s)) => Some(s.clone()),
                        Some(Value::Null) | None => None,
                        Some(other) => Some(other.to_string()),
                    });
                    Value::Object(
                        o.iter()
                            .filter(|(k, x)| k.as_str() != "timeAdded" && !is_empty(x))
                            .map(|(k, x)| (k.clone(), generic(x)))
                            .collect(),
                    )
                }
                other => generic(other),
            })
            .collect(),
    )
}

fn device(v: &Value, times: &mut Vec<Option<String>>) -> Value {
    let Value::Object(o) = v else {
        return generic(v);
    };
    let mut out = Map::new();
    for (k, x) in o {
        if is_empty(x) {
            continue;
        }
        let c = match k.as_str() {
            "capacity" => quantity_map(x),
            "consumesCounters" => counter_sets(x),
            "taints" => taints(x, times),
            _ => generic(x),
        };
        out.insert(k.clone(), c);
    }
    Value::Object(out)
}

/// The canonical form of a spec object (without its pool).
pub fn canonicalize(spec: &Value) -> Canonical {
    let mut times = Vec::new();
    let tree = match spec {
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, x) in o {
                if is_empty(x) || k == "pool" || (k == "allNodes" && *x == Value::Bool(false)) {
                    continue;
                }
                let c = match k.as_str() {
                    "devices" => match x {
                        Value::Array(devs) => {
                            Value::Array(devs.iter().map(|d| device(d, &mut times)).collect())
                        }
                        other => generic(other),
                    },
                    "sharedCounters" => counter_sets(x),
                    _ => generic(x),
                };
                out.insert(k.clone(), c);
            }
            Value::Object(out)
        }
        other => generic(other),
    };
    Canonical {
        key: tree.to_string(),
        times,
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
    a.key == b.key && times_match(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Canonical {
        canonicalize(&serde_json::from_str(s).unwrap())
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
