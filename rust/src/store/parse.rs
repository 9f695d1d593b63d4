//! Extraction of what the store needs from watch events and List pages, in one validating pass.

use std::borrow::Cow;

use crate::json::{Result, Scanner};

#[derive(Default)]
pub struct Meta<'a> {
    pub namespace: Option<Cow<'a, str>>,
    pub name: Option<Cow<'a, str>>,
    pub uid: Option<Cow<'a, str>>,
    pub resource_version: Option<Cow<'a, str>>,
}

/// One object: its byte span in the scanned buffer plus the fields the store keys on.
#[derive(Default)]
pub struct Head<'a> {
    pub start: usize,
    pub end: usize,
    pub meta: Meta<'a>,
    pub has_kind: bool,
    pub has_api_version: bool,
    pub status: Status,
}

/// The fields of a `Status` object (the payload of an ERROR event).
#[derive(Default)]
pub struct Status {
    pub code: i64,
    pub reason: String,
    pub message: String,
}

pub struct Keyed<'a> {
    pub namespace: Cow<'a, str>,
    pub name: Cow<'a, str>,
    pub uid: Cow<'a, str>,
    pub resource_version: Cow<'a, str>,
}

impl<'a> Head<'a> {
    /// The identity the store needs; objects without a name or resourceVersion are malformed.
    pub fn keyed(&self) -> Result<Keyed<'a>> {
        let name = match &self.meta.name {
            Some(n) if !n.is_empty() => n.clone(),
            _ => return Err("object has no metadata.name".into()),
        };
        let resource_version = match &self.meta.resource_version {
            Some(rv) if !rv.is_empty() => rv.clone(),
            _ => return Err(format!("object {name:?} has no metadata.resourceVersion")),
        };
        let namespace = self.meta.namespace.clone().unwrap_or(Cow::Borrowed(""));
        if name.contains('/') || namespace.contains('/') {
            return Err(format!(
                "object name {name:?} or namespace {namespace:?} contains '/'"
            ));
        }
        Ok(Keyed {
            namespace,
            name,
            uid: self.meta.uid.clone().unwrap_or(Cow::Borrowed("")),
            resource_version,
        })
    }
}

fn metadata<'a>(sc: &mut Scanner<'a>, meta: &mut Meta<'a>) -> Result<()> {
    if sc.peek() == Some(b'n') {
        return sc.skip_value();
    }
    sc.object(|sc, key| {
        match key {
            b"name" => meta.name = sc.opt_string()?,
            b"namespace" => meta.namespace = sc.opt_string()?,
            b"uid" => meta.uid = sc.opt_string()?,
            b"resourceVersion" => meta.resource_version = sc.opt_string()?,
            _ => sc.skip_value()?,
        }
        Ok(())
    })
}

/// Scans one object value; with `status`, also reads the Status fields (code, reason, message).
pub fn head<'a>(sc: &mut Scanner<'a>, status: bool) -> Result<Head<'a>> {
    let mut h = Head::default();
    if sc.peek() != Some(b'{') {
        return Err(format!("expected a JSON object at byte {}", sc.pos));
    }
    h.start = sc.pos;
    sc.object(|sc, key| {
        match key {
            b"metadata" => metadata(sc, &mut h.meta)?,
            b"kind" => {
                h.has_kind = true;
                sc.skip_value()?;
            }
            b"apiVersion" => {
                h.has_api_version = true;
                sc.skip_value()?;
            }
            b"code" if status => h.status.code = sc.integer()?,
            b"reason" if status => {
                h.status.reason = sc.opt_string()?.unwrap_or_default().into_owned()
            }
            b"message" if status => {
                h.status.message = sc.opt_string()?.unwrap_or_default().into_owned()
            }
            _ => sc.skip_value()?,
        }
        Ok(())
    })?;
    h.end = sc.pos;
    Ok(h)
}

