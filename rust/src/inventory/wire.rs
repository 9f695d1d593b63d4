//! The two plugin messages, decoded from protobuf wire bytes (`SerializeToString()` of the
//! Python message) straight into the inventory model: the native `nodeagent.device.v1alpha1`
//! Inventory one-to-one, the seed `v1alpha3` NodeListAndWatchResourcesResponse into its
//! instances and attribute values. Only the fields these messages define are read; unknown
//! fields are skipped, as protobuf does.

use super::model::*;

/// Errors are static: a small `Result` keeps the hot decoding loop lean.
pub type Result<T> = std::result::Result<T, &'static str>;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    #[inline]
    fn varint(&mut self) -> Result<u64> {
        // Tags, lengths and small ints are one byte.
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        self.varint_slow()
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long")
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or("truncated field")?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// The next (field number, value), or None at the end.
    #[inline]
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Other
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| "length too large")?;
                Field::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Field::Other
            }
            _ => return Err("unsupported wire type"),
        };
        Ok(Some((key >> 3, field)))
    }
}

fn text(b: &[u8]) -> Result<Str> {
    match std::str::from_utf8(b) {
        Ok(s) => Ok(Str::from(s)),
        Err(_) => Err("invalid UTF-8 in a string field"),
    }
}

fn opt(s: Str) -> Option<Str> {
    (!s.is_empty()).then_some(s)
}

/// Walks a message's fields.
fn fields<'a>(buf: &'a [u8], mut f: impl FnMut(u64, Field<'a>) -> Result<()>) -> Result<()> {
    let mut r = Reader::new(buf);
    while let Some((n, v)) = r.next()? {
        f(n, v)?;
    }
    Ok(())
}

/// A map entry (key 1, value 2) whose value is a message; a missing value is the default one.
fn entry<T: Default>(b: &[u8], value: impl Fn(&[u8]) -> Result<T>) -> Result<(Str, T)> {
    let mut key = Str::default();
    let mut val = None;
    fields(b, |n, f| {
        match (n, f) {
            (1, Field::Bytes(b)) => key = text(b)?,
            (2, Field::Bytes(b)) => val = Some(value(b)?),
            _ => {}
        }
        Ok(())
    })?;
    Ok((key, val.unwrap_or_default()))
}

/// Adds a map entry. The bytes are `SerializeToString()` of a message object, whose maps hold
/// each key once: no look-up for an earlier entry of the same key (a measurable share of the
/// decoding of an inventory's attributes).
fn put<T>(map: &mut Map<T>, entry: (Str, T)) {
    map.push(entry);
}

fn strings_field(b: &[u8], names: &mut [(u64, &mut Str)]) -> Result<()> {
    fields(b, |n, f| {
        if let Field::Bytes(b) = f {
            if let Some((_, s)) = names.iter_mut().find(|(k, _)| *k == n) {
                **s = text(b)?;
            }
        }
        Ok(())
    })
}

fn counter(b: &[u8]) -> Result<Str> {
    let mut v = Str::default();
    strings_field(b, &mut [(1, &mut v)])?;
    Ok(v)
}

fn counters_entry(map: &mut Counters, b: &[u8]) -> Result<()> {
    put(map, entry(b, counter)?);
    Ok(())
}

fn attribute(b: &[u8]) -> Result<Attribute> {
    let mut a = Attribute::default();
    // A oneof: the last value on the wire is the one set.
    fields(b, |n, f| {
        let set = match (n, f) {
            (2, Field::Varint(v)) => Some(Attribute {
                int: Some(v as i64),
                ..Default::default()
            }),
            (3, Field::Varint(v)) => Some(Attribute {
                bool_: Some(v != 0),
                ..Default::default()
            }),
            (4, Field::Bytes(b)) => Some(Attribute {
                string: Some(text(b)?),
                ..Default::default()
            }),
            (5, Field::Bytes(b)) => Some(Attribute {
                version: Some(text(b)?),
                ..Default::default()
            }),
            _ => None,
        };
        if let Some(set) = set {
            a = set;
        }
        Ok(())
    })?;
    Ok(a)
}

fn range(b: &[u8]) -> Result<Range> {
    let (mut min, mut max, mut step) = (Str::default(), Str::default(), Str::default());
    strings_field(b, &mut [(1, &mut min), (2, &mut max), (3, &mut step)])?;
    Ok(Range {
        min: opt(min),
        max: opt(max),
        step: opt(step),
    })
}

