//! One pass from JSON bytes to the semantic canonical form of a ResourceSlice spec.
//!
//! A general JSON tree costs an allocation per key and per container, and a second tree for
//! the canonical form; slices are large (128 devices, ~30 KB), so this reader validates the JSON
//! and writes the canonical bytes as it goes: objects' members are written in input order, then
//! sorted in place by key. Strings are re-escaped canonically and numbers spelled by value, so
//! equal canonical bytes mean equal content. The rules are listed in `semantic.rs`.

use std::borrow::Cow;

use crate::json::Scanner;
use crate::quantity;

const MAX_DEPTH: usize = 128;
/// Distinct quantity texts remembered per slice.
const QUANTITY_CACHE: usize = 8;

type Result<T> = std::result::Result<T, String>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Generic,
    Spec,
    Devices,
    Device,
    QuantityMap,
    QuantityEntry,
    CounterSets,
    CounterSet,
    Taints,
    Taint,
    /// A capacity's `requestPolicy`: `default` is an optional Quantity.
    RequestPolicy,
    /// `validValues`: a list of Quantities.
    QuantityList,
    /// `validRange`, a node-allocatable `mapping` or `overhead`: optional Quantity members.
    QuantityFields,
    /// A device's `nodeAllocatableResources` map, and one of its entries.
    NodeAllocatableMap,
    NodeAllocatable,
}

/// The members of a `QuantityFields` object that are `*resource.Quantity` upstream.
fn is_quantity_field(key: &str) -> bool {
    matches!(
        key,
        "min"
            | "max"
            | "step"
            | "capacityMultiplier"
            | "deviceMultiplier"
            | "perPod"
            | "perContainer"
    )
}

impl Ctx {
    fn is_array(self) -> bool {
        matches!(
            self,
            Ctx::Devices | Ctx::CounterSets | Ctx::Taints | Ctx::QuantityList
        )
    }
    fn is_object(self) -> bool {
        !self.is_array()
    }
}

/// What the planner needs from an observed slice besides the canonical spec.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// None: not a string.
    pub name: Option<String>,
    /// None: not an integer.
    pub generation: Option<i64>,
    pub count: Option<i64>,
}

impl PoolInfo {
    /// A spec without a pool, or a pool without these fields: what the API server defaults.
    fn unset() -> Self {
        PoolInfo {
            name: Some(String::new()),
            generation: Some(0),
            count: Some(0),
        }
    }
}

/// A value read where only a string or an integer is of interest (pool and metadata fields).
enum Scalar<'a> {
    Str(Cow<'a, str>),
    /// None: a number that is not an i64.
    Num(Option<i64>),
    Null,
    Other,
}

