//! The store proper: objects keyed by namespace/name, local-write overrides, and the coalesced
//! "changed since the last drain" set. No Python here, so it can run with the GIL released.
//!
//! Deltas are not accumulated event by event; the store remembers what the consumer was last
//! shown for each key (`Shown`) and marks keys dirty. At drain time the difference between the
//! shown state and the current state *is* the coalesced delta, which gives the algebra
//! (add+update = add, add+delete = nothing, update+delete = delete, delete+add = update) and
//! "no delta for an unchanged resourceVersion" by construction.

use rustc_hash::FxHashSet;

use super::keymap::{prefetch, Key, KeyMap};
use super::parse::{self, Event, Keyed};
use super::rv::Rv;
use super::uid::Uid;

pub struct Obj {
    pub uid: Uid,
    pub rv: Rv,
    /// With a little spare capacity, so most updates overwrite the buffer in place.
    pub raw: Vec<u8>,
}

/// Allocation granule of object buffers: updates that grow by less than this reuse the buffer
/// (saving a malloc/free pair per event) for at most this much slack per object.
const RAW_GRANULE: usize = 64;

fn new_raw(raw: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(raw.len().div_ceil(RAW_GRANULE) * RAW_GRANULE);
    v.extend_from_slice(raw);
    v
}

enum Local {
    /// A write's result, shown until the watch reports the same or a newer resourceVersion.
    Upsert(Obj, f64),
    /// A delete: hides the object until the watch confirms, unless the watch shows a newer
    /// object with another uid (someone re-created it).
    Tombstone { uid: Uid, rv: Rv, deadline: f64 },
}

impl Local {
    fn deadline(&self) -> f64 {
        match self {
            Local::Upsert(_, d) => *d,
            Local::Tombstone { deadline, .. } => *deadline,
        }
    }
}

/// What the consumer saw at the last drain.
#[derive(Clone, PartialEq)]
pub enum Shown {
    Absent,
    /// Shown at this resourceVersion; the uid tells a re-created object from an updated one.
    Visible(Rv, Uid),
    /// Present but excluded by the predicate (or rejected) at this resourceVersion.
    Excluded(Rv),
}

impl Shown {
    /// The consumer's filter has already answered for the object at `rv`.
    fn judged(&self, rv: &Rv) -> bool {
        match self {
            Shown::Visible(s, _) | Shown::Excluded(s) => s == rv,
            Shown::Absent => false,
        }
    }
}

/// Another object under the same name (deleted and re-created between two drains). An empty uid
/// is unknown, not different: only two known uids can tell.
fn replaced(shown: &Uid, now: &Uid) -> bool {
    *shown != Uid::Empty && *now != Uid::Empty && shown != now
}

struct Entry {
    watch: Option<Obj>,
    local: Option<Box<Local>>,
    shown: Shown,
    dirty: bool,
    /// The relist generation in which the watch last reported this key.
    seen: u32,
}

impl Entry {
    fn new() -> Self {
        Entry {
            watch: None,
            local: None,
            shown: Shown::Absent,
            dirty: false,
            seen: 0,
        }
    }

    fn effective(&self) -> Option<&Obj> {
        match self.local.as_deref() {
            Some(Local::Upsert(o, _)) => Some(o),
            Some(Local::Tombstone { .. }) => None,
            None => self.watch.as_ref(),
        }
    }

    fn effective_rv(&self) -> Option<Rv> {
        self.effective().map(|o| o.rv.clone())
    }

    fn is_dead(&self) -> bool {
        self.watch.is_none() && self.local.is_none() && self.shown == Shown::Absent && !self.dirty
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeltaKind {
    Add = 0,
    Update = 1,
    Delete = 2,
}

/// The verdict of the consumer's filter on one object.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Include,
    Exclude,
    /// The object could not be accepted (e.g. it does not decode): keep showing the last good one.
    Reject,
}

/// A parsed event line waiting to be applied, with the hash of its key (when it has one).
struct Pending<'a> {
    line: &'a [u8],
    ev: Result<Event<'a>, String>,
    hash: Option<u64>,
}

#[derive(Default)]
pub struct FeedOutcome {
    pub resource_version: Option<String>,
    pub error: Option<parse::Status>,
    pub events: usize,
    pub malformed: Vec<String>,
}

#[derive(Default)]
pub struct ListOutcome {
    pub items: usize,
    pub malformed: Vec<String>,
}

/// Joins namespace and name; neither may contain '/', so the key is unambiguous.
pub fn make_key(buf: &mut String, namespace: &str, name: &str) {
    buf.clear();
    buf.push_str(namespace);
    buf.push('/');
    buf.push_str(name);
}

pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

type Map = KeyMap<Entry>;

/// Bookkeeping kept beside the map, so a mutation can hold one `&mut Entry` (one hash lookup
/// per event) while updating it.
#[derive(Default)]
struct Book {
    dirty: Vec<Key>,
    locals: FxHashSet<Key>,
    raw_bytes: usize,
}

impl Book {
    /// Marks `key` dirty if what it shows changed; returns true if the entry is now dead and
    /// should be removed.
    fn mark(&mut self, key: &str, e: &mut Entry, before: Option<Rv>) -> bool {
        if e.effective_rv() == before {
            return e.is_dead();
        }
        if !e.dirty {
            e.dirty = true;
            self.dirty.push(key.into());
        }
        false
    }

    fn set_watch(&mut self, e: &mut Entry, obj: Option<Obj>) {
        self.raw_bytes += obj.as_ref().map_or(0, |o| o.raw.capacity());
        let old = std::mem::replace(&mut e.watch, obj);
        self.raw_bytes -= old.as_ref().map_or(0, |o| o.raw.capacity());
    }

    fn set_local(&mut self, key: &str, e: &mut Entry, local: Option<Local>) {
        let sz = |l: &Option<Box<Local>>| match l.as_deref() {
            Some(Local::Upsert(o, _)) => o.raw.capacity(),
            _ => 0,
        };
        self.raw_bytes -= sz(&e.local);
        let had = e.local.is_some();
        e.local = local.map(Box::new);
        self.raw_bytes += sz(&e.local);
        match (had, e.local.is_some()) {
            (false, true) => {
                self.locals.insert(key.into());
            }
            (true, false) => {
                self.locals.remove(key);
            }
            _ => {}
        }
    }
}

#[derive(Default)]
pub struct Table {
    map: Map,
    book: Book,
    /// A partial event line carried over from the previous chunk.
    partial: Vec<u8>,
    generation: u32,
    /// A list page failed to parse during the current relist: skip the vanish sweep.
    list_poisoned: bool,
    keybuf: String,
}

impl Table {
    pub fn new() -> Self {
        Table::default()
    }

    pub fn watch_upsert(&mut self, key: &str, uid: Uid, rv: Rv, raw: &[u8]) {
        let generation = self.generation;
        let e = self.map.get_or_insert_with(key, Entry::new);
        e.seen = generation;
        if e.watch.as_ref().is_some_and(|w| w.rv == rv) {
            return;
        }
        // An update reuses the held buffer when the new version fits.
        let buf = match e.watch.as_mut() {
            Some(w) if w.raw.capacity() >= raw.len() => {
                let mut b = std::mem::take(&mut w.raw);
                self.book.raw_bytes -= b.capacity();
                b.clear();
                b.extend_from_slice(raw);
                self.book.raw_bytes += b.capacity();
                b
            }
            _ => new_raw(raw),
        };
        let obj = Obj { uid, rv, raw: buf };
        let before = e.effective_rv();
        let drop_local = match e.local.as_deref() {
            Some(Local::Upsert(l, _)) => obj.rv.supersedes(&l.rv),
            Some(Local::Tombstone { uid, rv, .. }) => *uid != obj.uid && obj.rv.newer_than(rv),
            None => false,
        };
        self.book.set_watch(e, Some(obj));
        if drop_local {
            self.book.set_local(key, e, None);
        }
        if self.book.mark(key, e, before) {
            self.map.remove(key);
        }
    }

    /// The watch (or a relist) says the key is gone; `rv` is the deletion's resourceVersion.
    pub fn watch_delete(&mut self, key: &str, rv: &Rv) {
        let Some(e) = self.map.get_mut(key) else {
            return;
        };
        let before = e.effective_rv();
        let drop_local = match e.local.as_deref() {
            Some(Local::Upsert(l, _)) => rv.supersedes(&l.rv),
            Some(Local::Tombstone { .. }) => true,
            None => false,
        };
        self.book.set_watch(e, None);
        if drop_local {
            self.book.set_local(key, e, None);
        }
        if self.book.mark(key, e, before) {
            self.map.remove(key);
        }
    }

