//! The v1 DRA rules of an inventory (kube-apiserver v1.37's limits and shapes, plus the agent's
//! own cross-checks), the shape rules of a native message, and the seed conversion's per-device
//! and per-attribute rules: the one implementation. Every message is the Python reference's
//! (tests/support/dra_reference/: `validation.py`, `inventory_shape.py`, `convert.py`) word for
//! word; names are quoted with Python's repr.

use std::collections::{HashMap, HashSet};

use super::model::*;
use super::names::*;
use crate::quantity::{self, ERR_RANGE};

pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
pub const MAX_TAINTS: usize = 16;
pub const MAX_COUNTERS: usize = 32;
pub const MAX_COUNTER_CONSUMPTIONS: usize = 2;
pub const MAX_ATTRIBUTE_STRING: usize = 64;
pub const BINDING_CONDITIONS_MAX: usize = 4;
pub const COMPATIBILITY_GROUPS_MAX: usize = 2;
pub const REQUEST_POLICY_VALID_VALUES_MAX: usize = 10;
const SKIP_NODE_OPERATIONS: [&str; 3] = ["NodePrepareResources", "NodeUnprepareResources", "*"];
const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "NoExecute", "None"];
const NANO: i128 = quantity::NANO;
const INT64_MAX_NANOS: i128 = i64::MAX as i128 * NANO;

fn r(s: &str) -> String {
    repr(s)
}

/// The value in nanos, or the quantity's error.
fn nanos(text: &str) -> Result<i128, String> {
    quantity::parse(text).map(|q| q.nanos)
}

fn q(at: &str, text: &str, errors: &mut Vec<String>) -> Option<i128> {
    match nanos(text) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(format!("{at}: {e}"));
            None
        }
    }
}

// --- the inventory ------------------------------------------------------------------------------

fn counters(at: &str, counters: &Counters, errors: &mut Vec<String>) {
    if counters.is_empty() {
        errors.push(format!("{at}: counters are required (at least one)"));
    }
    if counters.len() > MAX_COUNTERS {
        errors.push(format!(
            "{at}: {} counters, at most {MAX_COUNTERS} allowed",
            counters.len()
        ));
    }
    for (name, value) in counters {
        if !is_dns_label(name) {
            errors.push(format!(
                "{at}: counter name {} must be a DNS label",
                r(name)
            ));
        }
        if let Err(e) = nanos(value) {
            errors.push(format!("{at}: counter {}: {e}", r(name)));
        }
    }
}

const NAME_RULE: &str = "name must be a C identifier (<= 32) or domain/identifier";

/// What is wrong with one device attribute on its own.
pub fn attribute_errors(name: &str, a: &Attribute, max_string: usize) -> Vec<String> {
    let mut errors = Vec::new();
    if !is_device_qualified_name(name) {
        errors.push(NAME_RULE.to_owned());
    }
    if a.values() != 1 {
        errors.push("exactly one of int, bool, string, version must be set".to_owned());
    }
    for t in [&a.string, &a.version].into_iter().flatten() {
        if t.len() > max_string {
            errors.push(format!(
                "{} bytes of UTF-8, at most {max_string} allowed",
                t.len()
            ));
        }
    }
    if let Some(v) = &a.version {
        if !is_semver(v) {
            errors.push(format!("version {} is not semantic versioning 2.0.0", r(v)));
        }
    }
    errors
}

/// What is wrong with one device capacity on its own.
pub fn capacity_errors(name: &str, c: &Capacity) -> Vec<String> {
    let mut errors = Vec::new();
    if !is_device_qualified_name(name) {
        errors.push(NAME_RULE.to_owned());
    }
    if let Err(e) = nanos(&c.value) {
        errors.push(e);
    }
    errors
}

