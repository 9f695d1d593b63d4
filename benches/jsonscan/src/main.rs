//! jsonscan MODE FILE [ROUNDS]: the project's scanner against sonic-rs and simd-json.
//!
//! - `events FILE`: newline-delimited watch events (bench_accumulator's stream). Each scanner
//!   does what the store needs per event: validate the line, read `type` and the object's
//!   metadata name, namespace, uid and resourceVersion, and find the object's byte span.
//! - `slices FILE`: a benches/goseed case file (bench_planner's slices). The project's scanner
//!   validates and writes the canonical form (`planner::canon`); the crates only parse into
//!   their document trees, the first step a canonicaliser built on them would take.
//!
//! Prints one line per scanner: `NAME ns=N items=N bytes=N` (the best of ROUNDS).

#![allow(dead_code, clippy::print_stdout)]

#[path = "../../../rust/src/json.rs"]
mod json;

#[path = "../../../rust/src/store"]
mod store {
    pub mod parse;
}

#[path = "../../../rust/src/quantity.rs"]
mod quantity;

#[path = "../../../rust/src/planner"]
mod planner {
    pub mod canon;
}

use std::borrow::Cow;
use std::hint::black_box;
use std::time::Instant;

use serde::Deserialize;
use sonic_rs::JsonContainerTrait;

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "resourceVersion")]
    resource_version: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    metadata: Option<Meta<'a>>,
}

/// An event with the object kept raw: its span, as the store needs it.
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow, rename = "type")]
    ty: Cow<'a, str>,
    #[serde(borrow)]
    object: sonic_rs::LazyValue<'a>,
}

/// An event decoded in one pass (no span): a lower bound for the crate.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, rename = "type")]
    ty: Cow<'a, str>,
    #[serde(borrow)]
    object: Head<'a>,
}

fn key_len(m: &Option<Meta<'_>>) -> usize {
    m.as_ref().map_or(0, |m| {
        m.name.as_deref().map_or(0, str::len)
            + m.namespace.as_deref().map_or(0, str::len)
            + m.uid.as_deref().map_or(0, str::len)
            + m.resource_version.as_deref().map_or(0, str::len)
    })
}

fn own_event(line: &[u8]) -> usize {
    match store::parse::event(line).expect("valid event") {
        store::parse::Event::Upsert(h) | store::parse::Event::Delete(h) => {
            let k = h.keyed().expect("keyed");
            k.name.len() + k.namespace.len() + k.uid.len() + k.resource_version.len() + h.end
                - h.start
        }
        _ => 0,
    }
}

fn sonic_event_span(line: &[u8]) -> usize {
    let e: RawEvent<'_> = sonic_rs::from_slice(line).expect("valid event");
    let raw = e.object.as_raw_str();
    let h: Head<'_> = sonic_rs::from_str(raw).expect("valid object");
    e.ty.len() + key_len(&h.metadata) + raw.len()
}

fn sonic_event_onepass(line: &[u8]) -> usize {
    let e: Event<'_> = sonic_rs::from_slice(line).expect("valid event");
    e.ty.len() + key_len(&e.object.metadata)
}

/// simd-json parses in place: each line is copied into a reused buffer first, as the store
/// (which keeps the object's bytes) would have to.
fn simd_json_event(line: &[u8], buf: &mut Vec<u8>) -> usize {
    buf.clear();
    buf.extend_from_slice(line);
    let e: Event<'_> = simd_json::serde::from_slice(buf).expect("valid event");
    e.ty.len() + key_len(&e.object.metadata)
}

fn best_of(rounds: usize, mut f: impl FnMut() -> usize) -> u128 {
    let mut best = u128::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed().as_nanos());
    }
    best
}

/// One pool's desired and observed slices.
type PoolBytes<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>);

fn read_case(data: &[u8]) -> Vec<PoolBytes<'_>> {
    let mut pos = 0;
    let u32 = |pos: &mut usize| {
        let v = u32::from_le_bytes(data[*pos..*pos + 4].try_into().expect("4 bytes")) as usize;
        *pos += 4;
        v
    };
    let pools = u32(&mut pos);
    (0..pools)
        .map(|_| {
            let (nd, no) = (u32(&mut pos), u32(&mut pos));
            let mut all: Vec<&[u8]> = (0..nd + no)
                .map(|_| {
                    let l = u32(&mut pos);
                    pos += l;
                    &data[pos - l..pos]
                })
                .collect();
            let observed = all.split_off(nd);
            (all, observed)
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, path) = match (args.get(1), args.get(2)) {
        (Some(m), Some(p)) => (m.as_str(), p.as_str()),
        _ => {
            eprintln!("usage: jsonscan events|slices FILE [ROUNDS]");
            std::process::exit(2);
        }
    };
    let rounds: usize = args.get(3).map_or(3, |r| r.parse().expect("ROUNDS"));
    let data = std::fs::read(path).expect("readable FILE");
    let report = |name: &str, ns: u128, items: usize| {
        println!("{name} ns={ns} items={items} bytes={}", data.len());
    };
    match mode {
        "events" => {
            let lines: Vec<&[u8]> = data
                .split(|&c| c == b'\n')
                .filter(|l| !l.is_empty())
                .collect();
            let n = lines.len();
            report(
                "own",
                best_of(rounds, || lines.iter().map(|l| own_event(l)).sum()),
                n,
            );
            report(
                "sonic-rs",
                best_of(rounds, || lines.iter().map(|l| sonic_event_span(l)).sum()),
                n,
            );
            report(
                "sonic-rs-no-span",
                best_of(rounds, || {
                    lines.iter().map(|l| sonic_event_onepass(l)).sum()
                }),
                n,
            );
            let mut buf = Vec::new();
            report(
                "simd-json-no-span",
                best_of(rounds, || {
                    lines.iter().map(|l| simd_json_event(l, &mut buf)).sum()
                }),
                n,
            );
        }
        "slices" => {
            let pools = read_case(&data);
            let n: usize = pools.iter().map(|(d, o)| d.len() + o.len()).sum();
            report(
                "own",
                best_of(rounds, || {
                    let mut s = 0;
                    for (d, o) in &pools {
                        for b in d {
                            s += planner::canon::spec(b).expect("valid spec").key.len();
                        }
                        for b in o {
                            s += planner::canon::observed(b).expect("valid slice").key.len();
                        }
                    }
                    s
                }),
                n,
            );
            report(
                "sonic-rs",
                best_of(rounds, || {
                    let mut s = 0;
                    for (d, o) in &pools {
                        for b in d.iter().chain(o) {
                            let v: sonic_rs::Value = sonic_rs::from_slice(b).expect("valid");
                            s += v.as_object().expect("an object").len();
                        }
                    }
                    s
                }),
                n,
            );
            let mut buf = Vec::new();
            report(
                "simd-json",
                best_of(rounds, || {
                    let mut s = 0;
                    for (d, o) in &pools {
                        for b in d.iter().chain(o) {
                            buf.clear();
                            buf.extend_from_slice(b);
                            let v = simd_json::to_borrowed_value(&mut buf).expect("valid");
                            s += simd_json::prelude::ValueObjectAccess::get(&v, "spec").is_some()
                                as usize;
                        }
                    }
                    s
                }),
                n,
            );
        }
        other => {
            eprintln!("unknown mode {other:?}");
            std::process::exit(2);
        }
    }
}