pub enum Event<'a> {
    Upsert(Head<'a>),
    Delete(Head<'a>),
    Bookmark(Option<Cow<'a, str>>),
    Error(Status),
}

/// Parses one watch event line: `{"type": ..., "object": {...}}`.
pub fn event(line: &[u8]) -> Result<Event<'_>> {
    let mut sc = Scanner::new(line)?;
    let mut ty: Option<Cow<'_, str>> = None;
    let mut obj: Option<Head<'_>> = None;
    sc.object(|sc, key| {
        match key {
            b"type" => ty = Some(sc.string()?),
            b"object" => {
                let is_error = ty.as_deref() == Some("ERROR");
                obj = Some(head(sc, is_error)?);
            }
            _ => sc.skip_value()?,
        }
        Ok(())
    })?;
    sc.end()?;
    let ty = ty.ok_or("event has no type")?;
    let mut obj = obj.ok_or_else(|| format!("{ty} event has no object"))?;
    match ty.as_ref() {
        "ADDED" | "MODIFIED" => Ok(Event::Upsert(obj)),
        "DELETED" => Ok(Event::Delete(obj)),
        "BOOKMARK" => Ok(Event::Bookmark(obj.meta.resource_version)),
        "ERROR" => {
            if obj.status.code == 0 && obj.status.reason.is_empty() {
                // "object" came before "type": read the Status fields now.
                // SAFETY: `line` was checked to be UTF-8 above, and `obj.end` follows the
                // object's closing brace, a character boundary.
                let mut sc = unsafe { Scanner::new_checked(&line[..obj.end], obj.start) };
                obj = head(&mut sc, true)?;
            }
            Ok(Event::Error(obj.status))
        }
        other => Err(format!("unknown event type {other:?}")),
    }
}

pub struct Page<'a> {
    pub kind: Option<Cow<'a, str>>,
    pub api_version: Option<Cow<'a, str>>,
    pub resource_version: Option<Cow<'a, str>>,
    pub items: Vec<Head<'a>>,
}

/// Parses a List body. Any invalid JSON rejects the whole page; item-level problems (missing
/// metadata) are left to the caller so one bad item does not hide the others.
pub fn page(body: &[u8]) -> Result<Page<'_>> {
    let mut sc = Scanner::new(body)?;
    let mut p = Page {
        kind: None,
        api_version: None,
        resource_version: None,
        items: Vec::new(),
    };
    sc.object(|sc, key| {
        match key {
            b"kind" => p.kind = sc.opt_string()?,
            b"apiVersion" => p.api_version = sc.opt_string()?,
            b"metadata" => {
                let mut m = Meta::default();
                metadata(sc, &mut m)?;
                p.resource_version = m.resource_version;
            }
            b"items" => {
                if sc.peek() == Some(b'n') {
                    sc.skip_value()?;
                } else {
                    sc.array(|sc| {
                        p.items.push(head(sc, false)?);
                        Ok(())
                    })?;
                }
            }
            _ => sc.skip_value()?,
        }
        Ok(())
    })?;
    sc.end()?;
    Ok(p)
}

/// The bytes of a List item as a standalone object: List items omit `kind` and `apiVersion`,
/// which watch events carry, so they are spliced in to make both sources store the same shape.
pub fn item_bytes(body: &[u8], h: &Head<'_>, kind: &str, api_version: &str) -> Box<[u8]> {
    let raw = &body[h.start..h.end];
    let add_kind = !h.has_kind && !kind.is_empty();
    let add_api = !h.has_api_version && !api_version.is_empty();
    if !add_kind && !add_api {
        return raw.into();
    }
    let mut out = Vec::with_capacity(raw.len() + kind.len() + api_version.len() + 32);
    out.push(b'{');
    let mut fields = Vec::new();
    if add_kind {
        fields.push(format!("\"kind\":{}", quote(kind)));
    }
    if add_api {
        fields.push(format!("\"apiVersion\":{}", quote(api_version)));
    }
    out.extend_from_slice(fields.join(",").as_bytes());
    let rest = &raw[1..];
    let empty = rest.iter().find(|c| !c.is_ascii_whitespace()) == Some(&b'}');
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    out.into_boxed_slice()
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events() {
        let line = br#"{"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a","namespace":"n","uid":"u1","resourceVersion":"5","labels":{"x":"y"}},"data":{}}}"#;
        match event(line).unwrap() {
            Event::Upsert(h) => {
                let k = h.keyed().unwrap();
                assert_eq!(
                    (&*k.namespace, &*k.name, &*k.uid, &*k.resource_version),
                    ("n", "a", "u1", "5")
                );
                assert!(line[h.start..h.end].starts_with(b"{\"kind\""));
                assert!(line[h.start..h.end].ends_with(b"{}}"));
            }
            _ => panic!("not an upsert"),
        }
        let err = br#"{"object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"},"type":"ERROR"}"#;
        match event(err).unwrap() {
            Event::Error(s) => assert_eq!((s.code, &*s.reason), (410, "Expired")),
            _ => panic!("not an error"),
        }
        assert!(event(br#"{"type":"ADDED","object":{"metadata":{}}}"#).is_ok());
        assert!(event(br#"{"type":"ADDED","object":[]}"#).is_err());
        assert!(event(br#"{"type":"NOPE","object":{}}"#).is_err());
    }

    #[test]
    fn splices_kind_into_list_items() {
        let body = br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"a","resourceVersion":"3"}},{}]}"#;
        let p = page(body).unwrap();
        assert_eq!(p.items.len(), 2);
        let b = item_bytes(body, &p.items[0], "ConfigMap", "v1");
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"3"}}"#
        );
        let b = item_bytes(body, &p.items[1], "ConfigMap", "v1");
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"kind":"ConfigMap","apiVersion":"v1"}"#
        );
    }
}
