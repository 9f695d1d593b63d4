//! resourceVersions: opaque strings by contract, etcd revisions (decimal integers) in practice.
//!
//! Ordering is only defined when both sides are canonical decimal integers; otherwise the only
//! relation is equality, and the watch (the source of truth) wins any comparison it cannot make.

use std::fmt;

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Rv {
    Num(u64),
    Str(Box<str>),
}

impl Rv {
    pub fn parse(s: &str) -> Rv {
        // Only canonical decimals are numbers, so "07" and "7" stay distinct as strings.
        let canonical = !s.is_empty()
            && s.bytes().all(|c| c.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        match s.parse::<u64>() {
            Ok(n) if canonical => Rv::Num(n),
            _ => Rv::Str(s.into()),
        }
    }

    /// A watch object at `self` replaces a local override at `local`: the watch caught up.
    pub fn supersedes(&self, local: &Rv) -> bool {
        match (self, local) {
            (Rv::Num(a), Rv::Num(b)) => a >= b,
            _ => true,
        }
    }

    /// A local write at `self` is newer than what the store holds at `held`.
    pub fn newer_than_local(&self, held: &Rv) -> bool {
        match (self, held) {
            (Rv::Num(a), Rv::Num(b)) => a > b,
            (a, b) => a != b,
        }
    }

    /// Strictly newer, when an order is known; unordered values count as newer.
    pub fn newer_than(&self, other: &Rv) -> bool {
        match (self, other) {
            (Rv::Num(a), Rv::Num(b)) => a > b,
            _ => true,
        }
    }
}

impl fmt::Display for Rv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rv::Num(n) => write!(f, "{n}"),
            Rv::Str(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_numbers_only() {
        assert_eq!(Rv::parse("12"), Rv::Num(12));
        assert_eq!(Rv::parse("012"), Rv::Str("012".into()));
        assert!(Rv::parse("12").supersedes(&Rv::parse("12")));
        assert!(!Rv::parse("11").supersedes(&Rv::parse("12")));
        assert!(Rv::parse("a").supersedes(&Rv::parse("12")));
        assert!(!Rv::parse("a").newer_than_local(&Rv::parse("a")));
        assert!(Rv::parse("b").newer_than_local(&Rv::parse("a")));
    }
}
