//! Kubernetes value rules (`k8s.io/apimachinery/pkg/util/validation`), whole-string matches, as
//! the Python reference (`tests/support/k8s_names.py`) states them; plus Python's `repr` of a
//! string, which every error message uses to quote a name.

use pyo3::prelude::*;
use pyo3::types::PyString;

fn alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` without a length limit.
fn label_shape(s: &[u8]) -> bool {
    match (s.first(), s.last()) {
        (Some(&a), Some(&z)) => {
            alnum_lower(a) && alnum_lower(z) && s.iter().all(|&c| alnum_lower(c) || c == b'-')
        }
        _ => false,
    }
}

/// RFC 1123 label: lowercase alphanumerics and '-', alphanumeric at both ends, <= 63.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && label_shape(s.as_bytes())
}

/// RFC 1123 subdomain of at most `limit` characters.
pub fn is_dns_subdomain(s: &str, limit: usize) -> bool {
    // The pattern is ASCII only, so bytes are characters whenever it matches.
    s.len() <= limit && s.as_bytes().split(|&c| c == b'.').all(label_shape)
}

fn c_identifier(s: &[u8]) -> bool {
    match s.first() {
        Some(&a) if a.is_ascii_alphabetic() || a == b'_' => {
            s.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
        }
        _ => false,
    }
}

/// Python's `str.rpartition("/")`: (before, found, after).
fn rpartition(s: &str) -> (&str, bool, &str) {
    match s.rfind('/') {
        Some(i) => (&s[..i], true, &s[i + 1..]),
        None => ("", false, s),
    }
}

/// A C identifier (<= 32) or `<DNS subdomain <= 63>/<C identifier <= 32>`.
pub fn is_qualified_name(s: &str) -> bool {
    let (domain, sep, ident) = rpartition(s);
    if sep && !is_dns_subdomain(domain, 63) {
        return false;
    }
    ident.len() <= 32 && c_identifier(ident.as_bytes())
}

/// Go's `unicode.ToLower` of one character where it differs from a plain ASCII lowering in a
/// way that matters here: the two non-ASCII characters whose simple lowercase is ASCII.
/// (Python's and Rust's full mapping lower U+0130 to "i" and a combining dot.)
fn go_lower(c: char) -> char {
    match c {
        '\u{130}' => 'i',
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    }
}

/// An attribute or capacity name as kube-apiserver checks it (`validateDriverName` on the
/// domain): at most 63 bytes as written, then a DNS subdomain once lowered the way Go's
/// `strings.ToLower` lowers it (so `GPU.example.com`, a Kelvin sign and U+0130 pass, where
/// a domain of 65 bytes holding a Kelvin sign does not, although it lowers to 63).
pub fn is_device_qualified_name(s: &str) -> bool {
    let (domain, sep, ident) = rpartition(s);
    if !sep {
        return is_qualified_name(s);
    }
    if domain.len() > 63 {
        return false;
    }
    let lowered: String = domain.chars().map(go_lower).collect();
    is_dns_subdomain(&lowered, 63) && ident.len() <= 32 && c_identifier(ident.as_bytes())
}

fn label_name_shape(s: &[u8]) -> bool {
    let ok = |c: u8| c.is_ascii_alphanumeric();
    match (s.first(), s.last()) {
        (Some(&a), Some(&z)) => {
            ok(a)
                && ok(z)
                && s.iter()
                    .all(|&c| ok(c) || c == b'-' || c == b'_' || c == b'.')
        }
        _ => false,
    }
}

/// A label (or taint) key: an optional DNS-subdomain prefix and '/', then a name <= 63.
pub fn is_label_key(s: &str) -> bool {
    let (prefix, sep, name) = rpartition(s);
    if sep && !is_dns_subdomain(prefix, 253) {
        return false;
    }
    name.len() <= 63 && label_name_shape(name.as_bytes())
}

/// A label (or taint) value: empty, or <= 63 alphanumerics, '-', '_', '.' inside.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || (s.len() <= 63 && label_name_shape(s.as_bytes()))
}

fn numeric(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(u8::is_ascii_digit) && (s == b"0" || s[0] != b'0')
}

fn ident_chars(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-')
}

/// Semantic Versioning 2.0.0 (no leading "v").
pub fn is_semver(s: &str) -> bool {
    let b = s.as_bytes();
    let (main, build) = match b.iter().position(|&c| c == b'+') {
        Some(i) => (&b[..i], Some(&b[i + 1..])),
        None => (b, None),
    };
    if let Some(build) = build {
        if !build.split(|&c| c == b'.').all(ident_chars) {
            return false;
        }
    }
    let (core, pre) = match main.iter().position(|&c| c == b'-') {
        Some(i) => (&main[..i], Some(&main[i + 1..])),
        None => (main, None),
    };
    let parts: Vec<&[u8]> = core.split(|&c| c == b'.').collect();
    if parts.len() != 3 || !parts.iter().all(|p| numeric(p)) {
        return false;
    }
    match pre {
        None => true,
        Some(pre) => pre
            .split(|&c| c == b'.')
            .all(|p| ident_chars(p) && (!p.iter().all(u8::is_ascii_digit) || numeric(p))),
    }
}

/// Two ASCII digits at `s[pos..]` (Go's `getnum`; `fixed`: a second digit is required, else
/// one digit is a number too), and where the rest starts.
fn getnum(s: &[u8], pos: usize, fixed: bool) -> Option<(i64, usize)> {
    let digit = |i: usize| {
        s.get(i)
            .filter(|c| c.is_ascii_digit())
            .map(|c| i64::from(c - b'0'))
    };
    let a = digit(pos)?;
    match digit(pos + 1) {
        Some(b) => Some((a * 10 + b, pos + 2)),
        None if fixed => None,
        None => Some((a, pos + 1)),
    }
}

fn days_in(month: i64, year: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Nanoseconds since the epoch of a time as kube-apiserver decodes a `metav1.Time` (Go's
/// `time.Parse(time.RFC3339, s)`), or None where the server answers 400. That parser is
/// laxer than RFC 3339 in places and strict in others: a one-digit hour, a fraction after ','
/// or '.' of any length (cut to nanoseconds), year 0000, offsets up to +-24:00 and minutes up
/// to 60 are taken; a day past the month's end (2024-02-30), hour 24, minute or second 60, an
/// offset hour over 24 or a lowercase 't'/'z' are not.
pub fn parse_rfc3339(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let lit = |pos: usize, c: u8| (b.get(pos) == Some(&c)).then_some(pos + 1);
    if b.len() < 4 || !b[..4].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let year = b[..4]
        .iter()
        .fold(0i64, |y, c| y * 10 + i64::from(c - b'0'));
    let pos = lit(4, b'-')?;
    let (month, pos) = getnum(b, pos, true)?;
    let pos = lit(pos, b'-')?;
    let (day, pos) = getnum(b, pos, true)?;
    let pos = lit(pos, b'T')?;
    let (hour, pos) = getnum(b, pos, false)?;
    let pos = lit(pos, b':')?;
    let (minute, pos) = getnum(b, pos, true)?;
    let pos = lit(pos, b':')?;
    let (second, mut pos) = getnum(b, pos, true)?;
    if !(1..=12).contains(&month) || hour >= 24 || minute >= 60 || second >= 60 {
        return None;
    }
    let mut nanos: i128 = 0;
    if matches!(b.get(pos), Some(b'.' | b',')) && b.get(pos + 1).is_some_and(u8::is_ascii_digit) {
        let start = pos + 1;
        pos = start;
        while b.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        let kept = &b[start..pos.min(start + 9)];
        let digits = kept
            .iter()
            .fold(0i128, |n, c| n * 10 + i128::from(c - b'0'));
        nanos = digits * 10i128.pow(9 - kept.len() as u32);
    }
    let offset = match &b[pos..] {
        [b'Z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hm = [h1, h2, m1, m2];
            if !hm.iter().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let (oh, om) = (
                i64::from(h1 - b'0') * 10 + i64::from(h2 - b'0'),
                i64::from(m1 - b'0') * 10 + i64::from(m2 - b'0'),
            );
            if oh > 24 || om > 60 {
                return None;
            }
            if *sign == b'-' {
                -(oh * 3600 + om * 60)
            } else {
                oh * 3600 + om * 60
            }
        }
        _ => return None,
    };
    if day < 1 || day > days_in(month, year) {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    Some(i128::from(secs) * 1_000_000_000 + nanos)
}

/// A time kube-apiserver takes as a `metav1.Time` (`parse_rfc3339`).
pub fn is_rfc3339(s: &str) -> bool {
    parse_rfc3339(s).is_some()
}

/// Python's `repr()` of a string, exactly: error messages quote names with it.
pub fn repr(s: &str) -> String {
    if !s.is_ascii() {
        // Which characters Python prints as they are is its Unicode database's call: ask it
        // (rare: names are ASCII, and a non-ASCII one is an error being reported).
        return Python::attach(|py| {
            PyString::new(py, s)
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| format!("{s:?}"))
        });
    }
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// SHA-256 (FIPS 180-4) of `data`: the seed name mapping hashes names with it.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known_answers() {
        let hex = |d: [u8; 32]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn names() {
        assert!(is_dns_label("gpu-0"));
        assert!(!is_dns_label("gpu.0"));
        assert!(is_dns_subdomain("gpu.0", 253));
        assert!(!is_dns_subdomain("gpu..0", 253));
        assert!(is_qualified_name("example.com/model"));
        assert!(is_device_qualified_name("GPU.example.com/model"));
        assert!(is_semver("1.0.0-rc.1+b.2"));
        assert!(!is_semver("1.0.0-01"));
        assert!(is_rfc3339("2024-01-02T03:04:05.123Z"));
        assert!(!is_rfc3339("2024-01-02T03:04:05."));
        // Issue 29 item 12: what kube-apiserver 1.37 answers (tests/integration oracle).
        let kelvin = format!("{}\u{212a}/x", "a".repeat(61));
        assert!(
            !is_device_qualified_name(&kelvin),
            "65 bytes, 63 once lowered"
        );
        assert!(is_device_qualified_name(&kelvin[1..]));
        assert!(is_device_qualified_name("\u{130}.com/x"));
        assert!(!is_device_qualified_name("\u{131}.com/x"));
        for bad in [
            "2024-02-30T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:60:00Z",
            "2024-01-01T00:00:60Z",
            "2024-01-01T00:00:00+25:00",
            "2024-01-01T00:00:00+23:61",
            "2024-01-01t00:00:00Z",
            "2024-01-1T00:00:00Z",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
        for good in [
            "2024-01-01T00:00:00.1234567891Z",
            "2024-01-01T00:00:00,5Z",
            "2024-01-01T1:00:00Z",
            "0000-01-01T00:00:00Z",
            "2024-01-01T00:00:00+24:00",
        ] {
            assert!(is_rfc3339(good), "{good}");
        }
        assert_eq!(
            parse_rfc3339("2024-01-01T00:00:00+23:60"),
            parse_rfc3339("2023-12-31T00:00:00Z")
        );
        assert_eq!(repr("it's"), "\"it's\"");
        assert_eq!(repr("a\nb"), "'a\\nb'");
    }
}
