//! HTTP/1 as tests read it off a socket.

/// A whole chunked body (RFC 9112 §7.1) decoded: its chunks' data, chunk
/// extensions and trailers dropped. `None` when `raw` is not one: a size that is
/// not hex, a chunk without its CRLF, or no last chunk.
pub fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&raw[..eol]).ok()?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).ok()?;
        let data = raw.get(eol + 2..)?;
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        raw = data.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_or_are_refused() {
        assert_eq!(
            dechunk(b"3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n").as_deref(),
            Some(b"abcde".as_slice())
        );
        assert_eq!(dechunk(b"0\r\n\r\n").as_deref(), Some(b"".as_slice()));
        for bad in [
            &b"zz\r\nab\r\n0\r\n\r\n"[..],
            b"3\r\nabcX0\r\n\r\n",
            b"3\r\nabc\r\n",
            b"5\r\nab",
        ] {
            assert_eq!(dechunk(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