fn device(
    d: &Device,
    sets: &HashMap<&str, HashSet<&str>>,
    max_string: usize,
    errors: &mut Vec<String>,
) {
    let at = format!("device {}", r(&d.name));
    if !is_dns_label(&d.name) {
        errors.push(format!(
            "{at}: name must be a DNS label (lowercase alphanumerics and '-', <= 63)"
        ));
    }
    let n = d.attributes.len() + d.capacity.len();
    if n > MAX_ATTRIBUTES_AND_CAPACITIES {
        errors.push(format!(
            "{at}: {n} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES} allowed"
        ));
    }
    for (name, a) in &d.attributes {
        for e in attribute_errors(name, a, max_string) {
            errors.push(format!("{at}: attribute {}: {e}", r(name)));
        }
    }
    for (name, c) in &d.capacity {
        for e in capacity_errors(name, c) {
            errors.push(format!("{at}: capacity {}: {e}", r(name)));
        }
    }
    if d.taints.len() > MAX_TAINTS {
        errors.push(format!(
            "{at}: {} taints, at most {MAX_TAINTS} allowed",
            d.taints.len()
        ));
    }
    for (i, t) in d.taints.iter().enumerate() {
        let here = format!("{at}: taint {i}");
        if !is_label_key(&t.key) {
            errors.push(format!(
                "{here}: key {} must be a qualified label key",
                r(&t.key)
            ));
        }
        if !is_label_value(&t.value) {
            errors.push(format!(
                "{here}: value {} must be a label value",
                r(&t.value)
            ));
        }
        if !TAINT_EFFECTS.contains(&t.effect.as_str()) {
            errors.push(format!(
                "{here}: effect {} must be one of ('NoSchedule', 'NoExecute', 'None')",
                r(&t.effect)
            ));
        }
        if let Some(added) = &t.time_added {
            if !is_rfc3339(added) {
                errors.push(format!("{here}: timeAdded {} must be RFC 3339", r(added)));
            }
        }
    }
    if d.consumes_counters.len() > MAX_COUNTER_CONSUMPTIONS {
        errors.push(format!(
            "{at}: consumesCounters has {} entries, at most {MAX_COUNTER_CONSUMPTIONS} allowed",
            d.consumes_counters.len()
        ));
    }
    let mut used: HashSet<&str> = HashSet::new();
    for u in &d.consumes_counters {
        let here = format!("{at}: consumesCounters {}", r(&u.counter_set));
        if !used.insert(&u.counter_set) {
            errors.push(format!("{here}: the counter set is named twice"));
        }
        // Not a server rule (it does not look across slices): a device consuming a counter
        // nobody publishes could never be allocated, which is a plugin bug to report.
        match sets.get(u.counter_set.as_str()) {
            None => errors.push(format!("{here}: no such shared counter set in the pool")),
            Some(known) => {
                for (name, _) in &u.counters {
                    if !known.contains(name.as_str()) {
                        errors.push(format!("{here}: counter {} is not in the set", r(name)));
                    }
                }
            }
        }
        counters(&here, &u.counters, errors);
    }
    for e in device_field_errors(d) {
        errors.push(format!("{at}: {e}"));
    }
}

/// Every broken rule of the inventory (empty when it may be published).
/// `max_string`: the byte limit of a string or version attribute (`MAX_ATTRIBUTE_STRING`).
pub fn validate(inv: &Inventory, max_string: usize) -> Vec<String> {
    let mut errors = Vec::new();
    if !is_dns_subdomain(&inv.driver, 63) {
        errors.push(format!(
            "driver {}: must be a DNS subdomain of at most 63 characters",
            r(&inv.driver)
        ));
    }
    let mut pools: HashSet<&str> = HashSet::new();
    for pool in &inv.pools {
        let at = format!("pool {}", r(&pool.name));
        if pool.name.chars().count() > 253
            || !pool.name.split('/').all(|p| is_dns_subdomain(p, 253))
        {
            errors.push(format!(
                "{at}: name must be DNS subdomains joined by '/', <= 253 characters"
            ));
        }
        if !pools.insert(&pool.name) {
            errors.push(format!("{at}: duplicate pool name"));
        }
        let mut sets: HashMap<&str, HashSet<&str>> = HashMap::new();
        for cs in &pool.shared_counters {
            if !is_dns_label(&cs.name) {
                errors.push(format!(
                    "{at}: counter set {}: name must be a DNS label",
                    r(&cs.name)
                ));
            }
            let names = cs.counters.iter().map(|(k, _)| k.as_str()).collect();
            if sets.insert(&cs.name, names).is_some() {
                errors.push(format!("{at}: counter set {}: duplicate name", r(&cs.name)));
            }
            counters(
                &format!("{at}: counter set {}", r(&cs.name)),
                &cs.counters,
                &mut errors,
            );
        }
        for e in pool_field_errors(&inv.driver, pool) {
            errors.push(format!("{at}: {e}"));
        }
        let mut names: HashSet<&str> = HashSet::new();
        for d in &pool.devices {
            if !names.insert(&d.name) {
                errors.push(format!(
                    "device {}: duplicate device name in {at}",
                    r(&d.name)
                ));
            }
            device(d, &sets, max_string, &mut errors);
        }
    }
    errors
}

// --- the fields DRA added after taints and counters (1.34-1.37) ------------------------------

fn fractional(v: i128) -> bool {
    v % NANO != 0
}

/// Whether upstream's int64 milli-value arithmetic holds the value exactly.
fn milli(v: i128) -> bool {
    let unit = NANO / 1000;
    v % unit == 0 && (i64::MIN as i128..=i64::MAX as i128).contains(&(v / unit))
}

