//! The crate's one JSON scanner: a validating single pass over RFC 8259 bytes.
//!
//! Both users read a few things out of large documents and must reject malformed ones. The watch
//! store needs, per event, a few metadata strings and the byte span of the object; the planner's
//! canonicaliser (`planner::canon`) writes a canonical form as it reads. A general parser would
//! build a tree or decode twice; this scanner validates every byte once and lets the caller pick
//! out what it wants on the way. The grammar (strings, escapes, numbers, literals, whitespace)
//! lives only here, so the two cannot disagree about what valid JSON is.

use std::borrow::Cow;

/// Deeper nesting than any Kubernetes object has; bounds recursion on hostile input.
const MAX_DEPTH: usize = 256;

pub type Result<T> = std::result::Result<T, String>;

pub struct Scanner<'a> {
    buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Scanner<'a> {
    /// A scanner over a whole document, which must be UTF-8 (RFC 8259): checked once here,
    /// so strings skipped later need no check of their own.
    pub fn new(buf: &'a [u8]) -> Result<Self> {
        if is_ascii(buf) {
            return Ok(Scanner { buf, pos: 0 });
        }
        if let Err(e) = std::str::from_utf8(buf) {
            return Err(format!("invalid UTF-8 at byte {}", e.valid_up_to()));
        }
        Ok(Scanner { buf, pos: 0 })
    }

    /// A scanner over a part of a document that was already checked by `new`.
    ///
    /// # Safety
    /// `buf` must be UTF-8: strings are returned from it without a check of their own.
    pub unsafe fn new_checked(buf: &'a [u8], pos: usize) -> Self {
        Scanner { buf, pos }
    }

    /// The scanned bytes `start..end` (a value the caller has just scanned, say).
    #[inline]
    pub fn span(&self, start: usize, end: usize) -> &'a [u8] {
        &self.buf[start..end]
    }

    /// An error at the current position, in the form every caller reports.
    #[cold]
    #[inline(never)]
    pub fn err<T>(&self, what: &str) -> Result<T> {
        Err(format!("invalid JSON at byte {}: {what}", self.pos))
    }

    #[inline]
    pub fn ws(&mut self) {
        while let Some(&c) = self.buf.get(self.pos) {
            if c == b' ' || c == b'\n' || c == b'\r' || c == b'\t' {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    #[inline]
    pub fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.buf.get(self.pos).copied()
    }

    /// Consumes `c` (after whitespace) if it is next.
    #[inline]
    pub fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    #[inline]
    pub fn expect(&mut self, c: u8) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            self.expected(c)
        }
    }

    #[cold]
    #[inline(never)]
    fn expected(&self, c: u8) -> Result<()> {
        self.err(&format!("expected '{}'", c as char))
    }

    /// After a member or an element of a container that `close` ends: whether a comma follows
    /// (another one comes), or else the container's end (consumed).
    #[inline]
    pub fn comma_or(&mut self, close: u8) -> Result<bool> {
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                Ok(true)
            }
            Some(c) if c == close => {
                self.pos += 1;
                Ok(false)
            }
            _ => self.expected_comma_or(close),
        }
    }

    #[cold]
    #[inline(never)]
    fn expected_comma_or(&self, close: u8) -> Result<bool> {
        self.err(&format!("expected ',' or '{}'", close as char))
    }

    /// After the value that must be the whole document: only whitespace may follow.
    pub fn end(&mut self) -> Result<()> {
        self.ws();
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            self.err("trailing characters")
        }
    }

    /// Scans a string starting at the opening quote; returns the raw contents (between the
    /// quotes) and whether it contains escapes.
    fn raw_string(&mut self) -> Result<(&'a [u8], bool)> {
        if self.peek() != Some(b'"') {
            return self.err("expected string");
        }
        self.pos += 1;
        let start = self.pos;
        let buf = self.buf;
        let mut escaped = false;
        let mut i = self.pos;
        loop {
            let j = find_special(buf, i);
            match buf.get(j) {
                None => {
                    self.pos = buf.len();
                    return self.err("unterminated string");
                }
                Some(b'"') => {
                    self.pos = j + 1;
                    return Ok((&buf[start..j], escaped));
                }
                Some(b'\\') => {
                    escaped = true;
                    i = j + 1;
                    match buf.get(i) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 1,
                        Some(b'u') => {
                            let hex = buf.get(i + 1..i + 5);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                self.pos = i;
                                return self.err("bad \\u escape");
                            }
                            i += 5;
                        }
                        _ => {
                            self.pos = i;
                            return self.err("bad escape");
                        }
                    }
                }
                Some(_) => {
                    self.pos = j;
                    return self.err("control character in string");
                }
            }
        }
    }

    pub fn skip_string(&mut self) -> Result<()> {
        self.raw_string().map(|_| ())
    }

    /// A string value, decoded (borrowed when it has no escapes).
    pub fn string(&mut self) -> Result<Cow<'a, str>> {
        // `at` must be the opening quote, not whitespace before it: the decoder strips it.
        self.ws();
        let at = self.pos;
        let (raw, escaped) = self.raw_string()?;
        if !escaped {
            // SAFETY: `buf` is UTF-8 (checked by `new`, or by the caller of `new_checked`), and
            // `raw` lies between two ASCII quotes, which are character boundaries.
            return Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(raw) }));
        }
        // Rare (Kubernetes names never need escapes): let a full decoder handle the escapes.
        let quoted = &self.buf[at..self.pos];
        decode_escaped(quoted)
            .map(Cow::Owned)
            .ok_or_else(|| format!("invalid string at byte {at}"))
    }

    /// A number (RFC 8259 grammar); returns its text.
    pub fn number(&mut self) -> Result<&'a str> {
        let start = self.pos;
        match number_end(self.buf, start) {
            Ok(end) => {
                self.pos = end;
                // The grammar admits only ASCII, so this never fails.
                std::str::from_utf8(&self.buf[start..end]).or_else(|_| self.err("bad number"))
            }
            Err((at, what)) => {
                self.pos = at;
                self.err(what)
            }
        }
    }

    /// An integer value (for Status.code); other numbers are rejected.
    pub fn integer(&mut self) -> Result<i64> {
        self.ws();
        let start = self.pos;
        self.number()?
            .parse()
            .map_err(|_| format!("expected integer at byte {start}"))
    }

    /// `true`, `false` or `null`, whichever `word` is.
    pub fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.buf[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            self.err("bad literal")
        }
    }

    /// Skips (and validates) one value. Iterative, with an explicit stack of open containers:
    /// values nested in managedFields and the like are many and small, and a call per value
    /// cost more than the scanning.
    pub fn skip_value(&mut self) -> Result<()> {
        // Per open container: true for an object, false for an array.
        let mut stack = [false; MAX_DEPTH];
        let mut depth = 0;
        'value: loop {
            match self.peek() {
                Some(b'"') => self.skip_string()?,
                Some(open @ (b'{' | b'[')) => {
                    let object = open == b'{';
                    self.pos += 1;
                    if !self.eat(if object { b'}' } else { b']' }) {
                        if depth == MAX_DEPTH {
                            return self.err("nesting too deep");
                        }
                        stack[depth] = object;
                        depth += 1;
                        if object {
                            self.skip_string()?;
                            self.expect(b':')?;
                        }
                        continue 'value;
                    }
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => {
                    self.number()?;
                }
                Some(_) => return self.err("unexpected character"),
                None => return self.err("unexpected end of input"),
            }
            // A value ended: close containers until one continues with a comma.
            loop {
                if depth == 0 {
                    return Ok(());
                }
                let in_object = stack[depth - 1];
                match (self.peek(), in_object) {
                    (Some(b','), true) => {
                        self.pos += 1;
                        self.skip_string()?;
                        self.expect(b':')?;
                        continue 'value;
                    }
                    (Some(b','), false) => {
                        self.pos += 1;
                        continue 'value;
                    }
                    (Some(b'}'), true) | (Some(b']'), false) => {
                        self.pos += 1;
                        depth -= 1;
                    }
                    (_, true) => return self.err("expected ',' or '}'"),
                    (_, false) => return self.err("expected ',' or ']'"),
                }
            }
        }
    }

    /// Walks an object; `f` is called with each key and must consume exactly its value.
    pub fn object(&mut self, mut f: impl FnMut(&mut Self, &[u8]) -> Result<()>) -> Result<()> {
        self.expect(b'{')?;
        if self.eat(b'}') {
            return Ok(());
        }
        loop {
            let (key, escaped) = self.raw_string()?;
            if escaped {
                // Escaped keys never name a field we read; keep validating.
                self.expect(b':')?;
                self.skip_value()?;
            } else {
                self.expect(b':')?;
                f(self, key)?;
            }
            if !self.comma_or(b'}')? {
                return Ok(());
            }
        }
    }

    /// Walks an array; `f` is called at each element and must consume it.
    pub fn array(&mut self, mut f: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        self.expect(b'[')?;
        if self.eat(b']') {
            return Ok(());
        }
        loop {
            f(self)?;
            if !self.comma_or(b']')? {
                return Ok(());
            }
        }
    }

    /// `null` or a string.
    pub fn opt_string(&mut self) -> Result<Option<Cow<'a, str>>> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            Ok(None)
        } else {
            self.string().map(Some)
        }
    }
}