    pub fn local_upsert(&mut self, key: &str, obj: Obj, deadline: f64) -> bool {
        let e = self.map.get_or_insert_with(key, Entry::new);
        let stale = e
            .watch
            .as_ref()
            .is_some_and(|w| !obj.rv.newer_than_local(&w.rv))
            || matches!(e.local.as_deref(), Some(Local::Upsert(l, _)) if !obj.rv.newer_than_local(&l.rv));
        if stale {
            if e.is_dead() {
                self.map.remove(key);
            }
            return false;
        }
        let before = e.effective_rv();
        self.book
            .set_local(key, e, Some(Local::Upsert(obj, deadline)));
        self.book.mark(key, e, before);
        true
    }

    pub fn local_delete(&mut self, key: &str, deadline: f64) -> bool {
        let Some(e) = self.map.get_mut(key) else {
            return false;
        };
        let Some(cur) = e.effective() else {
            return false;
        };
        let tomb = Local::Tombstone {
            uid: cur.uid.clone(),
            rv: cur.rv.clone(),
            deadline,
        };
        let before = e.effective_rv();
        self.book.set_local(key, e, Some(tomb));
        self.book.mark(key, e, before);
        true
    }

    /// Drops local overrides the watch never confirmed; returns how many.
    pub fn expire(&mut self, now: f64) -> usize {
        if self.book.locals.is_empty() {
            return 0;
        }
        let expired: Vec<Key> = self
            .book
            .locals
            .iter()
            .filter(|k| {
                self.map
                    .get(k)
                    .and_then(|e| e.local.as_deref())
                    .is_some_and(|l| l.deadline() <= now)
            })
            .cloned()
            .collect();
        for key in &expired {
            let e = self.map.get_mut(key).expect("local entries exist");
            let before = e.effective_rv();
            self.book.set_local(key, e, None);
            if self.book.mark(key, e, before) {
                self.map.remove(key);
            }
        }
        expired.len()
    }

