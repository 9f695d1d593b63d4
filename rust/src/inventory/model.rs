//! The inventory model (the v1 device): what both plugin APIs convert into, as
//! `nodeagent.resources.model` holds it. Maps keep their order (the plugin's), as Python dicts do.

use std::fmt::Write;

use crate::json::Scanner;

/// Inline up to 24 bytes: the names and values of attributes are short, and an inventory holds
/// tens of thousands of them (no allocation each).
pub type Str = compact_str::CompactString;

pub type Map<T> = Vec<(Str, T)>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attribute {
    pub int: Option<i64>,
    pub bool_: Option<bool>,
    pub string: Option<Str>,
    pub version: Option<Str>,
}

impl Attribute {
    pub fn values(&self) -> usize {
        usize::from(self.int.is_some())
            + usize::from(self.bool_.is_some())
            + usize::from(self.string.is_some())
            + usize::from(self.version.is_some())
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Range {
    pub min: Option<Str>,
    pub max: Option<Str>,
    pub step: Option<Str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    pub default: Option<Str>,
    pub valid_values: Vec<Str>,
    pub valid_range: Option<Range>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Capacity {
    pub value: Str,
    pub request_policy: Option<Policy>,
}

/// Counter name -> quantity.
pub type Counters = Map<Str>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CounterSet {
    pub name: Str,
    pub counters: Counters,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Consumption {
    pub counter_set: Str,
    pub counters: Counters,
    pub compatibility_groups: Vec<Str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Taint {
    pub key: Str,
    pub value: Str,
    pub effect: Str,
    pub time_added: Option<Str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mapping {
    pub capacity_key: Option<Str>,
    pub capacity_multiplier: Option<Str>,
    pub device_multiplier: Option<Str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overhead {
    pub per_pod: Option<Str>,
    pub per_container: Option<Str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeAllocatable {
    pub mapping: Option<Mapping>,
    pub overhead: Option<Overhead>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Device {
    pub name: Str,
    pub attributes: Map<Attribute>,
    pub capacity: Map<Capacity>,
    pub consumes_counters: Vec<Consumption>,
    pub taints: Vec<Taint>,
    pub binds_to_node: Option<bool>,
    pub binding_conditions: Vec<Str>,
    pub binding_failure_conditions: Vec<Str>,
    pub allow_multiple_allocations: Option<bool>,
    pub node_allocatable_resources: Map<NodeAllocatable>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pool {
    pub name: Str,
    pub devices: Vec<Device>,
    pub shared_counters: Vec<CounterSet>,
    pub partition_type_attribute: Option<Str>,
    pub skip_node_operations: Vec<Str>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inventory {
    pub driver: Str,
    pub pools: Vec<Pool>,
}

pub fn get<'a, T>(map: &'a Map<T>, key: &str) -> Option<&'a T> {
    map.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

// --- JSON out: the form `msgspec.json.decode(..., type=Inventory)` reads -----------------------

/// Writes JSON objects field by field, leaving out unset and empty fields (msgspec fills in
/// the defaults).
pub(super) struct Obj<'a> {
    out: &'a mut String,
    first: bool,
}

/// A JSON string escaped as msgspec escapes it (the short escapes where JSON has them), so that
/// what is written here and what `msgspec.json.encode` writes are the same bytes.
fn string(out: &mut String, s: &str) {
    out.push('"');
    if !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        out.push_str(s);
        out.push('"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl<'a> Obj<'a> {
    pub(super) fn new(out: &'a mut String) -> Self {
        out.push('{');
        Obj { out, first: true }
    }
    fn key(&mut self, k: &str) -> &mut String {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        string(self.out, k);
        self.out.push(':');
        self.out
    }
    pub(super) fn str(&mut self, k: &str, v: &str) {
        let out = self.key(k);
        string(out, v);
    }
    pub(super) fn opt(&mut self, k: &str, v: &Option<Str>) {
        if let Some(v) = v {
            self.str(k, v);
        }
    }
    pub(super) fn strs(&mut self, k: &str, v: &[Str]) {
        if v.is_empty() {
            return;
        }
        let out = self.key(k);
        out.push('[');
        for (i, s) in v.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(out, s);
        }
        out.push(']');
    }
    pub(super) fn int(&mut self, k: &str, v: i64) {
        let _ = write!(self.key(k), "{v}");
    }
    fn bool(&mut self, k: &str, v: Option<bool>) {
        if let Some(v) = v {
            self.key(k).push_str(if v { "true" } else { "false" });
        }
    }
    pub(super) fn list<T>(&mut self, k: &str, v: &[T], f: fn(&mut String, &T)) {
        if v.is_empty() {
            return;
        }
        let out = self.key(k);
        out.push('[');
        for (i, x) in v.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            f(out, x);
        }
        out.push(']');
    }
    fn map<T>(&mut self, k: &str, v: &Map<T>, f: fn(&mut String, &T)) {
        if v.is_empty() {
            return;
        }
        let out = self.key(k);
        out.push('{');
        for (i, (name, x)) in v.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(out, name);
            out.push(':');
            f(out, x);
        }
        out.push('}');
    }
    pub(super) fn obj(&mut self, k: &str, f: impl FnOnce(&mut String)) {
        let out = self.key(k);
        f(out);
    }
    pub(super) fn end(self) {
        self.out.push('}');
    }
}

fn counter(out: &mut String, v: &Str) {
    let mut o = Obj::new(out);
    o.str("value", v);
    o.end();
}

fn attribute(out: &mut String, a: &Attribute) {
    let mut o = Obj::new(out);
    if let Some(i) = a.int {
        let _ = write!(o.key("int"), "{i}");
    }
    o.bool("bool", a.bool_);
    o.opt("string", &a.string);
    o.opt("version", &a.version);
    o.end();
}

fn capacity(out: &mut String, c: &Capacity) {
    let mut o = Obj::new(out);
    o.str("value", &c.value);
    if let Some(p) = &c.request_policy {
        o.obj("requestPolicy", |out| {
            let mut o = Obj::new(out);
            o.opt("default", &p.default);
            o.strs("validValues", &p.valid_values);
            if let Some(r) = &p.valid_range {
                o.obj("validRange", |out| {
                    let mut o = Obj::new(out);
                    o.opt("min", &r.min);
                    o.opt("max", &r.max);
                    o.opt("step", &r.step);
                    o.end();
                });
            }
            o.end();
        });
    }
    o.end();
}

fn consumption(out: &mut String, c: &Consumption) {
    let mut o = Obj::new(out);
    o.str("counterSet", &c.counter_set);
    o.map("counters", &c.counters, counter);
    o.strs("compatibilityGroups", &c.compatibility_groups);
    o.end();
}

fn taint(out: &mut String, t: &Taint) {
    let mut o = Obj::new(out);
    o.str("key", &t.key);
    o.str("effect", &t.effect);
    if !t.value.is_empty() {
        o.str("value", &t.value);
    }
    o.opt("timeAdded", &t.time_added);
    o.end();
}

fn node_allocatable(out: &mut String, r: &NodeAllocatable) {
    let mut o = Obj::new(out);
    if let Some(m) = &r.mapping {
        o.obj("mapping", |out| {
            let mut o = Obj::new(out);
            o.opt("capacityKey", &m.capacity_key);
            o.opt("capacityMultiplier", &m.capacity_multiplier);
            o.opt("deviceMultiplier", &m.device_multiplier);
            o.end();
        });
    }
    if let Some(v) = &r.overhead {
        o.obj("overhead", |out| {
            let mut o = Obj::new(out);
            o.opt("perPod", &v.per_pod);
            o.opt("perContainer", &v.per_container);
            o.end();
        });
    }
    o.end();
}

pub(super) fn device(out: &mut String, d: &Device) {
    let mut o = Obj::new(out);
    o.str("name", &d.name);
    o.map("attributes", &d.attributes, attribute);
    o.map("capacity", &d.capacity, capacity);
    o.list("consumesCounters", &d.consumes_counters, consumption);
    o.list("taints", &d.taints, taint);
    o.bool("bindsToNode", d.binds_to_node);
    o.strs("bindingConditions", &d.binding_conditions);
    o.strs("bindingFailureConditions", &d.binding_failure_conditions);
    o.bool("allowMultipleAllocations", d.allow_multiple_allocations);
    o.map(
        "nodeAllocatableResources",
        &d.node_allocatable_resources,
        node_allocatable,
    );
    o.end();
}

pub(super) fn counter_set(out: &mut String, c: &CounterSet) {
    let mut o = Obj::new(out);
    o.str("name", &c.name);
    o.map("counters", &c.counters, counter);
    o.end();
}

fn pool(out: &mut String, p: &Pool) {
    let mut o = Obj::new(out);
    o.str("name", &p.name);
    o.list("devices", &p.devices, device);
    o.list("shared_counters", &p.shared_counters, counter_set);
    o.opt("partition_type_attribute", &p.partition_type_attribute);
    o.strs("skip_node_operations", &p.skip_node_operations);
    o.end();
}

/// The inventory as JSON without the pools' devices, and per pool its devices as JSON arrays
/// of at most `batch` devices: decoded one batch at a time, no single decode holds the GIL
/// long (a worker thread decoding hands the event loop the GIL between batches).
pub fn to_json_split(inv: &Inventory, batch: usize) -> (String, Vec<Vec<String>>) {
    let head = Inventory {
        driver: inv.driver.clone(),
        pools: inv
            .pools
            .iter()
            .map(|p| Pool {
                devices: Vec::new(),
                shared_counters: p.shared_counters.clone(),
                partition_type_attribute: p.partition_type_attribute.clone(),
                skip_node_operations: p.skip_node_operations.clone(),
                name: p.name.clone(),
            })
            .collect(),
    };
    let devices = inv
        .pools
        .iter()
        .map(|p| {
            p.devices
                .chunks(batch.max(1))
                .map(|chunk| {
                    let mut out = String::with_capacity(chunk.len() * 512);
                    out.push('[');
                    for (i, d) in chunk.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        device(&mut out, d);
                    }
                    out.push(']');
                    out
                })
                .collect()
        })
        .collect();
    (to_json(&head, 0), devices)
}

/// The inventory as JSON for `msgspec.json.decode(..., type=Inventory)`.
pub fn to_json(inv: &Inventory, size_hint: usize) -> String {
    let mut out = String::with_capacity(256 + size_hint);
    let mut o = Obj::new(&mut out);
    o.str("driver", &inv.driver);
    o.list("pools", &inv.pools, pool);
    o.end();
    out
}

// --- JSON in: an Inventory as `msgspec.json.encode` writes it -----------------------------------
//
// Read in one pass straight into the model (no JSON tree in between: an inventory of 1,024
// devices is ~20k keys, and a tree costs an allocation for each). Unknown members are skipped;
// `null` reads as unset or empty.

type JsonResult<T> = crate::json::Result<T>;

fn text(sc: &mut Scanner<'_>) -> JsonResult<Str> {
    Ok(Str::from(sc.string()?.as_ref()))
}

fn null(sc: &mut Scanner<'_>) -> JsonResult<bool> {
    if sc.peek() == Some(b'n') {
        sc.literal(b"null")?;
        return Ok(true);
    }
    Ok(false)
}

fn opt_text(sc: &mut Scanner<'_>) -> JsonResult<Option<Str>> {
    Ok(if null(sc)? { None } else { Some(text(sc)?) })
}

fn opt_bool(sc: &mut Scanner<'_>) -> JsonResult<Option<bool>> {
    match sc.peek() {
        Some(b't') => sc.literal(b"true").map(|()| Some(true)),
        Some(b'f') => sc.literal(b"false").map(|()| Some(false)),
        _ if null(sc)? => Ok(None),
        _ => sc.err("expected a boolean"),
    }
}

fn list<T>(
    sc: &mut Scanner<'_>,
    mut item: impl FnMut(&mut Scanner<'_>) -> JsonResult<T>,
) -> JsonResult<Vec<T>> {
    let mut out = Vec::new();
    if !null(sc)? {
        sc.array(|sc| {
            out.push(item(sc)?);
            Ok(())
        })?;
    }
    Ok(out)
}

fn texts(sc: &mut Scanner<'_>) -> JsonResult<Vec<Str>> {
    list(sc, text)
}

/// A JSON object as a map, in document order; its keys may be escaped.
fn map_in<T>(
    sc: &mut Scanner<'_>,
    mut value: impl FnMut(&mut Scanner<'_>) -> JsonResult<T>,
) -> JsonResult<Map<T>> {
    let mut out = Vec::new();
    if null(sc)? {
        return Ok(out);
    }
    sc.expect(b'{')?;
    if sc.eat(b'}') {
        return Ok(out);
    }
    loop {
        let key = text(sc)?;
        sc.expect(b':')?;
        out.push((key, value(sc)?));
        if !sc.comma_or(b'}')? {
            return Ok(out);
        }
    }
}

/// An object read field by field into `T::default()`; None when `null`.
fn struct_in<T: Default>(
    sc: &mut Scanner<'_>,
    mut field: impl FnMut(&mut T, &mut Scanner<'_>, &[u8]) -> JsonResult<()>,
) -> JsonResult<Option<T>> {
    if null(sc)? {
        return Ok(None);
    }
    let mut out = T::default();
    sc.object(|sc, key| field(&mut out, sc, key))?;
    Ok(Some(out))
}

fn required<T: Default>(
    sc: &mut Scanner<'_>,
    field: impl FnMut(&mut T, &mut Scanner<'_>, &[u8]) -> JsonResult<()>,
) -> JsonResult<T> {
    struct_in(sc, field).map(Option::unwrap_or_default)
}

fn counters_in(sc: &mut Scanner<'_>) -> JsonResult<Counters> {
    map_in(sc, |sc| {
        required(sc, |v: &mut Str, sc, k| match k {
            b"value" => text(sc).map(|x| *v = x),
            _ => sc.skip_value(),
        })
    })
}

fn attribute_in(a: &mut Attribute, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"int" => {
            if !null(sc)? {
                // Only whether an int is set matters to the rules (Python ints may exceed
                // int64); plugins send int64s.
                sc.peek();
                a.int = Some(sc.number()?.parse().unwrap_or(0));
            }
        }
        b"bool" => a.bool_ = opt_bool(sc)?,
        b"string" => a.string = opt_text(sc)?,
        b"version" => a.version = opt_text(sc)?,
        _ => sc.skip_value()?,
    }
    Ok(())
}

fn range_in(r: &mut Range, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"min" => r.min = opt_text(sc)?,
        b"max" => r.max = opt_text(sc)?,
        b"step" => r.step = opt_text(sc)?,
        _ => sc.skip_value()?,
    }
    Ok(())
}

fn policy_in(p: &mut Policy, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"default" => p.default = opt_text(sc)?,
        b"validValues" => p.valid_values = texts(sc)?,
        b"validRange" => p.valid_range = struct_in(sc, range_in)?,
        _ => sc.skip_value()?,
    }
    Ok(())
}

fn capacity_in(c: &mut Capacity, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"value" => c.value = text(sc)?,
        b"requestPolicy" => c.request_policy = struct_in(sc, policy_in)?,
        _ => sc.skip_value()?,
    }
    Ok(())
}

fn consumption_in(c: &mut Consumption, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"counterSet" => c.counter_set = text(sc)?,
        b"counters" => c.counters = counters_in(sc)?,
        b"compatibilityGroups" => c.compatibility_groups = texts(sc)?,
        _ => sc.skip_value()?,
    }
    Ok(())
}

fn taint_in(t: &mut Taint, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"key" => t.key = text(sc)?,
        b"value" => t.value = text(sc)?,
        b"effect" => t.effect = text(sc)?,
        b"timeAdded" => t.time_added = opt_text(sc)?,
        _ => sc.skip_value()?,
    }
    Ok(())
}

fn node_allocatable_in(r: &mut NodeAllocatable, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"mapping" => {
            r.mapping = struct_in(sc, |m: &mut Mapping, sc, k| {
                match k {
                    b"capacityKey" => m.capacity_key = opt_text(sc)?,
                    b"capacityMultiplier" => m.capacity_multiplier = opt_text(sc)?,
                    b"deviceMultiplier" => m.device_multiplier = opt_text(sc)?,
                    _ => sc.skip_value()?,
                }
                Ok(())
            })?
        }
        b"overhead" => {
            r.overhead = struct_in(sc, |o: &mut Overhead, sc, k| {
                match k {
                    b"perPod" => o.per_pod = opt_text(sc)?,
                    b"perContainer" => o.per_container = opt_text(sc)?,
                    _ => sc.skip_value()?,
                }
                Ok(())
            })?
        }
        _ => sc.skip_value()?,
    }
    Ok(())
}

fn device_in(d: &mut Device, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"name" => d.name = text(sc)?,
        b"attributes" => d.attributes = map_in(sc, |sc| required(sc, attribute_in))?,
        b"capacity" => d.capacity = map_in(sc, |sc| required(sc, capacity_in))?,
        b"consumesCounters" => d.consumes_counters = list(sc, |sc| required(sc, consumption_in))?,
        b"taints" => d.taints = list(sc, |sc| required(sc, taint_in))?,
        b"bindsToNode" => d.binds_to_node = opt_bool(sc)?,
        b"bindingConditions" => d.binding_conditions = texts(sc)?,
        b"bindingFailureConditions" => d.binding_failure_conditions = texts(sc)?,
        b"allowMultipleAllocations" => d.allow_multiple_allocations = opt_bool(sc)?,
        b"nodeAllocatableResources" => {
            d.node_allocatable_resources = map_in(sc, |sc| required(sc, node_allocatable_in))?
        }
        _ => sc.skip_value()?,
    }
    Ok(())
}

/// `Pool` is a plain msgspec struct: its fields keep their Python names.
fn pool_in(p: &mut Pool, sc: &mut Scanner<'_>, k: &[u8]) -> JsonResult<()> {
    match k {
        b"name" => p.name = text(sc)?,
        b"devices" => p.devices = list(sc, |sc| required(sc, device_in))?,
        b"shared_counters" => {
            p.shared_counters = list(sc, |sc| {
                required(sc, |c: &mut CounterSet, sc, k| match k {
                    b"name" => text(sc).map(|x| c.name = x),
                    b"counters" => counters_in(sc).map(|x| c.counters = x),
                    _ => sc.skip_value(),
                })
            })?
        }
        b"partition_type_attribute" => p.partition_type_attribute = opt_text(sc)?,
        b"skip_node_operations" => p.skip_node_operations = texts(sc)?,
        _ => sc.skip_value()?,
    }
    Ok(())
}

/// An inventory from `msgspec.json.encode(inventory)`.
pub fn from_json(data: &[u8]) -> Result<Inventory, String> {
    let mut sc = Scanner::new(data)?;
    let inv = required(&mut sc, |inv: &mut Inventory, sc, k| match k {
        b"driver" => text(sc).map(|x| inv.driver = x),
        b"pools" => list(sc, |sc| required(sc, pool_in)).map(|x| inv.pools = x),
        _ => sc.skip_value(),
    })?;
    sc.end()?;
    Ok(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory() -> Inventory {
        let device = Device {
            name: "gpu-0".into(),
            attributes: vec![
                (
                    "model".into(),
                    Attribute {
                        string: Some("A100 \"80\"\n\\".into()),
                        ..Attribute::default()
                    },
                ),
                (
                    "index".into(),
                    Attribute {
                        int: Some(-7),
                        ..Attribute::default()
                    },
                ),
            ],
            capacity: vec![(
                "bw".into(),
                Capacity {
                    value: "10".into(),
                    request_policy: Some(Policy {
                        valid_range: Some(Range {
                            min: Some("1".into()),
                            ..Range::default()
                        }),
                        ..Policy::default()
                    }),
                },
            )],
            taints: vec![Taint {
                key: "k".into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }],
            binds_to_node: Some(true),
            ..Device::default()
        };
        Inventory {
            driver: "gpu.example.com".into(),
            pools: vec![Pool {
                name: "p".into(),
                devices: vec![device; 3],
                shared_counters: vec![CounterSet {
                    name: "s".into(),
                    counters: vec![("c".into(), "1".into())],
                }],
                partition_type_attribute: Some("kind".into()),
                skip_node_operations: vec!["*".into()],
            }],
        }
    }

    #[test]
    fn json_out_and_in_is_the_same_inventory() {
        let inv = inventory();
        assert_eq!(from_json(to_json(&inv, 0).as_bytes()), Ok(inv));
    }

    #[test]
    fn unset_and_empty_fields_are_left_out_and_strings_escaped_as_msgspec_does() {
        let mut out = String::new();
        device(&mut out, &inventory().pools[0].devices[0]);
        assert_eq!(
            out,
            concat!(
                r#"{"name":"gpu-0","attributes":{"model":{"string":"A100 \"80\"\n\\"},"#,
                r#""index":{"int":-7}},"capacity":{"bw":{"value":"10","requestPolicy":"#,
                r#"{"validRange":{"min":"1"}}}},"taints":[{"key":"k","effect":"NoSchedule"}],"#,
                r#""bindsToNode":true}"#
            )
        );
        let mut out = String::new();
        string(&mut out, "\u{1}\u{8}\u{c}\r\t\u{7f}é");
        assert_eq!(out, "\"\\u0001\\b\\f\\r\\t\u{7f}é\"");
    }

    #[test]
    fn devices_come_in_batches_without_the_head() {
        let inv = inventory();
        let (head, pools) = to_json_split(&inv, 2);
        let head = from_json(head.as_bytes()).expect("parses");
        assert!(head.pools[0].devices.is_empty());
        assert_eq!(head.pools[0].shared_counters, inv.pools[0].shared_counters);
        let sizes: Vec<_> = pools[0]
            .iter()
            .map(|b| b.matches(r#"{"name":"gpu-0""#).count())
            .collect();
        assert_eq!(sizes, [2, 1]);
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(from_json(b"{\"driver\":").is_err());
        assert!(from_json(b"{} x").is_err());
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(from_json(deep.as_bytes()).is_err());
    }
}