/// Whether `step` divides `value - lo` (`step` > 0), without overflowing.
fn multiple(value: i128, lo: i128, step: i128) -> bool {
    (value.rem_euclid(step) - lo.rem_euclid(step)).rem_euclid(step) == 0
}

fn range_errors(at: &str, default: i128, capacity: i128, rg: &Range) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(min) = &rg.min else {
        return vec![format!("{at}.min: required when validRange is set")];
    };
    let lo = q(&format!("{at}.min"), min, &mut errors);
    let hi = rg
        .max
        .as_ref()
        .and_then(|t| q(&format!("{at}.max"), t, &mut errors));
    let step = rg
        .step
        .as_ref()
        .and_then(|t| q(&format!("{at}.step"), t, &mut errors));
    let Some(lo) = lo.filter(|_| errors.is_empty()) else {
        return errors;
    };
    let max = rg.max.as_deref().unwrap_or_default();
    if lo > capacity {
        errors.push(format!(
            "{at}.min: {min} is larger than the capacity's value"
        ));
    }
    if default < lo {
        errors.push(format!("{at}: the default is less than min {min}"));
    }
    if let Some(hi) = hi {
        if lo > hi {
            errors.push(format!("{at}.max: min {min} is larger than max {max}"));
        }
        if hi > capacity {
            errors.push(format!(
                "{at}.max: {max} is larger than the capacity's value"
            ));
        }
        if default > hi {
            errors.push(format!("{at}: the default is more than max {max}"));
        }
    }
    let named = [
        ("default", Some(default)),
        ("min", Some(lo)),
        ("max", hi),
        ("step", step),
    ];
    let is_milli = named.iter().any(|(_, v)| v.is_some_and(fractional));
    if is_milli {
        let bad: Vec<_> = named
            .iter()
            .filter(|(_, v)| v.is_some_and(|v| !milli(v)))
            .collect();
        if !bad.is_empty() {
            for (n, _) in bad {
                errors.push(format!("{at}.{n}: cannot be represented in milli-units"));
            }
            return errors;
        }
    }
    let Some(step) = step else {
        return errors;
    };
    let step_text = rg.step.as_deref().unwrap_or_default();
    if step <= 0 {
        errors.push(format!("{at}.step: {step_text} must be greater than zero"));
        return errors;
    }
    if lo.checked_add(step).is_none_or(|s| s > capacity) {
        errors.push(format!(
            "{at}.step: min + step is larger than the capacity's value"
        ));
    }
    if !is_milli {
        // Upstream's integer arithmetic holds only in [0, MaxInt64].
        let out: Vec<_> = named
            .iter()
            .filter(|(_, v)| v.is_some_and(|v| !(0..=INT64_MAX_NANOS).contains(&v)))
            .collect();
        if !out.is_empty() {
            for (n, _) in out {
                errors.push(format!("{at}.{n}: must be in [0, {}]", i64::MAX));
            }
            return errors;
        }
    }
    for (name, value) in [("default", Some(default)), ("max", hi)] {
        if let Some(v) = value {
            if !multiple(v, lo, step) {
                errors.push(format!(
                    "{at}.step: {name} is not min + a multiple of step {step_text}"
                ));
            }
        }
    }
    errors
}

fn request_policy_errors(at: &str, cap: &Capacity, p: &Policy) -> Vec<String> {
    let mut errors = Vec::new();
    // A bad capacity value is reported by the capacity's own rule.
    let capacity = nanos(&cap.value).ok();
    let default = p
        .default
        .as_ref()
        .and_then(|t| q(&format!("{at}.default"), t, &mut errors));
    let values: Vec<Option<i128>> = p
        .valid_values
        .iter()
        .enumerate()
        .map(|(i, v)| q(&format!("{at}.validValues[{i}]"), v, &mut errors))
        .collect();
    let Some(capacity) = capacity.filter(|_| errors.is_empty()) else {
        return errors;
    };
    if !p.valid_values.is_empty() && p.valid_range.is_some() {
        return vec![format!("{at}: validValues and validRange are exclusive")];
    }
    if !p.valid_values.is_empty() {
        let Some(default) = default else {
            return vec![format!("{at}.default: required when validValues is set")];
        };
        let nums: Vec<i128> = values.into_iter().flatten().collect();
        for i in 1..nums.len() {
            if nums[i - 1] > nums[i] {
                errors.push(format!(
                    "{at}.validValues[{i}]: values must be sorted in ascending order"
                ));
            }
        }
        if nums.len() > REQUEST_POLICY_VALID_VALUES_MAX {
            errors.push(format!(
                "{at}.validValues: {} values, at most {REQUEST_POLICY_VALID_VALUES_MAX} allowed",
                nums.len()
            ));
        }
        let mut seen = HashSet::new();
        for (i, &v) in nums.iter().enumerate() {
            if !seen.insert(v) {
                errors.push(format!("{at}.validValues[{i}]: duplicate value"));
            }
            if v > capacity {
                errors.push(format!(
                    "{at}.validValues[{i}]: larger than the capacity's value"
                ));
            }
        }
        if !seen.contains(&default) {
            errors.push(format!(
                "{at}.default: {} is not one of validValues",
                p.default.as_deref().unwrap_or_default()
            ));
        }
    } else if let Some(rg) = &p.valid_range {
        let Some(default) = default else {
            return vec![format!("{at}.default: required when validRange is set")];
        };
        errors.extend(range_errors(
            &format!("{at}.validRange"),
            default,
            capacity,
            rg,
        ));
    }
    errors
}

