//! A JSON body's parameters: every value of one top-level key, as Grape's JSON
//! parser reads them.
//!
//! Runners' bodies are small objects of plain ASCII strings: [`scan`] reads those
//! without building anything, and stops at the first thing it does not know for
//! certain (an escape, a byte past ASCII, a number or another type where the
//! token is, a deep nesting, anything that is not JSON). serde_json then reads the
//! body again and decides, so the scan never gives an answer the parser would not
//! (`tests`: every one-byte change of a set of bodies, both ways).

use super::Malformed;

/// Every value of top-level key `name` of a JSON object body, in order (a key
/// repeated in the object counts each time; Ruby's parser keeps the last). A string
/// is taken as it is, a number as its text (Grape coerces it); `null` is absent; an
/// array, object or boolean is not a string. A body that is JSON but not an object
/// has no parameters (Grape merges only hashes).
pub fn json_values(body: &[u8], name: &str, out: &mut Vec<String>) -> Result<(), Malformed> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let before = out.len();
    if scan(body, name.as_bytes(), out).is_some() {
        return Ok(());
    }
    out.truncate(before);
    parse(body, name, out)
}

/// The parser's reading: serde_json, keys compared without a copy.
fn parse(body: &[u8], name: &str, out: &mut Vec<String>) -> Result<(), Malformed> {
    use serde::de::{DeserializeSeed, Deserializer as _, IgnoredAny, MapAccess, Visitor};

    struct Collect<'a> {
        name: &'a str,
        out: &'a mut Vec<String>,
    }

    impl<'de> Visitor<'de> for Collect<'_> {
        type Value = Result<(), Malformed>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut verdict = Ok(());
            while let Some(is_name) = map.next_key_seed(KeyIs(self.name))? {
                if is_name {
                    match map.next_value::<serde_json::Value>()? {
                        serde_json::Value::String(s) if !s.is_empty() => self.out.push(s),
                        serde_json::Value::String(_) | serde_json::Value::Null => {}
                        serde_json::Value::Number(n) => self.out.push(n.to_string()),
                        _ => verdict = Err(Malformed::NotAString(self.name.to_owned())),
                    }
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(verdict)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Ok(()))
        }

        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Ok(()))
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Ok(()))
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Ok(()))
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Ok(()))
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Ok(()))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Ok(()))
        }
    }

    /// Whether a key is `name`, read without a copy of it (an escaped key is
    /// compared once unescaped, as Ruby's parser reads it).
    struct KeyIs<'a>(&'a str);

    impl<'de> Visitor<'de> for KeyIs<'_> {
        type Value = bool;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object key")
        }

        fn visit_str<E>(self, key: &str) -> Result<bool, E> {
            Ok(key == self.0)
        }
    }

    impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
        type Value = bool;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }

    impl<'de> DeserializeSeed<'de> for Collect<'_> {
        type Value = Result<(), Malformed>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    let mut de = serde_json::Deserializer::from_slice(body);
    let verdict = (&mut de)
        .deserialize_any(Collect { name, out })
        .map_err(|_| Malformed::Json)?;
    de.end().map_err(|_| Malformed::Json)?;
    verdict
}

/// Deepest nesting [`scan`] follows (serde_json's own limit is 128).
const MAX_DEPTH: usize = 64;

/// The values of `name` in a body of the plain kind: an object whose strings are
/// printable ASCII without escapes, the values of `name` strings or `null`. `None`:
/// not such a body, for the parser to read (values pushed so far are void).
fn scan(body: &[u8], name: &[u8], out: &mut Vec<String>) -> Option<()> {
    let mut s = Scan { b: body, i: 0 };
    s.ws();
    s.expect(b'{')?;
    s.items(b'}', |s| {
        if s.key()? != name {
            return s.value(0);
        }
        match s.peek()? {
            b'"' => {
                let value = s.string()?;
                if !value.is_empty() {
                    out.push(std::str::from_utf8(value).ok()?.to_owned());
                }
                Some(())
            }
            b'n' => s.literal(b"null"),
            _ => None,
        }
    })?;
    s.ws();
    (s.i == body.len()).then_some(())
}

/// Where the first byte of `s` that ends a plain string is: a quote, a backslash,
/// or a byte outside printable ASCII (`0x20..0x80`). Eight bytes at a time: a
/// runner's token is tens of bytes, and a byte-by-byte search was most of a
/// runner body's scan.
fn plain_len(s: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // The high bit of each byte that is zero; exact for the lowest such byte (a
    // borrow can only mark bytes above it), which is the one used.
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut chunks = s.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().ok()?);
        let ends = zero(x ^ (ONES * u64::from(b'"')))
            | zero(x ^ (ONES * u64::from(b'\\')))
            // Below 0x20 (exact for bytes under 0x80, the rest are caught next).
            | (x.wrapping_sub(ONES * 0x20) & !x & HIGH)
            | (x & HIGH);
        if ends != 0 {
            return Some(at + ends.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c))
        .map(|n| at + n)
}

/// A position in a body being scanned.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    /// JSON's whitespace (RFC 8259 §2).
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string of printable ASCII without escapes: its contents.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let rest = &self.b[self.i..];
        let len = plain_len(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        self.i += len + 1;
        Some(&rest[..len])
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?` (RFC 8259 §6).
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.digit()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.digit()?;
        }
        Some(())
    }

    /// One digit or more.
    fn digit(&mut self) -> Option<()> {
        self.next()?.is_ascii_digit().then(|| self.digits())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    /// Any value, nested `depth` deep.
    fn value(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => {
                self.i += 1;
                self.items(b'}', |s| {
                    s.key()?;
                    s.value(depth + 1)
                })
            }
            b'[' => {
                self.i += 1;
                self.items(b']', |s| s.value(depth + 1))
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// The items of an object or an array, its opening byte read, up to its
    /// `close`: each read by `item`, the separators and whitespace here.
    fn items(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.ws();
        if self.peek()? == close {
            self.i += 1;
            return Some(());
        }
        loop {
            item(self)?;
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                c if c == close => return Some(()),
                _ => return None,
            }
        }
    }

    /// An object member's key and the colon after it: the key.
    fn key(&mut self) -> Option<&'a [u8]> {
        let key = self.string()?;
        self.ws();
        self.expect(b':')?;
        self.ws();
        Some(key)
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
