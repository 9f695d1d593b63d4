//! The desired ResourceSlice specs of a validated inventory: per pool, its devices split into
//! slices and every quantity in canonical form (what the API server would store), written as the
//! JSON bytes `msgspec.json.encode(ResourceSliceSpec)` writes. The planner reads these bytes; the
//! Python reference they are property-tested against is tests/support/dra_reference/desired.py.

use super::model::{self, Capacity, CounterSet, Counters, Device, Inventory, Obj, Pool, Str};
use crate::quantity;

/// The limits of kube-apiserver v1.37 (`k8s.io/kubernetes/pkg/apis/resource`), the same in 1.35
/// and 1.36.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Taints and counter consumption make devices larger; upstream halves the limit for them
/// (`ResourceSliceMaxDevicesWithAdvancedFeatures`).
pub const MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Counter sets per slice: a pool may have more, spread over several counter slices.
pub const MAX_COUNTER_SETS: usize = 8;

type Result<T> = std::result::Result<T, String>;

fn canonical(text: &str) -> Result<Str> {
    quantity::parse(text)
        .map(|q| quantity::canonical(&q).into())
        .map_err(|e| format!("quantity {text:?}: {e}"))
}

fn canonical_opt(text: &Option<Str>) -> Result<Option<Str>> {
    text.as_deref().map(canonical).transpose()
}

fn canonical_counters(counters: &Counters) -> Result<Counters> {
    counters
        .iter()
        .map(|(k, v)| Ok((k.clone(), canonical(v)?)))
        .collect()
}

fn canonical_capacity(c: &Capacity) -> Result<Capacity> {
    let policy = match &c.request_policy {
        // Validated already (the device allows multiple allocations): an empty policy means
        // what no policy means, and the server would store it as `{"default": null}`, which
        // the planner rightly tells apart from the `{}` sent, rewriting it every time.
        Some(p) if p.default.is_none() && p.valid_values.is_empty() && p.valid_range.is_none() => {
            None
        }
        Some(p) => Some(model::Policy {
            default: canonical_opt(&p.default)?,
            valid_values: p
                .valid_values
                .iter()
                .map(|v| canonical(v))
                .collect::<Result<_>>()?,
            valid_range: match &p.valid_range {
                Some(r) => Some(model::Range {
                    min: canonical_opt(&r.min)?,
                    max: canonical_opt(&r.max)?,
                    step: canonical_opt(&r.step)?,
                }),
                None => None,
            },
        }),
        None => None,
    };
    Ok(Capacity {
        value: canonical(&c.value)?,
        request_policy: policy,
    })
}

/// Every quantity of the device (capacities and their request policies, consumed counters,
/// node-allocatable multipliers and overheads) put in canonical form.
fn canonicalize_device(d: &mut Device) -> Result<()> {
    for (_, c) in d.capacity.iter_mut() {
        *c = canonical_capacity(c)?;
    }
    for u in d.consumes_counters.iter_mut() {
        u.counters = canonical_counters(&u.counters)?;
    }
    for (_, r) in d.node_allocatable_resources.iter_mut() {
        if let Some(m) = r.mapping.as_mut() {
            m.capacity_multiplier = canonical_opt(&m.capacity_multiplier)?;
            m.device_multiplier = canonical_opt(&m.device_multiplier)?;
        }
        if let Some(o) = r.overhead.as_mut() {
            o.per_pod = canonical_opt(&o.per_pod)?;
            o.per_container = canonical_opt(&o.per_container)?;
        }
    }
    Ok(())
}

fn heavy(d: &Device) -> bool {
    !d.taints.is_empty() || !d.consumes_counters.is_empty()
}

/// Consecutive chunks of at most 128 devices, 64 in a chunk holding a tainted or
/// counter-consuming device; always at least one chunk.
pub fn split_devices(devices: &[Device]) -> Vec<&[Device]> {
    let mut chunks = Vec::new();
    let (mut start, mut heavy_chunk) = (0, false);
    for (i, d) in devices.iter().enumerate() {
        let now_heavy = heavy_chunk || heavy(d);
        let limit = if now_heavy {
            MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
        } else {
            MAX_DEVICES_PER_SLICE
        };
        if i - start + 1 > limit {
            chunks.push(&devices[start..i]);
            start = i;
            heavy_chunk = heavy(d);
        } else {
            heavy_chunk = now_heavy;
        }
    }
    chunks.push(&devices[start..]);
    chunks
}