fn binding_errors(d: &Device) -> Vec<String> {
    let mut errors = Vec::new();
    for (field, conditions) in [
        ("bindingConditions", &d.binding_conditions),
        ("bindingFailureConditions", &d.binding_failure_conditions),
    ] {
        if conditions.len() > BINDING_CONDITIONS_MAX {
            errors.push(format!(
                "{field}: {} conditions, at most {BINDING_CONDITIONS_MAX} allowed",
                conditions.len()
            ));
        }
        let mut seen = HashSet::new();
        for (i, c) in conditions.iter().enumerate() {
            if !is_label_key(c) {
                errors.push(format!(
                    "{field}[{i}]: {} must be a qualified name (a condition type)",
                    r(c)
                ));
            }
            if !seen.insert(c) {
                errors.push(format!("{field}[{i}]: duplicate {}", r(c)));
            }
        }
    }
    let failures: HashSet<&Str> = d.binding_failure_conditions.iter().collect();
    let mut overlap: Vec<&Str> = d
        .binding_conditions
        .iter()
        .filter(|c| failures.contains(c))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    overlap.sort();
    for c in overlap {
        errors.push(format!(
            "bindingFailureConditions: {} is also a binding condition",
            r(c)
        ));
    }
    if d.binding_conditions.is_empty() != d.binding_failure_conditions.is_empty() {
        errors.push("bindingConditions and bindingFailureConditions must be set together".into());
    }
    errors
}

fn positive(at: &str, text: &Option<Str>, errors: &mut Vec<String>, zero_ok: bool) {
    let Some(text) = text else { return };
    if let Some(v) = q(at, text, errors) {
        if if zero_ok { v < 0 } else { v <= 0 } {
            let what = if zero_ok { "non-negative" } else { "positive" };
            errors.push(format!("{at}: {text} must be {what}"));
        }
    }
}

fn mapping_errors(at: &str, m: &Mapping, d: &Device) -> Vec<String> {
    let mut errors = Vec::new();
    if m.capacity_key.is_some() == m.device_multiplier.is_some() {
        errors.push(format!(
            "{at}: exactly one of capacityKey and deviceMultiplier must be set"
        ));
    }
    if let Some(key) = &m.capacity_key {
        if get(&d.capacity, key).is_none() {
            errors.push(format!(
                "{at}.capacityKey: {} is not a capacity of the device",
                r(key)
            ));
        }
        if m.capacity_multiplier.is_none() {
            errors.push(format!(
                "{at}.capacityMultiplier: required when capacityKey is set"
            ));
        }
    } else if m.capacity_multiplier.is_some() {
        errors.push(format!(
            "{at}.capacityKey: required when capacityMultiplier is set"
        ));
    }
    positive(
        &format!("{at}.capacityMultiplier"),
        &m.capacity_multiplier,
        &mut errors,
        false,
    );
    positive(
        &format!("{at}.deviceMultiplier"),
        &m.device_multiplier,
        &mut errors,
        false,
    );
    errors
}

fn overhead_errors(at: &str, o: &Overhead) -> Vec<String> {
    if o.per_pod.is_none() && o.per_container.is_none() {
        return vec![format!(
            "{at}: at least one of perPod and perContainer must be set"
        )];
    }
    let mut errors = Vec::new();
    positive(&format!("{at}.perPod"), &o.per_pod, &mut errors, true);
    positive(
        &format!("{at}.perContainer"),
        &o.per_container,
        &mut errors,
        true,
    );
    errors
}

