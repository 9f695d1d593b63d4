//! Object uids, held inline when they are canonical UUIDs (as the apiserver makes them): the
//! store compares uids on every update, and a heap string there costs a cache miss per event.

#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub enum Uid {
    #[default]
    Empty,
    Uuid(u128),
    Other(Box<str>),
}

impl Uid {
    pub fn parse(s: &str) -> Uid {
        if s.is_empty() {
            return Uid::Empty;
        }
        parse_uuid(s.as_bytes()).map_or_else(|| Uid::Other(s.into()), Uid::Uuid)
    }

    pub fn heap_bytes(&self) -> usize {
        match self {
            Uid::Other(s) => s.len(),
            _ => 0,
        }
    }
}

/// Lowercase 8-4-4-4-12 hex only, so that distinct strings never map to the same number.
fn parse_uuid(b: &[u8]) -> Option<u128> {
    if b.len() != 36 {
        return None;
    }
    let mut v: u128 = 0;
    for (i, &c) in b.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | u128::from(d);
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_uuids_are_inline_others_kept_verbatim() {
        let a = Uid::parse("0a1b2c3d-0000-4000-8000-00000000abcd");
        assert!(matches!(a, Uid::Uuid(_)));
        assert_eq!(a, Uid::parse("0a1b2c3d-0000-4000-8000-00000000abcd"));
        assert_ne!(a, Uid::parse("0a1b2c3d-0000-4000-8000-00000000abce"));
        assert_eq!(
            Uid::parse("0A1B2C3D-0000-4000-8000-00000000ABCD"),
            Uid::Other("0A1B2C3D-0000-4000-8000-00000000ABCD".into())
        );
        assert_eq!(Uid::parse(""), Uid::Empty);
        assert_eq!(Uid::parse("u1"), Uid::Other("u1".into()));
    }
}