    pub fn feed(&mut self, chunk: &[u8]) -> FeedOutcome {
        let mut out = FeedOutcome::default();
        let mut rest = chunk;
        if !self.partial.is_empty() {
            match memchr::memchr(b'\n', rest) {
                None => {
                    self.partial.extend_from_slice(rest);
                    return out;
                }
                Some(i) => {
                    let mut line = std::mem::take(&mut self.partial);
                    line.extend_from_slice(&rest[..i]);
                    rest = &rest[i + 1..];
                    if self.line(&line, &mut out) {
                        return out;
                    }
                }
            }
        }
        // A software pipeline over the complete lines: while event k is parsed, the table slot
        // of event k and the object buffer of event k-1 are prefetched and event k-2 is applied.
        // On a large store each event's slot and buffer are cache misses; this way they are
        // fetched while the CPU parses instead of stalling it.
        let mut key = std::mem::take(&mut self.keybuf);
        let mut older: Option<Pending<'_>> = None;
        let mut newer: Option<Pending<'_>> = None;
        let mut stopped = false;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            let line = &rest[..i];
            rest = &rest[i + 1..];
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let p = self.parse_ahead(line, &mut key);
            if let Some(n) = &newer {
                self.prefetch_buffer(n);
            }
            if let Some(o) = older.take() {
                if self.apply_pending(o, &mut key, &mut out) {
                    stopped = true;
                    break;
                }
            }
            older = newer.replace(p);
        }
        if !stopped {
            for p in [older, newer].into_iter().flatten() {
                if self.apply_pending(p, &mut key, &mut out) {
                    stopped = true;
                    break;
                }
            }
        }
        self.keybuf = key;
        if stopped {
            return out;
        }
        self.partial.extend_from_slice(rest);
        out
    }

    pub fn end_stream(&mut self) {
        self.partial = Vec::new();
    }

    /// Applies one event line; returns true when an ERROR event ends the chunk.
    fn line(&mut self, line: &[u8], out: &mut FeedOutcome) -> bool {
        if line.iter().all(u8::is_ascii_whitespace) {
            return false;
        }
        let mut key = std::mem::take(&mut self.keybuf);
        let p = Pending {
            line,
            ev: parse::event(line),
            hash: None,
        };
        let stop = self.apply_pending(p, &mut key, out);
        self.keybuf = key;
        stop
    }

    /// Parses a line and prefetches the table slot its key probably has.
    #[inline]
    fn parse_ahead<'a>(&self, line: &'a [u8], key: &mut String) -> Pending<'a> {
        let ev = parse::event(line);
        let mut hash = None;
        if let Ok(Event::Upsert(h) | Event::Delete(h)) = &ev {
            if let Some(name) = h.meta.name.as_deref() {
                make_key(key, h.meta.namespace.as_deref().unwrap_or(""), name);
                let hs = self.map.hash(key);
                if let Some(slot) = self.map.probable(hs) {
                    prefetch(std::ptr::from_ref(slot).cast(), size_of_val(slot));
                }
                hash = Some(hs);
            }
        }
        Pending { line, ev, hash }
    }

    /// Prefetches the object buffer an event will overwrite (an update) or free (a delete).
    #[inline]
    fn prefetch_buffer(&self, p: &Pending<'_>) {
        let Some(hash) = p.hash else {
            return;
        };
        let Some((_, e)) = self.map.probable(hash) else {
            return;
        };
        if let Some(w) = &e.watch {
            let len = match &p.ev {
                Ok(Event::Upsert(h)) => (h.end - h.start).min(w.raw.len()),
                _ => 1,
            };
            prefetch(w.raw.as_ptr(), len);
        }
    }

    /// Applies a parsed event; returns true when an ERROR event ends the chunk.
    fn apply_pending(&mut self, p: Pending<'_>, key: &mut String, out: &mut FeedOutcome) -> bool {
        match self.apply_event(p.line, p.ev, key, out) {
            Ok(stop) => stop,
            Err(msg) => {
                out.malformed.push(msg);
                false
            }
        }
    }

    fn apply_event(
        &mut self,
        line: &[u8],
        ev: Result<Event<'_>, String>,
        key: &mut String,
        out: &mut FeedOutcome,
    ) -> Result<bool, String> {
        match ev? {
            Event::Upsert(h) => {
                let k = h.keyed()?;
                make_key(key, &k.namespace, &k.name);
                self.watch_upsert(
                    key,
                    Uid::parse(&k.uid),
                    Rv::parse(&k.resource_version),
                    &line[h.start..h.end],
                );
                set_rv(&mut out.resource_version, &k.resource_version);
            }
            Event::Delete(h) => {
                let k = h.keyed()?;
                let rv = Rv::parse(&k.resource_version);
                make_key(key, &k.namespace, &k.name);
                self.watch_delete(key, &rv);
                set_rv(&mut out.resource_version, &k.resource_version);
            }
            Event::Bookmark(rv) => {
                if let Some(rv) = rv.filter(|rv| !rv.is_empty()) {
                    set_rv(&mut out.resource_version, &rv);
                }
            }
            Event::Error(status) => {
                out.error = Some(status);
                // Bytes after an ERROR event belong to a stream the server is closing.
                self.partial = Vec::new();
                return Ok(true);
            }
        }
        out.events += 1;
        Ok(false)
    }

    fn keyed_upsert(&mut self, k: &Keyed<'_>, raw: &[u8]) {
        let mut key = std::mem::take(&mut self.keybuf);
        make_key(&mut key, &k.namespace, &k.name);
        self.watch_upsert(
            &key,
            Uid::parse(&k.uid),
            Rv::parse(&k.resource_version),
            raw,
        );
        self.keybuf = key;
    }

    pub fn begin_list(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.list_poisoned = false;
    }

    pub fn list_page(&mut self, body: &[u8]) -> Result<ListOutcome, String> {
        let page = match parse::page(body) {
            Ok(p) => p,
            Err(e) => {
                self.list_poisoned = true;
                return Err(e);
            }
        };
        let kind = page.kind.as_deref().unwrap_or("");
        let kind = kind.strip_suffix("List").unwrap_or(kind);
        let api_version = page.api_version.as_deref().unwrap_or("");
        let mut out = ListOutcome::default();
        for h in &page.items {
            match h.keyed() {
                Ok(k) => {
                    self.keyed_upsert(&k, &parse::item_bytes(body, h, kind, api_version));
                    out.items += 1;
                }
                Err(e) => {
                    // An item we cannot key might be one we hold: do not sweep on this relist.
                    self.list_poisoned = true;
                    out.malformed.push(e);
                }
            }
        }
        Ok(out)
    }

    /// Ends a relist: whatever the watch had that the list did not show is gone (unless a page
    /// was malformed, in which case nothing is deleted). Returns the number of vanished keys.
    pub fn end_list(&mut self, resource_version: &str) -> usize {
        if self.list_poisoned {
            return 0;
        }
        let generation = self.generation;
        let gone: Vec<Key> = self
            .map
            .iter()
            .filter(|(_, e)| e.watch.is_some() && e.seen != generation)
            .map(|(k, _)| k.clone())
            .collect();
        let rv = Rv::parse(resource_version);
        for key in &gone {
            self.watch_delete(key, &rv);
        }
        gone.len()
    }

    pub fn pending(&self) -> usize {
        self.book.dirty.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.map
            .values()
            .filter(|e| e.effective().is_some())
            .count()
    }

    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.map
            .get(key)
            .and_then(Entry::effective)
            .map(|o| &*o.raw)
    }

    /// Keys shown to the consumer, i.e. visible at the last drain.
    pub fn shown_keys(&self) -> Vec<&str> {
        self.map
            .iter()
            .filter(|(_, e)| matches!(e.shown, Shown::Visible(..)))
            .map(|(k, _)| &**k)
            .collect()
    }

    /// Bytes held: object bytes plus keys and per-entry bookkeeping.
    pub fn memory_usage(&self) -> usize {
        let per_entry = size_of::<Entry>() + size_of::<Box<str>>() + 8;
        self.book.raw_bytes
            + self.map.keys().map(|k| k.len()).sum::<usize>()
            + self.map.capacity() * per_entry
            + self
                .map
                .values()
                .filter_map(|e| e.watch.as_ref())
                .map(|o| o.uid.heap_bytes())
                .sum::<usize>()
    }

    /// The dirty keys whose current object needs the consumer's verdict (present, and not the
    /// resourceVersion already judged).
    pub fn to_judge(&self) -> Vec<(&str, &[u8])> {
        self.book
            .dirty
            .iter()
            .filter_map(|k| {
                let e = self.map.get(k).expect("dirty entry exists");
                let o = e.effective()?;
                (!e.shown.judged(&o.rv)).then_some((&**k, &*o.raw))
            })
            .collect()
    }

    /// Computes the coalesced deltas for every dirty key and records them as shown.
    /// `verdict` is consulted for each key `to_judge` returned (it must answer for those).
    /// An object shown under one uid and now included under another was deleted and re-created:
    /// it gives a delete (of the one shown) followed by an add, never an update.
    pub fn drain(
        &mut self,
        mut verdict: impl FnMut(&str) -> Verdict,
    ) -> Vec<(DeltaKind, Key, String)> {
        let dirty = std::mem::take(&mut self.book.dirty);
        let mut out = Vec::new();
        for key in dirty {
            let e = self.map.get_mut(&key).expect("dirty entry exists");
            e.dirty = false;
            let next = match e.effective().map(|o| (o.rv.clone(), o.uid.clone())) {
                None => Shown::Absent,
                Some((rv, _)) if e.shown.judged(&rv) => e.shown.clone(),
                Some((rv, uid)) => match verdict(&key) {
                    Verdict::Include => Shown::Visible(rv, uid),
                    Verdict::Exclude => Shown::Excluded(rv),
                    Verdict::Reject => e.shown.clone(),
                },
            };
            match (&e.shown, &next) {
                (Shown::Visible(old, _), Shown::Absent | Shown::Excluded(_)) => {
                    out.push((DeltaKind::Delete, key.clone(), old.to_string()));
                }
                (Shown::Visible(old, was), Shown::Visible(rv, uid)) if *old != *rv => {
                    if replaced(was, uid) {
                        out.push((DeltaKind::Delete, key.clone(), old.to_string()));
                        out.push((DeltaKind::Add, key.clone(), rv.to_string()));
                    } else {
                        out.push((DeltaKind::Update, key.clone(), rv.to_string()));
                    }
                }
                (Shown::Absent | Shown::Excluded(_), Shown::Visible(rv, _)) => {
                    out.push((DeltaKind::Add, key.clone(), rv.to_string()));
                }
                _ => {}
            }
            e.shown = next;
            if e.is_dead() {
                self.map.remove(&key);
            }
        }
        out
    }
}

/// Records the newest resourceVersion, reusing the String (one per chunk, not per event).
fn set_rv(slot: &mut Option<String>, rv: &str) {
    match slot {
        Some(s) => {
            s.clear();
            s.push_str(rv);
        }
        None => *slot = Some(rv.to_owned()),
    }
}

fn make_obj(k: &Keyed<'_>, raw: Vec<u8>) -> Obj {
    Obj {
        uid: Uid::parse(&k.uid),
        rv: Rv::parse(&k.resource_version),
        raw,
    }
}

/// Parses a standalone object (a write's result) for a local override.
pub fn local_obj(raw: &[u8]) -> Result<(String, Obj), String> {
    let mut sc = crate::json::Scanner::new(raw)?;
    let h = parse::head(&mut sc, false)?;
    sc.end()?;
    let k = h.keyed()?;
    let mut key = String::new();
    make_key(&mut key, &k.namespace, &k.name);
    let obj = make_obj(&k, new_raw(raw));
    Ok((key, obj))
}