/// What is wrong with the device's consumable capacity, binding, node-allocatable and
/// compatibility-group fields.
pub fn device_field_errors(d: &Device) -> Vec<String> {
    let mut errors = Vec::new();
    for (name, cap) in &d.capacity {
        let Some(policy) = &cap.request_policy else {
            continue;
        };
        let at = format!("capacity[{}].requestPolicy", r(name));
        if d.allow_multiple_allocations != Some(true) {
            errors.push(format!("{at}: needs allowMultipleAllocations true"));
        } else {
            errors.extend(request_policy_errors(&at, cap, policy));
        }
    }
    if !d.binding_conditions.is_empty() || !d.binding_failure_conditions.is_empty() {
        errors.extend(binding_errors(d));
    }
    for (key, res) in &d.node_allocatable_resources {
        let at = format!("nodeAllocatableResources[{}]", r(key));
        if !(key == "cpu" || key == "memory" || key.starts_with("hugepages-")) {
            errors.push(format!("{at}: must be cpu, memory or hugepages-<size>"));
        }
        if res.mapping.is_none() && res.overhead.is_none() {
            errors.push(format!(
                "{at}: at least one of mapping and overhead must be set"
            ));
        }
        if let Some(m) = &res.mapping {
            errors.extend(mapping_errors(&format!("{at}.mapping"), m, d));
        }
        if let Some(o) = &res.overhead {
            errors.extend(overhead_errors(&format!("{at}.overhead"), o));
        }
    }
    for u in &d.consumes_counters {
        let groups = &u.compatibility_groups;
        if groups.is_empty() {
            continue;
        }
        let at = format!(
            "consumesCounters[{}].compatibilityGroups",
            r(&u.counter_set)
        );
        if groups.len() > COMPATIBILITY_GROUPS_MAX {
            errors.push(format!(
                "{at}: {} groups, at most {COMPATIBILITY_GROUPS_MAX}",
                groups.len()
            ));
        }
        if groups.iter().collect::<HashSet<_>>().len() != groups.len() {
            errors.push(format!("{at}: duplicate group"));
        }
        for g in groups {
            if !is_dns_label(g) {
                errors.push(format!("{at}: {} must be a DNS label", r(g)));
            }
        }
    }
    errors
}

/// What is wrong with the pool's slice-level fields.
pub fn pool_field_errors(driver: &str, pool: &Pool) -> Vec<String> {
    let ops = &pool.skip_node_operations;
    let mut errors: Vec<String> = ops
        .iter()
        .filter(|op| !SKIP_NODE_OPERATIONS.contains(&op.as_str()))
        .map(|op| {
            format!(
                "skipNodeOperations: {} must be one of {}",
                r(op),
                SKIP_NODE_OPERATIONS.join(", ")
            )
        })
        .collect();
    if ops.iter().collect::<HashSet<_>>().len() != ops.len() {
        errors.push("skipNodeOperations: duplicate operation".into());
    }
    let has = |x: &str| ops.iter().any(|o| o == x);
    if has("NodePrepareResources") && !has("NodeUnprepareResources") && !has("*") {
        errors.push(
            "skipNodeOperations: NodePrepareResources may be skipped only with \
             NodeUnprepareResources"
                .into(),
        );
    }
    let Some(attr) = &pool.partition_type_attribute else {
        return errors;
    };
    if !(attr.contains('/') && !attr.starts_with('/') && is_qualified_name(attr)) {
        errors.push(format!(
            "partitionTypeAttribute: {} must be <domain>/<C identifier> \
             (a fully qualified attribute name)",
            r(attr)
        ));
        return errors;
    }
    let consumers: Vec<&Device> = pool
        .devices
        .iter()
        .filter(|d| !d.consumes_counters.is_empty())
        .collect();
    if consumers.is_empty() {
        errors.push("partitionTypeAttribute: no device of the pool consumes counters".into());
    }
    // An attribute in the driver's own domain may also be declared bare.
    let bare = attr
        .strip_prefix(driver)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or_default();
    for d in consumers {
        let value = get(&d.attributes, attr).or_else(|| {
            if bare.is_empty() {
                None
            } else {
                get(&d.attributes, bare)
            }
        });
        match value {
            None => errors.push(format!(
                "device {}: consumes counters, so needs attribute {}",
                r(&d.name),
                r(attr)
            )),
            Some(v) if v.string.is_none() => errors.push(format!(
                "device {}: attribute {} must be a string value",
                r(&d.name),
                r(attr)
            )),
            Some(_) => {}
        }
    }
    errors
}

// --- the shape of a native message ---------------------------------------------------------

/// The grammar alone: a value out of range is the publisher's to report, for its device.
fn syntax(at: &str, value: &str) -> Result<(), String> {
    match quantity::parse(value) {
        Err(e) if !e.ends_with(ERR_RANGE) => {
            Err(format!("{at}: {}: not a valid quantity", r(value)))
        }
        _ => Ok(()),
    }
}