impl Scalar<'_> {
    /// An integer field: null is the zero value, anything but an integer is None.
    fn integer(self) -> Option<i64> {
        match self {
            Scalar::Null => Some(0),
            Scalar::Num(n) => n,
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct Parsed {
    /// Canonical bytes of the spec without its pool (`null` when there is no spec).
    pub key: Vec<u8>,
    pub times: Vec<Option<String>>,
    pub device_names: Vec<String>,
    pub pool: PoolInfo,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

struct Member {
    /// The key's decoded bytes live in `keys[key.0..key.1]`.
    key: (usize, usize),
    /// The key's first 8 bytes, big-endian, zero-padded: orders most keys without a call to
    /// memcmp (equal prefixes fall back to the whole keys).
    prefix: u64,
    /// The member's canonical bytes in `out[start..end]`.
    start: usize,
    end: usize,
}

pub struct Reader<'a> {
    sc: Scanner<'a>,
    out: Vec<u8>,
    keys: Vec<u8>,
    members: Vec<Member>,
    scratch: Vec<u8>,
    /// `finish_object`'s spans of the members it keeps, and their offsets in the rewrite.
    kept: Vec<(usize, usize)>,
    at: Vec<usize>,
    depth: usize,
    times: Vec<Option<String>>,
    device_names: Vec<String>,
    pool: PoolInfo,
    /// The current member's key as it came, quotes included (`members`).
    key_span: (usize, usize),
    /// Quantity texts seen and their value keys, the most recent first: devices of one slice
    /// repeat the same few quantities (a cache of one missed on every device with two).
    quantities: Vec<(String, String)>,
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    if !s.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    out.push(b'"');
    for &c in s.as_bytes() {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => out.extend_from_slice(format!("\\u{c:04x}").as_bytes()),
            _ => out.push(c),
        }
    }
    out.push(b'"');
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Result<Self> {
        Ok(Reader {
            sc: Scanner::new(b)?,
            // Canonical quantities can be longer than their input spelling: room for that, so
            // that a slice's key is not copied to a bigger buffer at the end.
            out: Vec::with_capacity(b.len() + b.len() / 8 + 64),
            keys: Vec::new(),
            members: Vec::new(),
            scratch: Vec::new(),
            kept: Vec::new(),
            at: Vec::new(),
            depth: 0,
            times: Vec::new(),
            device_names: Vec::new(),
            pool: PoolInfo::unset(),
            key_span: (0, 0),
            quantities: Vec::new(),
        })
    }

    /// Integers keep their digits (`-0` is 0); other numbers are spelled by their f64 value.
    fn write_number(&mut self, text: &str) {
        if text.bytes().all(|c| c == b'-' || c.is_ascii_digit()) {
            let t = text.strip_prefix('-').unwrap_or(text);
            if t != "0" && text.starts_with('-') {
                self.out.push(b'-');
            }
            self.out.extend_from_slice(t.as_bytes());
        } else {
            let v: f64 = text.parse().unwrap_or(f64::NAN);
            let v = if v == 0.0 { 0.0 } else { v };
            self.out
                .extend_from_slice(format!("f{:016x}", v.to_bits()).as_bytes());
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.sc.err("nested too deeply");
        }
        Ok(())
    }

    /// Writes the canonical form of the next value; returns whether the value was null or an
    /// empty container (which a parent object drops).
    fn value(&mut self, ctx: Ctx) -> Result<bool> {
        match self.sc.peek() {
            Some(b'{') => self.object(if ctx.is_object() { ctx } else { Ctx::Generic }),
            Some(b'[') => self.array(if ctx.is_array() { ctx } else { Ctx::Generic }),
            Some(b'"') => {
                let at = self.sc.pos;
                match self.sc.string()? {
                    // Without escapes the text needs none either: copy it with its quotes.
                    Cow::Borrowed(_) => {
                        let quoted = self.sc.span(at, self.sc.pos);
                        self.out.extend_from_slice(quoted);
                    }
                    Cow::Owned(s) => write_str(&mut self.out, &s),
                }
                Ok(false)
            }
            Some(b'n') => {
                self.sc.literal(b"null")?;
                self.out.extend_from_slice(b"null");
                Ok(true)
            }
            Some(b't') => {
                self.sc.literal(b"true")?;
                self.out.extend_from_slice(b"true");
                Ok(false)
            }
            Some(b'f') => {
                self.sc.literal(b"false")?;
                self.out.extend_from_slice(b"false");
                Ok(false)
            }
            Some(_) => {
                let n = self.sc.number()?;
                self.write_number(n);
                Ok(false)
            }
            None => self.sc.err("unexpected end"),
        }
    }

    /// Skips a value, writing nothing; returns it when it is a string, a number or null.
    fn scalar(&mut self) -> Result<Scalar<'a>> {
        match self.sc.peek() {
            Some(b'"') => Ok(Scalar::Str(self.sc.string()?)),
            Some(b'n') => {
                self.sc.literal(b"null")?;
                Ok(Scalar::Null)
            }
            Some(b'-' | b'0'..=b'9') => Ok(Scalar::Num(self.sc.number()?.parse().ok())),
            _ => {
                let mark = self.out.len();
                self.value(Ctx::Generic)?;
                self.out.truncate(mark);
                Ok(Scalar::Other)
            }
        }
    }

    /// Walks an object; `f` is called with each decoded key and must consume exactly its value.
    fn members(&mut self, mut f: impl FnMut(&mut Self, Cow<'a, str>) -> Result<()>) -> Result<()> {
        self.sc.expect(b'{')?;
        self.enter()?;
        if !self.sc.eat(b'}') {
            loop {
                self.sc.ws();
                let at = self.sc.pos;
                let key = self.sc.string()?;
                self.key_span = (at, self.sc.pos);
                self.sc.expect(b':')?;
                f(self, key)?;
                if !self.sc.comma_or(b'}')? {
                    break;
                }
            }
        }
        self.depth -= 1;
        Ok(())
    }

    fn pool(&mut self) -> Result<()> {
        let mut info = PoolInfo::unset();
        if self.sc.peek() == Some(b'{') {
            self.members(|r, key| {
                match (&*key, r.scalar()?) {
                    ("name", Scalar::Null) => info.name = Some(String::new()),
                    ("name", Scalar::Str(s)) => info.name = Some(s.into_owned()),
                    ("name", _) => info.name = None,
                    ("generation", v) => info.generation = v.integer(),
                    ("resourceSliceCount", v) => info.count = v.integer(),
                    _ => {}
                }
                Ok(())
            })?;
        } else {
            self.scalar()?;
        }
        self.pool = info;
        Ok(())
    }

    fn quantity(&mut self) -> Result<()> {
        let text = match self.sc.peek() {
            Some(b'"') => self.sc.string()?,
            Some(b'n') => {
                self.sc.literal(b"null")?;
                Cow::Borrowed("0")
            }
            Some(b'-' | b'0'..=b'9') => Cow::Borrowed(self.sc.number()?),
            _ => {
                self.value(Ctx::Generic)?;
                return Ok(());
            }
        };
        let i = match self.quantities.iter().position(|(t, _)| *t == *text) {
            Some(i) => i,
            None => {
                let key = match quantity::parse(&text) {
                    Ok(q) => quantity::value_key(&q),
                    // A value the API server would never return: compared textually, never
                    // equal to a valid quantity.
                    Err(_) => format!("!{text}"),
                };
                if self.quantities.len() == QUANTITY_CACHE {
                    self.quantities.pop();
                }
                self.quantities.insert(0, (text.into_owned(), key));
                0
            }
        };
        write_str(&mut self.out, &self.quantities[i].1);
        Ok(())
    }

    fn time(&mut self) -> Result<Option<String>> {
        let t = match self.sc.peek() {
            Some(b'"') => Some(self.sc.string()?.into_owned()),
            Some(b'n') => {
                self.sc.literal(b"null")?;
                None
            }
            _ => {
                let mark = self.out.len();
                self.value(Ctx::Generic)?;
                let text = String::from_utf8_lossy(&self.out[mark..]).into_owned();
                self.out.truncate(mark);
                Some(format!("\u{0}{text}"))
            }
        };
        Ok(t)
    }

    fn array(&mut self, ctx: Ctx) -> Result<bool> {
        self.sc.expect(b'[')?;
        self.enter()?;
        self.out.push(b'[');
        let elem = match ctx {
            Ctx::Devices => Ctx::Device,
            Ctx::CounterSets => Ctx::CounterSet,
            Ctx::Taints => Ctx::Taint,
            _ => Ctx::Generic,
        };
        let mut n = 0;
        if !self.sc.eat(b']') {
            loop {
                if n > 0 {
                    self.out.push(b',');
                }
                if elem == Ctx::Device && self.sc.peek() != Some(b'{') {
                    self.device_names.push(String::new());
                }
                if ctx == Ctx::QuantityList {
                    // A null element decodes as a zero Quantity.
                    self.quantity()?;
                } else {
                    self.value(elem)?;
                }
                n += 1;
                if !self.sc.comma_or(b']')? {
                    break;
                }
            }
        }
        self.out.push(b']');
        self.depth -= 1;
        Ok(n == 0)
    }

    fn child_ctx(ctx: Ctx, key: &str) -> Ctx {
        match (ctx, key) {
            (Ctx::Spec, "devices") => Ctx::Devices,
            (Ctx::Spec, "sharedCounters") | (Ctx::Device, "consumesCounters") => Ctx::CounterSets,
            (Ctx::Device, "capacity") | (Ctx::CounterSet, "counters") => Ctx::QuantityMap,
            (Ctx::Device, "taints") => Ctx::Taints,
            (Ctx::QuantityMap, _) => Ctx::QuantityEntry,
            (Ctx::QuantityEntry, "requestPolicy") => Ctx::RequestPolicy,
            (Ctx::RequestPolicy, "validValues") => Ctx::QuantityList,
            (Ctx::RequestPolicy, "validRange") => Ctx::QuantityFields,
            (Ctx::Device, "nodeAllocatableResources") => Ctx::NodeAllocatableMap,
            (Ctx::NodeAllocatableMap, _) => Ctx::NodeAllocatable,
            (Ctx::NodeAllocatable, "mapping" | "overhead") => Ctx::QuantityFields,
            _ => Ctx::Generic,
        }
    }

    /// Writes one member's canonical `"key":value`; returns whether to keep it.
    fn member(&mut self, ctx: Ctx, k: &str, plain: bool, time_slot: usize) -> Result<bool> {
        match (ctx, k) {
            (Ctx::Spec, "pool") => {
                self.pool()?;
                return Ok(false);
            }
            (Ctx::Spec, "allNodes") if self.sc.peek() == Some(b'f') => {
                // Upstream compares allNodes as a plain bool: false is the same as unset.
                self.sc.literal(b"false")?;
                return Ok(false);
            }
            (Ctx::Taint, "timeAdded") => {
                self.times[time_slot] = self.time()?;
                return Ok(false);
            }
            (Ctx::RequestPolicy, "default") | (Ctx::QuantityFields, _)
                if self.sc.peek() == Some(b'n')
                    && (ctx == Ctx::RequestPolicy || is_quantity_field(k)) =>
            {
                // A nil *Quantity: the same as absent (upstream writes `"default": null`).
                self.sc.literal(b"null")?;
                return Ok(false);
            }
            (Ctx::Device, "name") => {
                let name = if self.sc.peek() == Some(b'"') {
                    let save = self.sc.pos;
                    let name = self.sc.string()?.into_owned();
                    self.sc.pos = save;
                    name
                } else {
                    String::new()
                };
                if let Some(last) = self.device_names.last_mut() {
                    *last = name;
                }
            }
            _ => {}
        }
        if plain {
            // Copied with its quotes as it came: one copy instead of three.
            let (start, end) = self.key_span;
            self.out.extend_from_slice(self.sc.span(start, end));
            self.out.push(b':');
        } else {
            write_str(&mut self.out, k);
            self.out.push(b':');
        }
        if (ctx == Ctx::QuantityEntry && k == "value")
            || (ctx == Ctx::RequestPolicy && k == "default")
            || (ctx == Ctx::QuantityFields && is_quantity_field(k))
        {
            self.quantity()?;
            return Ok(true);
        }
        if ctx == Ctx::QuantityMap && self.sc.peek() == Some(b'n') {
            // A null entry is a zero DeviceCapacity / Counter: present, with a zero value.
            self.sc.literal(b"null")?;
            self.out.extend_from_slice(b"{\"value\":\"0\"}");
            return Ok(true);
        }
        let empty = self.value(Self::child_ctx(ctx, k))?;
        Ok(!empty || ctx == Ctx::QuantityMap)
    }

    fn object(&mut self, ctx: Ctx) -> Result<bool> {
        let base = self.members.len();
        let keys_base = self.keys.len();
        let obj_start = self.out.len();
        self.out.push(b'{');
        let mut n = 0;
        let mut has_value = false;
        match ctx {
            Ctx::Device => self.device_names.push(String::new()),
            Ctx::Taint => self.times.push(None),
            _ => {}
        }
        let time_slot = self.times.len().wrapping_sub(1);
        self.members(|r, key| {
            n += 1;
            has_value |= ctx == Ctx::QuantityEntry && key == "value";
            let before = r.out.len();
            if r.members.len() > base {
                r.out.push(b',');
            }
            let start = r.out.len();
            let plain = matches!(key, Cow::Borrowed(_));
            if r.member(ctx, &key, plain, time_slot)? {
                r.keep_member(key.as_bytes(), start);
            } else {
                r.out.truncate(before);
            }
            Ok(())
        })?;
        if ctx == Ctx::QuantityEntry && !has_value {
            if self.members.len() > base {
                self.out.push(b',');
            }
            let start = self.out.len();
            self.out.extend_from_slice(b"\"value\":\"0\"");
            self.keep_member(b"value", start);
        }
        self.finish_object(base, keys_base, obj_start);
        Ok(n == 0)
    }

    /// Records the member written at `out[start..]` so `finish_object` can sort it by key.
    fn keep_member(&mut self, key: &[u8], start: usize) {
        let ks = self.keys.len();
        self.keys.extend_from_slice(key);
        let mut prefix = [0u8; 8];
        let n = key.len().min(8);
        prefix[..n].copy_from_slice(&key[..n]);
        self.members.push(Member {
            key: (ks, self.keys.len()),
            prefix: u64::from_be_bytes(prefix),
            start,
            end: self.out.len(),
        });
    }

    /// Rewrites the members written since `obj_start` in key order, the last of equal keys
    /// winning (as in every JSON decoder Kubernetes uses), comma-separated, and closes the brace.
    ///
    /// The largest member (a spec's `devices`: nearly all of a slice) is moved once, within
    /// `out`; only the others go through `scratch`.
    fn finish_object(&mut self, base: usize, keys_base: usize, obj_start: usize) {
        let members = &mut self.members[base..];
        let keys = &self.keys;
        let key = |m: &Member| &keys[m.key.0..m.key.1];
        let cmp = |a: &Member, b: &Member| a.prefix.cmp(&b.prefix).then_with(|| key(a).cmp(key(b)));
        let sorted = members
            .windows(2)
            .all(|w| cmp(&w[0], &w[1]) == std::cmp::Ordering::Less);
        if !sorted {
            // Stable: of equal keys the last written stays last, and wins.
            members.sort_by(cmp);
            let kept = &mut self.kept;
            kept.clear();
            kept.extend(
                (0..members.len())
                    .filter(|&i| {
                        members
                            .get(i + 1)
                            .is_none_or(|n| cmp(n, &members[i]).is_ne())
                    })
                    .map(|i| (members[i].start, members[i].end)),
            );
            let largest = (0..kept.len())
                .max_by_key(|&i| kept[i].1 - kept[i].0)
                .unwrap_or_default();
            // Where each kept member goes, relative to the first: comma-separated.
            let at = &mut self.at;
            at.clear();
            let mut len = 0;
            for (i, &(s, e)) in kept.iter().enumerate() {
                if i > 0 {
                    len += 1;
                }
                at.push(len);
                len += e - s;
            }
            self.scratch.clear();
            for (i, &(s, e)) in kept.iter().enumerate() {
                if i != largest {
                    self.scratch.extend_from_slice(&self.out[s..e]);
                }
            }
            let first = obj_start + 1;
            let (ls, le) = kept[largest];
            self.out.copy_within(ls..le, first + at[largest]);
            let mut from = 0;
            for (i, &(s, e)) in kept.iter().enumerate() {
                let to = first + at[i];
                if i > 0 {
                    self.out[to - 1] = b',';
                }
                if i != largest {
                    self.out[to..to + e - s].copy_from_slice(&self.scratch[from..from + e - s]);
                    from += e - s;
                }
            }
            // The members were written comma-separated from `first`, so their rewrite, which
            // drops only duplicates, is no longer than they were.
            self.out.truncate(first + len);
        }
        self.out.push(b'}');
        self.members.truncate(base);
        self.keys.truncate(keys_base);
    }

    fn into_parsed(self) -> Parsed {
        Parsed {
            key: self.out,
            times: self.times,
            device_names: self.device_names,
            pool: self.pool,
            ..Parsed::default()
        }
    }
}

/// A desired spec: must be a JSON object.
pub fn spec(bytes: &[u8]) -> Result<Parsed> {
    let mut r = Reader::new(bytes)?;
    if r.sc.peek() != Some(b'{') {
        return Err("spec is not a JSON object".to_owned());
    }
    r.value(Ctx::Spec)?;
    r.sc.end()?;
    Ok(r.into_parsed())
}

/// An observed ResourceSlice object: metadata name, uid, resourceVersion and the spec.
pub fn observed(bytes: &[u8]) -> Result<Parsed> {
    let mut r = Reader::new(bytes)?;
    let (mut name, mut uid, mut rv) = (String::new(), String::new(), String::new());
    let mut spec_seen = false;
    r.members(|r, key| {
        match &*key {
            "metadata" if r.sc.peek() == Some(b'{') => r.members(|r, k| {
                let v = match r.scalar()? {
                    Scalar::Str(s) => s.into_owned(),
                    _ => String::new(),
                };
                match &*k {
                    "name" => name = v,
                    "uid" => uid = v,
                    "resourceVersion" => rv = v,
                    _ => {}
                }
                Ok(())
            })?,
            "spec" => {
                // The last spec wins, as with duplicate keys elsewhere.
                r.out.clear();
                r.times.clear();
                r.device_names.clear();
                r.pool = PoolInfo::unset();
                let ctx = if r.sc.peek() == Some(b'{') {
                    Ctx::Spec
                } else {
                    Ctx::Generic
                };
                r.value(ctx)?;
                spec_seen = true;
            }
            _ => {
                let mark = r.out.len();
                let saved = (r.times.len(), r.device_names.len());
                r.value(Ctx::Generic)?;
                r.out.truncate(mark);
                r.times.truncate(saved.0);
                r.device_names.truncate(saved.1);
            }
        }
        Ok(())
    })?;
    r.sc.end()?;
    if !spec_seen {
        r.out.clear();
        r.out.extend_from_slice(b"null");
    }
    let mut p = r.into_parsed();
    p.name = name;
    p.uid = uid;
    p.resource_version = rv;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> String {
        String::from_utf8(spec(s.as_bytes()).unwrap().key).unwrap()
    }

    #[test]
    fn canonical_bytes() {
        assert_eq!(
            key(r#"{"z": 1, "a": {"y": [], "x": null}, "pool": {"name": "p"}, "allNodes": false}"#),
            r#"{"a":{},"z":1}"#
        );
        assert_eq!(key(r#"{"a": "\u0041\n"}"#), r#"{"a":"A\u000a"}"#);
        assert_eq!(key(r#"{"a": 1, "a": 2}"#), r#"{"a":2}"#);
        assert_eq!(key(r#"{"a": "x\u0041"}"#), r#"{"a":"xA"}"#);
        assert_eq!(
            key(
                r#"{"devices": [{"name": "d", "capacity": {"m": {}, "n": null, "o": {"value": "1Ki"}}}]}"#
            ),
            r#"{"devices":[{"capacity":{"m":{"value":"0"},"n":{"value":"0"},"o":{"value":"1024"}},"name":"d"}]}"#
        );
    }

    #[test]
    fn members_sorted_wherever_the_largest_one_is() {
        // finish_object moves the largest member in place and the others through scratch.
        let big = r#""b": {"x": [1, 2, 3, 4, 5, 6, 7, 8, 9], "w": "long long long"}"#;
        let want =
            r#"{"a":"s","b":{"w":"long long long","x":[1,2,3,4,5,6,7,8,9]},"c":2,"d":[true]}"#;
        let members = [r#""c": 2"#, r#""a": "s""#, big, r#""d": [true]"#];
        for first in 0..members.len() {
            for second in 0..members.len() {
                if first == second {
                    continue;
                }
                let mut order = vec![members[first], members[second]];
                order.extend(
                    (0..members.len())
                        .filter(|&i| i != first && i != second)
                        .map(|i| members[i]),
                );
                assert_eq!(key(&format!("{{{}}}", order.join(", "))), want, "{order:?}");
                // An earlier duplicate of any member loses to the later one.
                let dup = format!(
                    r#"{{"b": 0, "d": 0, {}, "a": 1, "a": "s"}}"#,
                    order.join(", ")
                );
                assert_eq!(key(&dup), want, "{dup}");
            }
        }
    }

    #[test]
    fn request_policies_and_node_allocatable_quantities_by_value() {
        let a = key(
            r#"{"devices": [{"name": "d", "capacity": {"c": {"value": "1Gi", "requestPolicy":
                {"default": "1Gi", "validValues": ["1024Mi", null], "validRange":
                 {"min": "1k", "max": null, "step": "1e3"}}}},
                "nodeAllocatableResources": {"cpu": {"mapping": {"capacityKey": "c",
                 "capacityMultiplier": "2000m"}, "overhead": {"perPod": "0.5", "perContainer": null}}}}]}"#,
        );
        let b = key(
            r#"{"devices": [{"name": "d", "nodeAllocatableResources": {"cpu": {"overhead":
                {"perPod": "500m"}, "mapping": {"capacityMultiplier": "2", "capacityKey": "c"}}},
                "capacity": {"c": {"requestPolicy": {"validRange": {"step": "1000", "min": "1000"},
                 "validValues": ["1Gi", "0"], "default": "1073741824"}, "value": "1Gi"}}}]}"#,
        );
        assert_eq!(a, b);
        // A nil default is absent; capacityKey is a name, not a quantity.
        assert_eq!(
            key(
                r#"{"devices": [{"capacity": {"c": {"value": "1", "requestPolicy": {"default": null, "validRange": {"min": "1"}}}}}]}"#
            ),
            key(
                r#"{"devices": [{"capacity": {"c": {"value": "1", "requestPolicy": {"validRange": {"min": "1"}}}}}]}"#
            )
        );
        assert_ne!(
            key(
                r#"{"devices": [{"nodeAllocatableResources": {"cpu": {"mapping": {"capacityKey": "e3"}}}}]}"#
            ),
            key(
                r#"{"devices": [{"nodeAllocatableResources": {"cpu": {"mapping": {"capacityKey": "1000"}}}}]}"#
            )
        );
        assert_ne!(
            key(
                r#"{"devices": [{"capacity": {"c": {"value": "1", "requestPolicy": {"default": "1"}}}}]}"#
            ),
            key(
                r#"{"devices": [{"capacity": {"c": {"value": "1", "requestPolicy": {"default": "2"}}}}]}"#
            )
        );
    }

    #[test]
    fn observed_metadata_pool_and_names() {
        let p = observed(
            br#"{"metadata": {"name": "s", "uid": "u", "resourceVersion": "7"},
                 "spec": {"pool": {"name": "p", "generation": 3, "resourceSliceCount": 2},
                          "devices": [{"name": "b"}, {"name": "a", "taints": [{"key": "k"}]}, 5]}}"#,
        )
        .unwrap();
        assert_eq!(
            (p.name.as_str(), p.uid.as_str(), p.resource_version.as_str()),
            ("s", "u", "7")
        );
        assert_eq!(
            p.pool,
            PoolInfo {
                name: Some("p".into()),
                generation: Some(3),
                count: Some(2)
            }
        );
        assert_eq!(p.device_names, ["b", "a", ""]);
        assert_eq!(p.times, [None]);
    }

    #[test]
    fn rejects_invalid_json() {
        for bad in [
            &b"{"[..],
            b"{\"a\":}",
            b"{\"a\":1}x",
            b"{\"a\":\"\\ud800\"}",
            // RFC 8259 wants four hex digits; the planner's old reader took a sign.
            b"{\"a\":\"\\u+041\"}",
            b"{\"a\":\xff}",
        ] {
            assert!(spec(bad).is_err());
        }
    }
}
