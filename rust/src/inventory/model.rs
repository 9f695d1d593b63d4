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

/// A JSON value with object members in document order (the order of the Python dicts).
enum Value {
    Null,
    Bool(bool),
    Int(Option<i64>),
    Str(String),
    Arr(Vec<Value>),
    Obj(Vec<(String, Value)>),
}

const NULL: Value = Value::Null;

impl Value {
    fn get(&self, k: &str) -> &Value {
        match self {
            Value::Obj(m) => m.iter().find(|(x, _)| x == k).map_or(&NULL, |(_, v)| v),
            _ => &NULL,
        }
    }
    fn str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    fn bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    fn arr(&self) -> &[Value] {
        match self {
            Value::Arr(a) => a,
            _ => &[],
        }
    }
    fn obj(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Obj(m) => Some(m),
            _ => None,
        }
    }
}

fn parse(sc: &mut Scanner<'_>, depth: usize) -> crate::json::Result<Value> {
    if depth > 64 {
        return sc.err("nesting too deep");
    }
    Ok(match sc.peek() {
        Some(b'"') => Value::Str(sc.string()?.into_owned()),
        Some(b'{') => {
            sc.pos += 1;
            let mut m = Vec::new();
            if !sc.eat(b'}') {
                loop {
                    let k = sc.string()?.into_owned();
                    sc.expect(b':')?;
                    m.push((k, parse(sc, depth + 1)?));
                    if !sc.comma_or(b'}')? {
                        break;
                    }
                }
            }
            Value::Obj(m)
        }
        Some(b'[') => {
            sc.pos += 1;
            let mut a = Vec::new();
            if !sc.eat(b']') {
                loop {
                    a.push(parse(sc, depth + 1)?);
                    if !sc.comma_or(b']')? {
                        break;
                    }
                }
            }
            Value::Arr(a)
        }
        Some(b't') => {
            sc.literal(b"true")?;
            Value::Bool(true)
        }
        Some(b'f') => {
            sc.literal(b"false")?;
            Value::Bool(false)
        }
        Some(b'n') => {
            sc.literal(b"null")?;
            Value::Null
        }
        // Only whether an int is set matters to the rules (Python ints may exceed int64).
        Some(_) => Value::Int(sc.number()?.parse().ok()),
        None => return sc.err("unexpected end of input"),
    })
}

fn s(v: &Value, k: &str) -> Str {
    v.get(k).str().unwrap_or_default().into()
}

fn os(v: &Value, k: &str) -> Option<Str> {
    v.get(k).str().map(Str::from)
}

fn strs(v: &Value, k: &str) -> Vec<Str> {
    v.get(k)
        .arr()
        .iter()
        .filter_map(|x| x.str().map(Str::from))
        .collect()
}

fn map<T>(v: &Value, k: &str, f: impl Fn(&Value) -> T) -> Map<T> {
    v.get(k)
        .obj()
        .map(|o| {
            o.iter()
                .map(|(k, x)| (Str::from(k.as_str()), f(x)))
                .collect()
        })
        .unwrap_or_default()
}

fn counters(v: &Value) -> Counters {
    map(v, "counters", |c| s(c, "value"))
}

fn some_obj(v: &Value) -> Option<&Value> {
    v.obj().map(|_| v)
}

fn device_in(d: &Value) -> Device {
    Device {
        name: s(d, "name"),
        attributes: map(d, "attributes", |a| Attribute {
            int: match a.get("int") {
                Value::Int(i) => Some(i.unwrap_or(0)),
                _ => None,
            },
            bool_: a.get("bool").bool(),
            string: os(a, "string"),
            version: os(a, "version"),
        }),
        capacity: map(d, "capacity", |c| Capacity {
            value: s(c, "value"),
            request_policy: some_obj(c.get("requestPolicy")).map(|p| Policy {
                default: os(p, "default"),
                valid_values: strs(p, "validValues"),
                valid_range: some_obj(p.get("validRange")).map(|r| Range {
                    min: os(r, "min"),
                    max: os(r, "max"),
                    step: os(r, "step"),
                }),
            }),
        }),
        consumes_counters: d
            .get("consumesCounters")
            .arr()
            .iter()
            .map(|c| Consumption {
                counter_set: s(c, "counterSet"),
                counters: counters(c),
                compatibility_groups: strs(c, "compatibilityGroups"),
            })
            .collect(),
        taints: d
            .get("taints")
            .arr()
            .iter()
            .map(|t| Taint {
                key: s(t, "key"),
                value: s(t, "value"),
                effect: s(t, "effect"),
                time_added: os(t, "timeAdded"),
            })
            .collect(),
        binds_to_node: d.get("bindsToNode").bool(),
        binding_conditions: strs(d, "bindingConditions"),
        binding_failure_conditions: strs(d, "bindingFailureConditions"),
        allow_multiple_allocations: d.get("allowMultipleAllocations").bool(),
        node_allocatable_resources: map(d, "nodeAllocatableResources", |r| NodeAllocatable {
            mapping: some_obj(r.get("mapping")).map(|m| Mapping {
                capacity_key: os(m, "capacityKey"),
                capacity_multiplier: os(m, "capacityMultiplier"),
                device_multiplier: os(m, "deviceMultiplier"),
            }),
            overhead: some_obj(r.get("overhead")).map(|o| Overhead {
                per_pod: os(o, "perPod"),
                per_container: os(o, "perContainer"),
            }),
        }),
    }
}

/// An inventory from `msgspec.json.encode(inventory)`.
pub fn from_json(data: &[u8]) -> Result<Inventory, String> {
    let mut sc = Scanner::new(data)?;
    let v = parse(&mut sc, 0)?;
    sc.end()?;
    Ok(Inventory {
        driver: s(&v, "driver"),
        pools: v
            .get("pools")
            .arr()
            .iter()
            .map(|p| Pool {
                name: s(p, "name"),
                devices: p.get("devices").arr().iter().map(device_in).collect(),
                shared_counters: p
                    .get("shared_counters")
                    .arr()
                    .iter()
                    .map(|c| CounterSet {
                        name: s(c, "name"),
                        counters: counters(c),
                    })
                    .collect(),
                partition_type_attribute: os(p, "partition_type_attribute"),
                skip_node_operations: strs(p, "skip_node_operations"),
            })
            .collect(),
    })
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