fn opt_syntax(at: &str, value: &Option<Str>) -> Result<(), String> {
    value.as_ref().map_or(Ok(()), |v| syntax(at, v))
}

fn message_counters(at: &str, counters: &Counters) -> Result<(), String> {
    if counters.len() > MAX_COUNTERS {
        return Err(format!(
            "{at}: {} counters, at most {MAX_COUNTERS}",
            counters.len()
        ));
    }
    for (name, value) in counters {
        if name.is_empty() {
            return Err(format!("{at}: empty counter name"));
        }
        syntax(&format!("{at}[{}].value", r(name)), value)?;
    }
    Ok(())
}

fn message_device(at: &str, d: &Device, seen: &mut HashSet<Str>) -> Result<(), String> {
    if d.name.is_empty() {
        return Err(format!("{at}.name: must not be empty"));
    }
    if !seen.insert(d.name.clone()) {
        return Err(format!(
            "{at}.name: {}: duplicate device name in the pool",
            r(&d.name)
        ));
    }
    let at = format!("{at} ({})", d.name);
    let n = d.attributes.len() + d.capacity.len();
    if n > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(format!(
            "{at}: {n} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES}"
        ));
    }
    for (key, a) in &d.attributes {
        if key.is_empty() {
            return Err(format!("{at}.attributes: empty attribute name"));
        }
        if a.values() == 0 {
            return Err(format!(
                "{at}.attributes[{}]: exactly one value must be set",
                r(key)
            ));
        }
    }
    for (key, c) in &d.capacity {
        if key.is_empty() {
            return Err(format!("{at}.capacity: empty capacity name"));
        }
        syntax(&format!("{at}.capacity[{}].value", r(key)), &c.value)?;
        if let Some(p) = &c.request_policy {
            let at = format!("{at}.capacity[{}].request_policy", r(key));
            opt_syntax(&format!("{at}.default"), &p.default)?;
            if p.valid_values.len() > REQUEST_POLICY_VALID_VALUES_MAX {
                return Err(format!(
                    "{at}.valid_values: {} values, at most {REQUEST_POLICY_VALID_VALUES_MAX}",
                    p.valid_values.len()
                ));
            }
            for (i, v) in p.valid_values.iter().enumerate() {
                syntax(&format!("{at}.valid_values[{i}]"), v)?;
            }
            let rg = p.valid_range.clone().unwrap_or_default();
            opt_syntax(&format!("{at}.valid_range.min"), &rg.min)?;
            opt_syntax(&format!("{at}.valid_range.max"), &rg.max)?;
            opt_syntax(&format!("{at}.valid_range.step"), &rg.step)?;
        }
    }
    for (name, conditions) in [
        ("binding_conditions", &d.binding_conditions),
        ("binding_failure_conditions", &d.binding_failure_conditions),
    ] {
        if conditions.len() > BINDING_CONDITIONS_MAX {
            return Err(format!(
                "{at}.{name}: {} conditions, at most {BINDING_CONDITIONS_MAX}",
                conditions.len()
            ));
        }
    }
    for (key, res) in &d.node_allocatable_resources {
        let here = format!("{at}.node_allocatable_resources[{}]", r(key));
        let m = res.mapping.clone().unwrap_or_default();
        let o = res.overhead.clone().unwrap_or_default();
        opt_syntax(
            &format!("{here}.mapping.capacity_multiplier"),
            &m.capacity_multiplier,
        )?;
        opt_syntax(
            &format!("{here}.mapping.device_multiplier"),
            &m.device_multiplier,
        )?;
        opt_syntax(&format!("{here}.overhead.per_pod"), &o.per_pod)?;
        opt_syntax(&format!("{here}.overhead.per_container"), &o.per_container)?;
    }
    if d.taints.len() > MAX_TAINTS {
        return Err(format!(
            "{at}.taints: {} taints, at most {MAX_TAINTS}",
            d.taints.len()
        ));
    }
    for (k, t) in d.taints.iter().enumerate() {
        if t.key.is_empty() {
            return Err(format!("{at}.taints[{k}].key: must not be empty"));
        }
    }
    for (k, c) in d.consumes_counters.iter().enumerate() {
        let here = format!("{at}.consumes_counters[{k}]");
        if c.counter_set.is_empty() {
            return Err(format!("{here}.counter_set: must not be empty"));
        }
        message_counters(&format!("{here}.counters"), &c.counters)?;
        if c.compatibility_groups.len() > COMPATIBILITY_GROUPS_MAX {
            return Err(format!(
                "{here}.compatibility_groups: {} groups, at most {COMPATIBILITY_GROUPS_MAX}",
                c.compatibility_groups.len()
            ));
        }
    }
    Ok(())
}