/// What the slices of one pool share.
struct Head<'a> {
    driver: &'a str,
    pool: &'a str,
    count: usize,
    node_name: &'a str,
}

impl Head<'_> {
    /// The spec's fields up to `nodeName`, in `ResourceSliceSpec`'s order.
    fn start<'o>(&self, out: &'o mut String) -> Obj<'o> {
        let mut o = Obj::new(out);
        o.str("driver", self.driver);
        o.obj("pool", |out| {
            let mut p = Obj::new(out);
            p.str("name", self.pool);
            // `generation` is the planner's; 0 is msgspec's default, left out.
            p.int("resourceSliceCount", self.count as i64);
            p.end();
        });
        o.str("nodeName", self.node_name);
        o
    }
}

/// The pool's slice specs, quantities in canonical form; the planner fills in the pool's
/// generation, and `resourceSliceCount` counts every slice of the pool.
///
/// Shared counters go into slices of their own (upstream refuses a slice holding both
/// `sharedCounters` and `devices` since DRAPartitionableDevices went beta), at most
/// `MAX_COUNTER_SETS` sets each, ahead of the device slices; a device may consume counters of a
/// set in any slice of its pool. A pool with neither devices nor counters is one empty slice
/// (it still says the pool exists and is empty).
pub fn pool_slices(driver: &str, mut pool: Pool, node_name: &str) -> Result<Vec<String>> {
    let shared = pool
        .shared_counters
        .iter()
        .map(|cs| {
            Ok(CounterSet {
                name: cs.name.clone(),
                counters: canonical_counters(&cs.counters)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for d in pool.devices.iter_mut() {
        canonicalize_device(d)?;
    }
    let devices = &pool.devices;
    let counter_chunks: Vec<&[CounterSet]> = shared.chunks(MAX_COUNTER_SETS).collect();
    let mut device_chunks = split_devices(devices);
    if !counter_chunks.is_empty() && devices.is_empty() {
        device_chunks.clear();
    }
    let head = Head {
        driver,
        pool: &pool.name,
        count: counter_chunks.len() + device_chunks.len(),
        node_name,
    };
    let mut out = Vec::with_capacity(head.count);
    for chunk in counter_chunks {
        let mut spec = String::with_capacity(256 + chunk.len() * 256);
        let mut o = head.start(&mut spec);
        o.list("sharedCounters", chunk, model::counter_set);
        o.end();
        out.push(spec);
    }
    for chunk in device_chunks {
        let mut spec = String::with_capacity(256 + chunk.len() * 512);
        let mut o = head.start(&mut spec);
        o.list("devices", chunk, model::device);
        // Upstream refuses the attribute on a slice without counter-consuming devices.
        if chunk.iter().any(|d| !d.consumes_counters.is_empty()) {
            o.opt("partitionTypeAttribute", &pool.partition_type_attribute);
        }
        o.strs("skipNodeOperations", &pool.skip_node_operations);
        o.end();
        out.push(spec);
    }
    Ok(out)
}

/// Per pool of the inventory, its desired slice specs (`pool_slices`).
pub fn slices(inv: Inventory, node_name: &str) -> Result<Vec<Vec<String>>> {
    inv.pools
        .into_iter()
        .map(|p| pool_slices(&inv.driver, p, node_name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::model::{Attribute, Consumption, Policy, Taint};

    fn device(name: &str) -> Device {
        Device {
            name: name.into(),
            ..Device::default()
        }
    }

    fn tainted(name: &str) -> Device {
        Device {
            taints: vec![Taint {
                key: "k".into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }],
            ..device(name)
        }
    }

    fn sizes(chunks: &[&[Device]]) -> Vec<usize> {
        chunks.iter().map(|c| c.len()).collect()
    }

    #[test]
    fn plain_devices_fill_slices_of_128() {
        let devices: Vec<_> = (0..300).map(|i| device(&format!("d{i}"))).collect();
        assert_eq!(sizes(&split_devices(&devices)), [128, 128, 44]);
        assert_eq!(sizes(&split_devices(&[])), [0]);
    }

    #[test]
    fn a_tainted_device_halves_its_slice() {
        let mut devices: Vec<_> = (0..100).map(|i| device(&format!("d{i}"))).collect();
        devices[70] = tainted("t");
        // The chunk is full at 64 once the tainted device is in it; the next starts light.
        assert_eq!(sizes(&split_devices(&devices)), [70, 30]);
        devices[10] = tainted("t0");
        assert_eq!(sizes(&split_devices(&devices)), [64, 36]);
    }

    #[test]
    fn quantities_are_canonical_and_an_empty_policy_goes() {
        let mut d = device("gpu-0");
        d.attributes = vec![(
            "index".into(),
            Attribute {
                int: Some(3),
                ..Attribute::default()
            },
        )];
        d.capacity = vec![
            (
                "memory".into(),
                Capacity {
                    value: "2048Mi".into(),
                    request_policy: None,
                },
            ),
            (
                "bw".into(),
                Capacity {
                    value: "1000m".into(),
                    request_policy: Some(Policy::default()),
                },
            ),
        ];
        d.consumes_counters = vec![Consumption {
            counter_set: "mem".into(),
            counters: vec![("m".into(), "1024Ki".into())],
            ..Consumption::default()
        }];
        let pool = Pool {
            name: "p".into(),
            devices: vec![d],
            partition_type_attribute: Some("kind".into()),
            ..Pool::default()
        };
        let specs = pool_slices("gpu.example.com", pool, "node-a").expect("valid");
        assert_eq!(
            specs,
            [concat!(
                r#"{"driver":"gpu.example.com","pool":{"name":"p","resourceSliceCount":1},"#,
                r#""nodeName":"node-a","devices":[{"name":"gpu-0","attributes":{"index":{"int":3}},"#,
                r#""capacity":{"memory":{"value":"2Gi"},"bw":{"value":"1"}},"#,
                r#""consumesCounters":[{"counterSet":"mem","counters":{"m":{"value":"1Mi"}}}]}],"#,
                r#""partitionTypeAttribute":"kind"}"#
            )]
        );
    }

    #[test]
    fn counters_go_ahead_in_slices_of_their_own() {
        let sets: Vec<_> = (0..9)
            .map(|i| CounterSet {
                name: format!("s{i}").into(),
                counters: vec![("c".into(), "1k".into())],
            })
            .collect();
        let pool = Pool {
            name: "p".into(),
            shared_counters: sets.clone(),
            ..Pool::default()
        };
        let specs = pool_slices("d", pool.clone(), "n").expect("valid");
        assert_eq!(specs.len(), 2, "8 sets, then 1; no empty device slice");
        assert!(specs[1].contains(r#""resourceSliceCount":2"#));
        let with_devices = Pool {
            devices: vec![device("x")],
            ..pool
        };
        let specs = pool_slices("d", with_devices, "n").expect("valid");
        assert_eq!(specs.len(), 3);
        assert!(specs[2].contains(r#""devices":[{"name":"x"}]"#));
    }

    #[test]
    fn an_empty_pool_is_one_empty_slice() {
        let pool = Pool {
            name: "p".into(),
            skip_node_operations: vec!["*".into()],
            ..Pool::default()
        };
        assert_eq!(
            pool_slices("d", pool.clone(), "n").expect("valid"),
            [
                r#"{"driver":"d","pool":{"name":"p","resourceSliceCount":1},"nodeName":"n","skipNodeOperations":["*"]}"#
            ]
        );
    }

    #[test]
    fn an_invalid_quantity_is_an_error_naming_it() {
        let pool = Pool {
            name: "p".into(),
            shared_counters: vec![CounterSet {
                name: "s".into(),
                counters: vec![("c".into(), "lots".into())],
            }],
            ..Pool::default()
        };
        let err = pool_slices("d", pool.clone(), "n").expect_err("invalid");
        assert!(err.contains("\"lots\""), "{err}");
    }
}
