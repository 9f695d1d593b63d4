//! Kubernetes `resource.Quantity`: parsing, value comparison and canonical form.
//!
//! Follows `k8s.io/apimachinery/pkg/api/resource` (`ParseQuantity`, `CanonicalizeBytes`) with
//! exact arithmetic. Values are held as nanos in an `i128`: parsing already rounds up to nano
//! precision, and |v| < 1.7e29 covers every quantity a device can carry. Deliberate deviations,
//! shared with the Python reference: larger DecimalSI/DecimalExponent values are rejected as out
//! of range (BinarySI ones are capped at 2^63-1 as upstream does), exponents must fit an i32
//! (upstream silently truncates them), and DecimalSI values from 1000E are spelled with an
//! exponent (`1e21`; upstream drops the suffix beyond `E`, changing the value: `1000E` is stored
//! as `1`, while `1e21` is stored as sent).

use std::cmp::Ordering;

pub const NANO: i128 = 1_000_000_000;
/// Upstream caps BinarySI quantities at the int64 maximum.
const BINARY_CAP: i128 = (i64::MAX as i128) * NANO;

pub const ERR_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
pub const ERR_SUFFIX: &str = "unable to parse quantity's suffix";
pub const ERR_RANGE: &str = "quantity out of range (magnitude must stay below 1.7e29)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    BinarySI,
    DecimalSI,
    DecimalExponent,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::BinarySI => "BinarySI",
            Format::DecimalSI => "DecimalSI",
            Format::DecimalExponent => "DecimalExponent",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    pub nanos: i128,
    pub format: Format,
}

impl Quantity {
    pub fn cmp_value(&self, other: &Quantity) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

fn err(s: &str, rule: &str) -> String {
    format!("invalid quantity \"{s}\": {rule}")
}

const DEC_SUFFIXES: [(&str, i64); 10] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];
const BIN_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// (base is 2, exponent, format)
fn interpret(suffix: &str) -> Option<(bool, i64, Format)> {
    if let Some(&(_, e)) = DEC_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some((false, e, Format::DecimalSI));
    }
    if let Some(i) = BIN_SUFFIXES[1..].iter().position(|s| *s == suffix) {
        return Some((true, 10 * (i as i64 + 1), Format::BinarySI));
    }
    let b = suffix.as_bytes();
    if b.len() > 1 && (b[0] == b'e' || b[0] == b'E') {
        let rest = &b[1..];
        let (neg, digits) = match rest[0] {
            b'-' => (true, &rest[1..]),
            b'+' => (false, &rest[1..]),
            _ => (false, rest),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let mut v: i64 = 0;
        for &d in digits {
            v = v.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
            if v > i64::from(i32::MAX) + 1 {
                return None;
            }
        }
        let v = if neg { -v } else { v };
        if v > i64::from(i32::MAX) || v < i64::from(i32::MIN) {
            return None;
        }
        return Some((false, v, Format::DecimalExponent));
    }
    None
}

fn is_suffix_letter(c: u8) -> bool {
    b"eEinumkKMGTP".contains(&c)
}

/// A little-endian base-2^32 unsigned integer: just enough to scale long digit strings exactly.
struct Big(Vec<u32>);