/// The first rule a native message breaks as a whole (its field path and value), if any.
pub fn check_message(inv: &Inventory) -> Result<(), String> {
    let mut pool_names = HashSet::new();
    for (i, pool) in inv.pools.iter().enumerate() {
        let at = format!("pools[{i}]");
        if pool.name.is_empty() {
            return Err(format!("{at}.name: must not be empty"));
        }
        if !pool_names.insert(pool.name.as_str()) {
            return Err(format!("{at}.name: {}: duplicate pool name", r(&pool.name)));
        }
        // No limit on a pool's counter sets: the publisher lays them out 8 to a slice (the
        // server's limit is per slice), so a pool of 9 is published as 8 + 1 (issue 29 item 12).
        let mut set_names = HashSet::new();
        for (j, cs) in pool.shared_counters.iter().enumerate() {
            let here = format!("{at}.shared_counters[{j}]");
            if cs.name.is_empty() {
                return Err(format!("{here}.name: must not be empty"));
            }
            if !set_names.insert(cs.name.as_str()) {
                return Err(format!(
                    "{here}.name: {}: duplicate counter set",
                    r(&cs.name)
                ));
            }
            message_counters(&format!("{here}.counters"), &cs.counters)?;
        }
        let mut devices = HashSet::new();
        for (j, d) in pool.devices.iter().enumerate() {
            message_device(&format!("{at}.devices[{j}]"), d, &mut devices)?;
        }
    }
    Ok(())
}

// --- the seed conversion -------------------------------------------------------------------

/// Part of a seed message left out: one attribute, or (attribute None) one whole device.
pub struct Rejection {
    pub device: Str,
    pub attribute: Option<Str>,
    pub rule: String,
}

// Room for "-" and the 8 hex digits of the name's hash in a 63-character DNS label.
const MAPPED_PREFIX: usize = 63 - 9;

