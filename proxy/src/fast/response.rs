//! The Pod's response, as the fast path relays it: its head parsed once, the
//! header rewritten for the client in one buffer (with as much of the body as has
//! arrived), and the body's end found without decoding it (RFC 9112 §6.3).

use std::ops::Range;

/// Most header lines of a Pod's response.
const MAX_HEADERS: usize = 96;

/// Longest response head (longer: 502).
pub(crate) const MAX_HEAD: usize = 64 * 1024;

/// How the response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked: until the last chunk and its trailers.
    Chunked,
    /// Until the Pod closes (then the client's connection closes too).
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    /// The status.
    pub(crate) status: u16,
    /// The head's length, blank line included.
    pub(crate) len: usize,
    /// The body's framing.
    pub(crate) framing: Framing,
    /// Whether the Pod's connection may be reused after the body.
    pub(crate) reusable: bool,
    /// The status line, CRLF excluded.
    status_line: Range<usize>,
    /// Header lines to relay (name, value), in order.
    lines: Vec<(Range<usize>, Range<usize>)>,
}

/// What the start of a buffer holds.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// An interim (1xx) response of this length, to skip.
    Interim(usize),
    /// A final response head.
    Head(ResponseHead),
    /// Not a response the proxy can relay (a 502).
    Invalid(&'static str),
}

/// Parse the response head at the start of `buf`, to a request with `method`.
pub(crate) fn parse(buf: &[u8], head_request: bool) -> Parsed {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut raw);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parsed::Partial,
        Ok(httparse::Status::Partial) => return Parsed::Invalid("response head too long"),
        Err(_) => return Parsed::Invalid("malformed response head"),
    };
    let status = resp.code.unwrap_or(0);
    if status == 101 {
        return Parsed::Invalid("101 to a request without Upgrade");
    }
    if (100..200).contains(&status) {
        return Parsed::Interim(len);
    }
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - buf.as_ptr() as usize;
        start..start + s.len()
    };
    // httparse skips empty lines before the status line (RFC 9112 §2.2's
    // robustness): so must the status line relayed.
    let line_start = buf
        .iter()
        .position(|b| *b != b'\r' && *b != b'\n')
        .unwrap_or(0);
    let line_end = buf[line_start..]
        .iter()
        .position(|b| *b == b'\r' || *b == b'\n')
        .map_or(line_start, |n| line_start + n);
    let mut reusable = resp.version == Some(1);
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut lines = Vec::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = crate::http1::content_length(h.value.trim_ascii());
            match (n, length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(m)) if n == m => continue,
                _ => return Parsed::Invalid("ambiguous Content-Length"),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides (RFC 9112 §6.3): chunked, else read to close.
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case("connection") {
            if h.value
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
            {
                reusable = false;
            }
            // Hop by hop: the client's connection has its own.
            continue;
        } else if name.eq_ignore_ascii_case("keep-alive")
            || name.eq_ignore_ascii_case("x-request-id")
        {
            continue;
        }
        lines.push((span(name.as_bytes()), span(h.value)));
    }
    let framing = if head_request || status == 204 || status == 304 {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    };
    if framing == Framing::Close {
        reusable = false;
    }
    // With Transfer-Encoding, a Content-Length is not relayed (RFC 9112 §6.3).
    if chunked.is_some() {
        lines.retain(|(name, _)| !buf[name.clone()].eq_ignore_ascii_case(b"content-length"));
    }
    Parsed::Head(ResponseHead {
        status,
        len,
        framing,
        reusable,
        status_line: line_start..line_end,
        lines,
    })
}