/// Where the JSON number starting at `i` ends (RFC 8259 grammar), or where and why it is invalid.
#[inline]
fn number_end(b: &[u8], mut i: usize) -> std::result::Result<usize, (usize, &'static str)> {
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(i),
        _ => return Err((i, "bad number")),
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return Err((i, "bad fraction"));
        }
        i = digits(i);
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return Err((i, "bad exponent"));
        }
        i = digits(i);
    }
    Ok(i)
}

/// Whether every byte is ASCII (then the buffer is UTF-8 without a closer look): most
/// Kubernetes objects are, and this is cheaper than a general UTF-8 check.
#[inline]
fn is_ascii(buf: &[u8]) -> bool {
    let mut chunks = buf.chunks_exact(64);
    let mut acc = 0u64;
    for c in &mut chunks {
        for w in c.chunks_exact(8) {
            acc |= u64::from_ne_bytes(w.try_into().expect("8 bytes"));
        }
    }
    acc & 0x8080_8080_8080_8080 == 0 && chunks.remainder().is_ascii()
}

/// The index of the first byte at or after `i` that ends a run of plain string characters
/// (a quote, a backslash or a control character), or `buf.len()`.
#[inline]
fn find_special(buf: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8,
            _mm_or_si128, _mm_set1_epi8,
        };
        // SAFETY: SSE2 is part of the x86_64 baseline, and every load reads 16 bytes
        // starting at `i` with `i + 16 <= buf.len()` (unaligned loads are allowed).
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            let ctl = _mm_set1_epi8(0x1f);
            while i + 16 <= buf.len() {
                let v = _mm_loadu_si128(buf.as_ptr().add(i).cast::<__m128i>());
                // max(v, 0x1f) == 0x1f exactly for the bytes <= 0x1f (unsigned).
                let special = _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                    _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl),
                );
                let mask = _mm_movemask_epi8(special);
                if mask != 0 {
                    return i + mask.trailing_zeros() as usize;
                }
                i += 16;
            }
        }
    }
    while let Some(&c) = buf.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return i;
        }
        i += 1;
    }
    buf.len()
}