/// The v1 device name of a seed instance name, or None when it cannot have one.
pub fn seed_device_name(name: &str) -> Option<String> {
    if is_dns_label(name) {
        return Some(name.to_owned());
    }
    if !is_dns_subdomain(name, 253) {
        return None;
    }
    let digest: String = sha256(name.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // ASCII (a subdomain), so byte slicing is character slicing.
    let dashed = name.replace('.', "-");
    let prefix = dashed[..dashed.len().min(MAPPED_PREFIX)].trim_end_matches('-');
    Some(format!("{prefix}-{digest}"))
}

enum SeedOut {
    Attribute(Attribute),
    Capacity(Capacity),
}

fn seed_value(
    name: &str,
    v: &super::wire::SeedValue,
    max_string: usize,
) -> Result<SeedOut, String> {
    let n = v.count();
    if n != 1 {
        return Err(format!("exactly one value must be set, got {n}"));
    }
    let slice_rule = |kind: &str| {
        format!(
            "{kind} slices have no resource.k8s.io/v1 equivalent; the attribute is not published"
        )
    };
    let value = if let Some(b) = v.bool_ {
        SeedOut::Attribute(Attribute {
            bool_: Some(b),
            ..Default::default()
        })
    } else if let Some(i) = v.int {
        SeedOut::Attribute(Attribute {
            int: Some(i),
            ..Default::default()
        })
    } else if let Some(s) = &v.string {
        SeedOut::Attribute(Attribute {
            string: Some(s.clone()),
            ..Default::default()
        })
    } else if let Some(s) = &v.version {
        SeedOut::Attribute(Attribute {
            version: Some(s.clone()),
            ..Default::default()
        })
    } else if let Some(s) = &v.quantity {
        SeedOut::Capacity(Capacity {
            value: s.clone(),
            request_policy: None,
        })
    } else if v.int_slice {
        return Err(slice_rule("int"));
    } else {
        return Err(slice_rule("string"));
    };
    let errors = match &value {
        SeedOut::Attribute(a) => attribute_errors(name, a, max_string),
        SeedOut::Capacity(c) => capacity_errors(name, c),
    };
    if errors.is_empty() {
        Ok(value)
    } else {
        Err(errors.join("; "))
    }
}

/// The seed message as one pool named `pool_name` (none without instances), and what had to be
/// left out of it. The first instance of a name wins.
pub fn from_seed(
    driver: &str,
    pool_name: &str,
    instances: Vec<super::wire::SeedInstance>,
    max_string: usize,
) -> (Inventory, Vec<Rejection>) {
    let mut rejections = Vec::new();
    let mut devices = Vec::new();
    let mut used: HashSet<String> = HashSet::new();
    for inst in instances {
        let Some(name) = seed_device_name(&inst.name) else {
            rejections.push(Rejection {
                device: inst.name,
                attribute: None,
                rule: "name must be a DNS subdomain (lowercase alphanumerics, '-', '.'; <= 253)"
                    .into(),
            });
            continue;
        };
        if used.contains(&name) {
            rejections.push(Rejection {
                rule: format!(
                    "device name {} is already used by another instance",
                    r(&name)
                ),
                device: inst.name,
                attribute: None,
            });
            continue;
        }
        used.insert(name.clone());
        let mut d = Device {
            name: name.into(),
            ..Default::default()
        };
        for a in inst.attributes {
            if get(&d.attributes, &a.name).is_some() || get(&d.capacity, &a.name).is_some() {
                rejections.push(Rejection {
                    device: inst.name.clone(),
                    attribute: Some(a.name),
                    rule: "duplicate attribute name".into(),
                });
                continue;
            }
            match seed_value(&a.name, &a.value, max_string) {
                Err(rule) => rejections.push(Rejection {
                    device: inst.name.clone(),
                    attribute: Some(a.name),
                    rule,
                }),
                Ok(SeedOut::Capacity(c)) => d.capacity.push((a.name, c)),
                Ok(SeedOut::Attribute(v)) => d.attributes.push((a.name, v)),
            }
        }
        devices.push(d);
    }
    let pools = if devices.is_empty() {
        Vec::new()
    } else {
        vec![Pool {
            name: pool_name.into(),
            devices,
            ..Default::default()
        }]
    };
    (
        Inventory {
            driver: driver.into(),
            pools,
        },
        rejections,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> Device {
        Device {
            name: name.into(),
            ..Device::default()
        }
    }

    fn inventory(devices: Vec<Device>) -> Inventory {
        Inventory {
            driver: "gpu.example.com".into(),
            pools: vec![Pool {
                name: "pool-a".into(),
                devices,
                ..Pool::default()
            }],
        }
    }

    #[test]
    fn a_valid_inventory_breaks_no_rule() {
        let mut d = device("gpu-0");
        d.attributes.push((
            "model".into(),
            Attribute {
                string: Some("A100".into()),
                ..Attribute::default()
            },
        ));
        d.capacity.push((
            "memory".into(),
            Capacity {
                value: "80Gi".into(),
                request_policy: None,
            },
        ));
        assert_eq!(
            validate(&inventory(vec![d]), MAX_ATTRIBUTE_STRING),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_broken_rule_is_named_with_its_device() {
        let mut bad = device("gpu-0");
        bad.attributes.push(("model".into(), Attribute::default()));
        bad.capacity.push((
            "memory".into(),
            Capacity {
                value: "lots".into(),
                request_policy: None,
            },
        ));
        let mut inv = inventory(vec![bad, device("gpu-0")]);
        inv.driver = "Not A Driver".into();
        let errors = validate(&inv, MAX_ATTRIBUTE_STRING);
        assert!(errors[0].starts_with("driver 'Not A Driver': must be a DNS subdomain"));
        let about = |needle: &str| errors.iter().filter(|e| e.contains(needle)).count();
        assert_eq!(
            about("exactly one of int, bool, string, version must be set"),
            1
        );
        assert_eq!(
            about("device 'gpu-0': duplicate device name in pool 'pool-a'"),
            1
        );
        assert_eq!(about("'memory'"), 1, "{errors:?}");
    }

    #[test]
    fn a_string_attribute_is_limited_in_bytes() {
        let attribute = |s: &str| Attribute {
            string: Some(s.into()),
            ..Attribute::default()
        };
        // "é" is two bytes: 32 of them are 64 bytes, one more is over.
        assert!(attribute_errors("a", &attribute(&"é".repeat(32)), 64).is_empty());
        assert_eq!(
            attribute_errors("a", &attribute(&"é".repeat(33)), 64).len(),
            1
        );
    }

    #[test]
    fn a_message_with_a_duplicate_device_is_refused_whole() {
        let err = check_message(&inventory(vec![device("a"), device("a")]));
        assert!(err.expect_err("refused").contains("'a'"));
        assert_eq!(check_message(&inventory(vec![device("a")])), Ok(()));
    }

    #[test]
    fn seed_names_become_dns_labels() {
        assert_eq!(seed_device_name("gpu-0").as_deref(), Some("gpu-0"));
        let mapped = seed_device_name("gpu.0").expect("a subdomain maps");
        assert!(mapped.starts_with("gpu-0-") && mapped.len() == "gpu-0-".len() + 8);
        assert_ne!(seed_device_name("gpu.0"), seed_device_name("gpu.1"));
        let long = seed_device_name("a.".repeat(60).trim_end_matches('.'));
        assert!(long.expect("maps").len() <= 63);
        assert_eq!(seed_device_name("Not_A_Name"), None);
    }
}