impl Big {
    fn mul_add(&mut self, m: u32, a: u32) {
        let mut carry = u64::from(a);
        for limb in self.0.iter_mut() {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
    }
    /// Divides in place; returns whether the remainder was non-zero.
    fn div_rem(&mut self, d: u32) -> bool {
        let mut rem: u64 = 0;
        for limb in self.0.iter_mut().rev() {
            let v = (rem << 32) | u64::from(*limb);
            *limb = (v / u64::from(d)) as u32;
            rem = v % u64::from(d);
        }
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
        rem != 0
    }
    fn to_i128(&self) -> Option<i128> {
        if self.0.len() > 4 {
            return None;
        }
        let mut v: u128 = 0;
        for &limb in self.0.iter().rev() {
            v = (v << 32) | u128::from(limb);
        }
        i128::try_from(v).ok()
    }
}

/// ceil(digits * 2^bin_exp * 10^dec_exp), or None if it does not fit an i128.
fn scale_up(digits: &[u8], bin_exp: i64, dec_exp: i64) -> Option<i128> {
    let len = digits.len() as i64;
    // digits >= 10^(len-1) and 2^bin_exp < 10^19: decide the extremes without big numbers.
    if len - 1 + dec_exp >= 39 {
        return None;
    }
    if dec_exp < 0 && -dec_exp > len + 20 {
        return Some(1);
    }
    // Short inputs (all but pathological ones) fit i128 arithmetic directly.
    if len <= 20 && bin_exp <= 63 && (0..=9).contains(&dec_exp) {
        let mut v: i128 = 0;
        for &d in digits {
            v = v * 10 + i128::from(d - b'0');
        }
        return v
            .checked_mul(1i128 << bin_exp)?
            .checked_mul(10i128.pow(dec_exp as u32));
    }
    let mut big = Big(Vec::new());
    for &d in digits {
        big.mul_add(10, u32::from(d - b'0'));
    }
    let mut b = bin_exp;
    while b > 0 {
        let k = b.min(31);
        big.mul_add(1 << k, 0);
        b -= k;
    }
    let mut inexact = false;
    let mut e = dec_exp;
    while e > 0 {
        let k = e.min(9);
        big.mul_add(10u32.pow(k as u32), 0);
        e -= k;
    }
    while e < 0 {
        let k = (-e).min(9);
        inexact |= big.div_rem(10u32.pow(k as u32));
        e += k;
    }
    let v = big.to_i128()?;
    if inexact {
        v.checked_add(1)
    } else {
        Some(v)
    }
}

/// What kube-apiserver trims around a quantity it decodes from JSON (`Quantity.UnmarshalJSON`
/// takes Go's `strings.TrimSpace` of the raw text between the quotes): Unicode white space,
/// less the control characters JSON escapes (an escaped tab reaches it as `\t` and is refused).
pub fn is_trimmed_space(c: char) -> bool {
    matches!(
        c,
        ' ' | '\u{85}' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

/// A quantity as kube-apiserver reads it from JSON: `ParseQuantity` of the text with the
/// white space around it trimmed (" 1Gi " is 1Gi); errors quote the trimmed text.
pub fn parse(s: &str) -> Result<Quantity, String> {
    let s = s.trim_matches(is_trimmed_space);
    let b = s.as_bytes();
    let end = b.len();
    if end == 0 {
        return Err(err(s, ERR_FORMAT));
    }
    let zero = Quantity {
        nanos: 0,
        format: Format::DecimalSI,
    };
    let mut pos = 0;
    let mut negative = false;
    match b[0] {
        b'-' => {
            negative = true;
            pos = 1;
        }
        b'+' => pos = 1,
        _ => {}
    }
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos == end {
        return Ok(zero);
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = &b[num_start..pos];
    let mut denom: &[u8] = &[];
    if pos < end && b[pos] == b'.' {
        pos += 1;
        let start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &b[start..pos];
    }
    let suffix_start = pos;
    while pos < end && is_suffix_letter(b[pos]) {
        pos += 1;
    }
    if pos < end && (b[pos] == b'-' || b[pos] == b'+') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(err(s, ERR_FORMAT));
    }
    // Only ASCII was consumed up to here, so this slice is on a char boundary.
    let suffix = &s[suffix_start..];
    let (binary, exponent, mut format) = interpret(suffix).ok_or_else(|| err(s, ERR_SUFFIX))?;

    // Trailing zeros of the fraction and leading zeros of the whole do not change the value.
    let mut denom_len = denom.len();
    while denom_len > 0 && denom[denom_len - 1] == b'0' {
        denom_len -= 1;
    }
    let mut digits: Vec<u8> = num.iter().chain(&denom[..denom_len]).copied().collect();
    let lead = digits.iter().take_while(|&&d| d == b'0').count();
    digits.drain(..lead);
    if digits.is_empty() {
        return Ok(zero);
    }
    let (bin_exp, dec_exp) = if binary {
        (exponent, 9 - denom_len as i64)
    } else {
        (0, exponent + 9 - denom_len as i64)
    };
    let mut nanos = match scale_up(&digits, bin_exp, dec_exp) {
        Some(v) => v,
        None if binary => BINARY_CAP,
        None => return Err(err(s, ERR_RANGE)),
    };
    if format == Format::BinarySI {
        nanos = nanos.min(BINARY_CAP);
        if nanos < NANO {
            format = Format::DecimalSI;
        }
    }
    Ok(Quantity {
        nanos: if negative { -nanos } else { nanos },
        format,
    })
}

/// The string upstream's `Quantity.String()` produces for a freshly computed value.
pub fn canonical(q: &Quantity) -> String {
    canonical_as(q, q.format)
}

/// A spelling unique to the value (format ignored): the key for semantic equality.
pub fn value_key(q: &Quantity) -> String {
    canonical_as(q, Format::DecimalSI)
}

/// (m, e) with nanos = m * 10^(e + 9) and m not divisible by 10; i64 division when it fits,
/// because i128 division is a slow library call.
fn strip_tens(nanos: i128) -> (i128, i64) {
    let mut e: i64 = -9;
    if let Ok(mut m) = i64::try_from(nanos) {
        while m % 10 == 0 {
            m /= 10;
            e += 1;
        }
        return (i128::from(m), e);
    }
    let mut m = nanos;
    while m % 10 == 0 {
        m /= 10;
        e += 1;
    }
    (m, e)
}

fn canonical_as(q: &Quantity, format: Format) -> String {
    if q.nanos == 0 {
        return "0".to_owned();
    }
    let mut format = format;
    if format == Format::BinarySI && (q.nanos.abs() < 1024 * NANO || q.nanos % NANO != 0) {
        format = Format::DecimalSI;
    }
    if format == Format::BinarySI {
        let mut v = q.nanos / NANO;
        let mut k = 0;
        while v % 1024 == 0 {
            v /= 1024;
            k += 1;
        }
        return format!("{v}{}", BIN_SUFFIXES[k]);
    }
    let (mut m, mut e) = strip_tens(q.nanos);
    while e.rem_euclid(3) != 0 {
        m *= 10;
        e -= 1;
    }
    if format == Format::DecimalExponent || e > 18 {
        // Beyond E a suffix would not exist: kube-apiserver drops it and stores another value
        // (1000E is stored as 1), so such a value is spelled with an exponent, stored as sent.
        return if e == 0 {
            m.to_string()
        } else {
            format!("{m}e{e}")
        };
    }
    let suffix = DEC_SUFFIXES
        .iter()
        .find(|(_, x)| *x == e)
        .map_or("", |(s, _)| *s);
    format!("{m}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        canonical(&parse(s).unwrap())
    }

    #[test]
    fn upstream_examples() {
        for (i, o) in [
            ("1024Mi", "1Gi"),
            ("1000M", "1G"),
            ("1.5Gi", "1536Mi"),
            (".001Ki", "1024m"),
            ("1.5", "1500m"),
            ("1000m", "1"),
            ("1000", "1k"),
            ("1073741824", "1073741824"),
            ("1e3", "1e3"),
            ("0", "0"),
            ("-1.5", "-1500m"),
            (".000000000001Ki", "2n"),
            ("8Ei", "9223372036854775807"),
            ("1000E", "1e21"),
            ("1500E", "1500E"),
            ("-2000E", "-2e21"),
        ] {
            assert_eq!(canon(i), o, "{i}");
        }
    }

    #[test]
    fn errors() {
        for s in [
            "",
            "abc",
            "1.2.3",
            "1Kb",
            "1e",
            "1\t",
            "  ",
            "1 2",
            "1e99999999999",
            "1e40",
        ] {
            assert!(parse(s).is_err(), "{s}");
        }
        // Trimmed as kube-apiserver trims the raw JSON text (issue 29 item 12).
        assert_eq!(canon(" 1Gi "), "1Gi");
        assert_eq!(canon("\u{a0}1"), "1");
    }

    #[test]
    fn values() {
        assert_eq!(
            parse("1Gi").unwrap().nanos,
            parse("1073741824").unwrap().nanos
        );
        assert_eq!(value_key(&parse("1Gi").unwrap()), "1073741824");
    }
}