/// Decodes a quoted JSON string with escapes (including surrogate pairs).
fn decode_escaped(quoted: &[u8]) -> Option<String> {
    let inner = std::str::from_utf8(&quoted[1..quoted.len() - 1]).ok()?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            '"' => out.push('"'),
            '\\' => out.push('\\'),
            '/' => out.push('/'),
            'b' => out.push('\u{8}'),
            'f' => out.push('\u{c}'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'u' => {
                let hi = hex4(&mut chars)?;
                let cp = if (0xD800..0xDC00).contains(&hi) {
                    if chars.next()? != '\\' || chars.next()? != 'u' {
                        return None;
                    }
                    let lo = hex4(&mut chars)?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                out.push(char::from_u32(cp)?);
            }
            _ => return None,
        }
    }
    Some(out)
}

fn hex4(chars: &mut std::str::Chars<'_>) -> Option<u32> {
    let mut v = 0;
    for _ in 0..4 {
        v = v * 16 + chars.next()?.to_digit(16)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(s: &str) -> bool {
        let mut sc = Scanner::new(s.as_bytes()).unwrap();
        sc.skip_value().and_then(|_| sc.end()).is_ok()
    }

    #[test]
    fn accepts_valid_documents() {
        for s in [
            r#"{}"#,
            r#"[]"#,
            r#"{"a":[1,-2.5e3,true,false,null,"x\"\u00e9"],"b":{"c":{}}}"#,
            " 0 ",
        ] {
            assert!(valid(s), "{s}");
        }
    }

    #[test]
    fn rejects_invalid_documents() {
        for s in [
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"[1,]"#,
            r#"{"a" 1}"#,
            r#""abc"#,
            r#"01"#,
            r#"1."#,
            r#"tru"#,
            r#"{"a":"\x"}"#,
            "\"a\tb\"",
            r#"{} x"#,
        ] {
            assert!(!valid(s), "{s}");
        }
    }

    #[test]
    fn checks_utf8_past_the_ascii_fast_path() {
        let pad = "x".repeat(70);
        for at in [0, 63, 64, 70] {
            let mut ok = format!("\"{pad}\"").into_bytes();
            ok.splice(at + 1..at + 1, "\u{e9}".bytes());
            assert!(Scanner::new(&ok).is_ok(), "{at}");
            let mut bad = format!("\"{pad}\"").into_bytes();
            bad.insert(at + 1, 0xff);
            assert!(Scanner::new(&bad).is_err(), "{at}");
        }
    }

    #[test]
    fn decodes_escapes() {
        let mut sc = Scanner::new(br#""a\n\u00e9\ud83d\ude00""#).unwrap();
        assert_eq!(sc.string().unwrap(), "a\n\u{e9}\u{1F600}");
    }

    #[test]
    fn decodes_escapes_after_whitespace() {
        // A member's value after `": "`; the decoder once took the space for the opening quote.
        let mut sc = Scanner::new(br#"{"type": "ADD\u0045D"}"#).unwrap();
        let mut ty = None;
        sc.object(|sc, _| {
            ty = Some(sc.string()?.into_owned());
            Ok(())
        })
        .unwrap();
        assert_eq!(ty.as_deref(), Some("ADDED"));
    }

    #[test]
    fn rejects_bad_unicode_escapes() {
        // `\u+041` once passed the planner, whose hex parser took the sign.
        for s in [
            r#""\u+041""#,
            r#""\u00g1""#,
            r#""\ud800""#,
            r#""\ud800\u0041""#,
            r#""\udc00""#,
        ] {
            let mut sc = Scanner::new(s.as_bytes()).unwrap();
            assert!(sc.string().is_err(), "{s}");
        }
    }
}