fn policy(b: &[u8]) -> Result<Policy> {
    let mut default = Str::default();
    let mut p = Policy::default();
    fields(b, |n, f| {
        match (n, f) {
            (1, Field::Bytes(b)) => default = text(b)?,
            (3, Field::Bytes(b)) => p.valid_values.push(text(b)?),
            (4, Field::Bytes(b)) => p.valid_range = Some(range(b)?),
            _ => {}
        }
        Ok(())
    })?;
    p.default = opt(default);
    Ok(p)
}

fn capacity(b: &[u8]) -> Result<Capacity> {
    let mut c = Capacity::default();
    fields(b, |n, f| {
        match (n, f) {
            (1, Field::Bytes(b)) => c.value = text(b)?,
            (2, Field::Bytes(b)) => c.request_policy = Some(policy(b)?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(c)
}

fn node_allocatable(b: &[u8]) -> Result<NodeAllocatable> {
    let mut r = NodeAllocatable::default();
    fields(b, |n, f| {
        match (n, f) {
            (3, Field::Bytes(b)) => {
                let (mut k, mut cm, mut dm) = (Str::default(), Str::default(), Str::default());
                strings_field(b, &mut [(1, &mut k), (2, &mut cm), (3, &mut dm)])?;
                r.mapping = Some(Mapping {
                    capacity_key: opt(k),
                    capacity_multiplier: opt(cm),
                    device_multiplier: opt(dm),
                });
            }
            (4, Field::Bytes(b)) => {
                let (mut pp, mut pc) = (Str::default(), Str::default());
                strings_field(b, &mut [(1, &mut pp), (2, &mut pc)])?;
                r.overhead = Some(Overhead {
                    per_pod: opt(pp),
                    per_container: opt(pc),
                });
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(r)
}

fn consumption(b: &[u8]) -> Result<Consumption> {
    let mut c = Consumption::default();
    fields(b, |n, f| {
        match (n, f) {
            (1, Field::Bytes(b)) => c.counter_set = text(b)?,
            (2, Field::Bytes(b)) => counters_entry(&mut c.counters, b)?,
            (3, Field::Bytes(b)) => c.compatibility_groups.push(text(b)?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(c)
}

fn taint(b: &[u8]) -> Result<Taint> {
    let (mut key, mut value, mut effect, mut added) = (
        Str::default(),
        Str::default(),
        Str::default(),
        Str::default(),
    );
    strings_field(
        b,
        &mut [
            (1, &mut key),
            (2, &mut value),
            (3, &mut effect),
            (4, &mut added),
        ],
    )?;
    Ok(Taint {
        key,
        value,
        effect,
        time_added: opt(added),
    })
}

fn device(b: &[u8]) -> Result<Device> {
    let mut d = Device::default();
    fields(b, |n, f| {
        match (n, f) {
            (1, Field::Bytes(b)) => d.name = text(b)?,
            (2, Field::Bytes(b)) => put(&mut d.attributes, entry(b, attribute)?),
            (3, Field::Bytes(b)) => put(&mut d.capacity, entry(b, capacity)?),
            (4, Field::Bytes(b)) => d.consumes_counters.push(consumption(b)?),
            (8, Field::Bytes(b)) => d.taints.push(taint(b)?),
            // False is not published: upstream consumers read an unset pointer as false.
            (9, Field::Varint(v)) => d.binds_to_node = (v != 0).then_some(true),
            (10, Field::Bytes(b)) => d.binding_conditions.push(text(b)?),
            (11, Field::Bytes(b)) => d.binding_failure_conditions.push(text(b)?),
            (12, Field::Varint(v)) => d.allow_multiple_allocations = (v != 0).then_some(true),
            (14, Field::Bytes(b)) => put(
                &mut d.node_allocatable_resources,
                entry(b, node_allocatable)?,
            ),
            _ => {}
        }
        Ok(())
    })?;
    Ok(d)
}

fn counter_set(b: &[u8]) -> Result<CounterSet> {
    let mut c = CounterSet::default();
    fields(b, |n, f| {
        match (n, f) {
            (1, Field::Bytes(b)) => c.name = text(b)?,
            (2, Field::Bytes(b)) => counters_entry(&mut c.counters, b)?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(c)
}

fn pool(b: &[u8]) -> Result<Pool> {
    let mut p = Pool::default();
    let mut partition = Str::default();
    fields(b, |n, f| {
        match (n, f) {
            (1, Field::Bytes(b)) => p.name = text(b)?,
            (2, Field::Bytes(b)) => p.devices.push(device(b)?),
            (8, Field::Bytes(b)) => p.shared_counters.push(counter_set(b)?),
            (9, Field::Bytes(b)) => partition = text(b)?,
            (10, Field::Bytes(b)) => p.skip_node_operations.push(text(b)?),
            _ => {}
        }
        Ok(())
    })?;
    p.partition_type_attribute = opt(partition);
    Ok(p)
}

/// A native `Inventory` message as the inventory of `driver`.
pub fn native(driver: &str, b: &[u8]) -> Result<Inventory> {
    let mut inv = Inventory {
        driver: driver.into(),
        pools: Vec::new(),
    };
    fields(b, |n, f| {
        if let (1, Field::Bytes(b)) = (n, f) {
            inv.pools.push(pool(b)?);
        }
        Ok(())
    })?;
    Ok(inv)
}

// --- seed ----------------------------------------------------------------------------------

/// One value of a seed attribute: which fields are present (proto2), in field-number order.
#[derive(Default)]
pub struct SeedValue {
    pub bool_: Option<bool>,
    pub string: Option<Str>,
    pub quantity: Option<Str>,
    pub int: Option<i64>,
    pub int_slice: bool,
    pub string_slice: bool,
    pub version: Option<Str>,
}

impl SeedValue {
    pub fn count(&self) -> usize {
        [
            self.bool_.is_some(),
            self.string.is_some(),
            self.quantity.is_some(),
            self.int.is_some(),
            self.int_slice,
            self.string_slice,
            self.version.is_some(),
        ]
        .iter()
        .filter(|&&x| x)
        .count()
    }
}

pub struct SeedAttribute {
    pub name: Str,
    pub value: SeedValue,
}

pub struct SeedInstance {
    pub name: Str,
    pub attributes: Vec<SeedAttribute>,
}

fn seed_value(b: &[u8]) -> Result<SeedValue> {
    let mut v = SeedValue::default();
    fields(b, |n, f| {
        match (n, f) {
            (2, Field::Varint(x)) => v.bool_ = Some(x != 0),
            (5, Field::Bytes(b)) => v.string = Some(text(b)?),
            (6, Field::Bytes(b)) => {
                // resource.Quantity { optional string string = 1; }; merged as protobuf does.
                let mut s = v.quantity.take().unwrap_or_default();
                strings_field(b, &mut [(1, &mut s)])?;
                v.quantity = Some(s);
            }
            (7, Field::Varint(x)) => v.int = Some(x as i64),
            (8, Field::Bytes(_)) => v.int_slice = true,
            (9, Field::Bytes(_)) => v.string_slice = true,
            (10, Field::Bytes(b)) => v.version = Some(text(b)?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(v)
}

/// Every named-resources instance of a seed `NodeListAndWatchResourcesResponse`, in order.
pub fn seed(b: &[u8]) -> Result<Vec<SeedInstance>> {
    let mut out = Vec::new();
    fields(b, |n, f| {
        let (1, Field::Bytes(model)) = (n, f) else {
            return Ok(());
        };
        fields(model, |n, f| {
            let (1, Field::Bytes(named)) = (n, f) else {
                return Ok(());
            };
            fields(named, |n, f| {
                let (1, Field::Bytes(inst)) = (n, f) else {
                    return Ok(());
                };
                let mut i = SeedInstance {
                    name: Str::default(),
                    attributes: Vec::new(),
                };
                fields(inst, |n, f| {
                    match (n, f) {
                        (1, Field::Bytes(b)) => i.name = text(b)?,
                        (2, Field::Bytes(b)) => {
                            let mut a = SeedAttribute {
                                name: Str::default(),
                                value: SeedValue::default(),
                            };
                            fields(b, |n, f| {
                                match (n, f) {
                                    (1, Field::Bytes(b)) => a.name = text(b)?,
                                    (2, Field::Bytes(b)) => a.value = seed_value(b)?,
                                    _ => {}
                                }
                                Ok(())
                            })?;
                            i.attributes.push(a);
                        }
                        _ => {}
                    }
                    Ok(())
                })?;
                out.push(i);
                Ok(())
            })
        })
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length-delimited field: the tag, the length, the bytes.
    fn bytes(n: u64, b: &[u8]) -> Vec<u8> {
        let mut out = varint(n << 3 | 2);
        out.extend(varint(b.len() as u64));
        out.extend_from_slice(b);
        out
    }

    fn int(n: u64, v: u64) -> Vec<u8> {
        let mut out = varint(n << 3);
        out.extend(varint(v));
        out
    }

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    fn entry(key: &str, value: &[u8]) -> Vec<u8> {
        [bytes(1, key.as_bytes()), bytes(2, value)].concat()
    }

    fn inventory(device: &[u8]) -> Vec<u8> {
        let pool = [bytes(1, b"pool-a"), bytes(2, device)].concat();
        bytes(1, &pool)
    }

    #[test]
    fn a_native_device_is_decoded_one_to_one() {
        let device = [
            bytes(1, b"gpu-0"),
            // A oneof sent twice: the last value on the wire wins, as protobuf reads it.
            bytes(
                2,
                &entry("index", &[bytes(4, b"x"), int(2, (-3i64) as u64)].concat()),
            ),
            bytes(3, &entry("memory", &bytes(1, b"80Gi"))),
            int(9, 0),  // bindsToNode false: not published
            int(12, 1), // allowMultipleAllocations true
            int(99, 7), // an unknown field: skipped
        ]
        .concat();
        let inv = native("gpu.example.com", &inventory(&device)).expect("decodes");
        assert_eq!(inv.driver, "gpu.example.com");
        let d = &inv.pools[0].devices[0];
        assert_eq!(inv.pools[0].name, "pool-a");
        assert_eq!(d.name, "gpu-0");
        assert_eq!(d.attributes[0].0, "index");
        assert_eq!(d.attributes[0].1.int, Some(-3));
        assert_eq!(d.attributes[0].1.string, None);
        assert_eq!(d.capacity[0].1.value, "80Gi");
        assert_eq!(d.binds_to_node, None);
        assert_eq!(d.allow_multiple_allocations, Some(true));
    }

    #[test]
    fn empty_optional_strings_are_unset() {
        let policy = [
            bytes(1, b""),
            bytes(4, &[bytes(1, b"1"), bytes(3, b"")].concat()),
        ]
        .concat();
        let cap = entry("bw", &[bytes(1, b"10"), bytes(2, &policy)].concat());
        let inv = native("d", &inventory(&bytes(3, &cap))).expect("decodes");
        let p = inv.pools[0].devices[0].capacity[0].1.request_policy.clone();
        let p = p.expect("a policy");
        assert_eq!(p.default, None);
        let r = p.valid_range.expect("a range");
        assert_eq!((r.min.as_deref(), r.max, r.step), (Some("1"), None, None));
    }

    #[test]
    fn broken_bytes_are_errors() {
        let whole = inventory(&bytes(1, b"gpu-0"));
        assert_eq!(
            native("d", &whole[..whole.len() - 1]).err(),
            Some("truncated field")
        );
        assert_eq!(
            native("d", &inventory(&bytes(1, b"\xff"))).err(),
            Some("invalid UTF-8 in a string field")
        );
        assert_eq!(native("d", &[0x0b]).err(), Some("unsupported wire type"));
    }

    #[test]
    fn a_seed_instance_keeps_its_attributes_in_order() {
        let quantity = bytes(6, &bytes(1, b"1Gi"));
        let attrs = [
            bytes(2, &[bytes(1, b"mem"), bytes(2, &quantity)].concat()),
            bytes(2, &[bytes(1, b"n"), bytes(2, &int(7, 4))].concat()),
        ]
        .concat();
        let instance = [bytes(1, b"gpu.0"), attrs].concat();
        let message = bytes(1, &bytes(1, &bytes(1, &instance)));
        let seed = seed(&message).expect("decodes");
        assert_eq!(seed.len(), 1);
        assert_eq!(seed[0].name, "gpu.0");
        let names: Vec<_> = seed[0].attributes.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["mem", "n"]);
        assert_eq!(seed[0].attributes[0].value.quantity.as_deref(), Some("1Gi"));
        assert_eq!(seed[0].attributes[1].value.int, Some(4));
        assert_eq!(seed[0].attributes[1].value.count(), 1);
    }
}