impl ResponseHead {
    /// The head for the client: the Pod's status line and headers (hop-by-hop ones
    /// dropped), `X-Request-Id`, and `Connection: close` when the client's
    /// connection ends after it.
    pub(crate) fn write_for_client(
        &self,
        buf: &[u8],
        request_id: &str,
        close: bool,
        out: &mut Vec<u8>,
    ) {
        out.extend_from_slice(&buf[self.status_line.clone()]);
        out.extend_from_slice(b"\r\n");
        for (name, value) in &self.lines {
            out.extend_from_slice(&buf[name.clone()]);
            out.extend_from_slice(b": ");
            out.extend_from_slice(&buf[value.clone()]);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"x-request-id: ");
        out.extend_from_slice(request_id.as_bytes());
        out.extend_from_slice(b"\r\n");
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// Finds the end of a chunked body in the bytes relayed, without copying or
/// decoding it.
#[derive(Debug, Default)]
pub struct ChunkScanner {
    state: State,
    /// Data bytes left in the current chunk.
    left: u64,
    /// Digits seen in the current size line.
    digits: u8,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum State {
    /// Reading a chunk-size (hex digits).
    #[default]
    Size,
    /// After the size: extensions until LF.
    SizeLine,
    /// Chunk data.
    Data,
    /// The CR LF after chunk data.
    DataEnd,
    /// After the last chunk: at the start of a trailer line (or the final CRLF).
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// The final CRLF's LF.
    FinalLf,
    /// Done.
    Done,
}

impl ChunkScanner {
    /// Scan `bytes`. `Ok(Some(n))`: the body ends after the first `n` of them;
    /// `Ok(None)`: it goes on; `Err`: not valid chunked framing.
    pub fn scan(&mut self, bytes: &[u8]) -> Result<Option<usize>, &'static str> {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match self.state {
                State::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        self.digits += 1;
                        if self.digits > 15 {
                            return Err("chunk size too long");
                        }
                        let d = (b as char).to_digit(16).unwrap_or(0);
                        self.left = self.left * 16 + u64::from(d);
                    }
                    _ if self.digits == 0 => return Err("chunk size missing"),
                    b'\n' => self.end_size_line(),
                    _ => self.state = State::SizeLine,
                },
                State::SizeLine => {
                    if b == b'\n' {
                        self.end_size_line();
                    }
                }
                State::Data => {
                    let take = (bytes.len() - i).min(self.left as usize);
                    self.left -= take as u64;
                    i += take;
                    if self.left == 0 {
                        self.state = State::DataEnd;
                    }
                    continue;
                }
                State::DataEnd => match b {
                    b'\r' => {}
                    b'\n' => {
                        self.state = State::Size;
                        self.digits = 0;
                    }
                    _ => return Err("no CRLF after chunk data"),
                },
                State::TrailerStart => match b {
                    b'\r' => self.state = State::FinalLf,
                    b'\n' => {
                        self.state = State::Done;
                        return Ok(Some(i + 1));
                    }
                    _ => self.state = State::Trailer,
                },
                State::Trailer => {
                    if b == b'\n' {
                        self.state = State::TrailerStart;
                    }
                }
                State::FinalLf => {
                    if b == b'\n' {
                        self.state = State::Done;
                        return Ok(Some(i + 1));
                    }
                    return Err("no LF after the last chunk");
                }
                State::Done => return Ok(Some(i)),
            }
            i += 1;
        }
        Ok((self.state == State::Done).then_some(0))
    }

    fn end_size_line(&mut self) {
        self.state = if self.left == 0 {
            State::TrailerStart
        } else {
            State::Data
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str, head_request: bool) -> ResponseHead {
        match parse(raw.as_bytes(), head_request) {
            Parsed::Head(h) => h,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = head("HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n", false);
        assert_eq!(
            (h.status, h.framing, h.reusable),
            (201, Framing::Length(10), true)
        );
        let h = head(
            "HTTP/1.1 204 No Content\r\nX-GitLab-Last-Update: a\r\n\r\n",
            false,
        );
        assert_eq!((h.framing, h.reusable), (Framing::Empty, true));
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true);
        assert_eq!(h.framing, Framing::Empty);
        let h = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
        );
        assert_eq!(h.framing, Framing::Chunked);
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false);
        assert_eq!((h.framing, h.reusable), (Framing::Close, false));
        let h = head("HTTP/1.1 200 OK\r\n\r\n", false);
        assert_eq!((h.framing, h.reusable), (Framing::Close, false));
        let h = head(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        assert!(!h.reusable);
        let h = head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false);
        assert!(!h.reusable);
        assert!(matches!(
            parse(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                false
            ),
            Parsed::Invalid(_)
        ));
        assert!(matches!(
            parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200", false),
            Parsed::Interim(25)
        ));
    }

    #[test]
    fn the_client_head_drops_hop_by_hop_and_sets_the_request_id() {
        let raw = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Request-Id: pod\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n";
        let h = head(raw, false);
        let mut out = Vec::new();
        h.write_for_client(raw.as_bytes(), "rid", true, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b\r\nx-request-id: rid\r\nconnection: close\r\n\r\n"
        );
    }

    /// Found by `fuzz/fuzz_targets/proxy_response_head.rs`: the client got the empty
    /// line before the status line as its status line.
    #[test]
    fn empty_lines_before_the_status_line_are_not_relayed() {
        let raw = "\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let h = head(raw, false);
        let mut out = Vec::new();
        h.write_for_client(raw.as_bytes(), "rid", false, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-request-id: rid\r\n\r\n"
        );
    }

    #[test]
    fn the_chunk_scanner_finds_the_end_in_any_split() {
        let body =
            b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..body.len() {
            let mut s = ChunkScanner::default();
            let first = s.scan(&body[..split]).unwrap();
            let found = match first {
                Some(n) => Some(n),
                None => s.scan(&body[split..]).unwrap().map(|n| n + split),
            };
            assert_eq!(found, Some(end), "split at {split}");
        }
        let mut s = ChunkScanner::default();
        assert_eq!(s.scan(b"0\r\n\r\n").unwrap(), Some(5));
        assert!(ChunkScanner::default().scan(b"zz\r\n").is_err());
        assert!(ChunkScanner::default().scan(b"2\r\nabX").is_err());
    }
}
