//! SPDY/3.1 framing, the server's half of what `kubectl port-forward` speaks
//! inside its WebSocket tunnel: frames read from a byte stream, header blocks
//! decompressed and compressed with one zlib context per direction and the SPDY
//! dictionary, as moby/spdystream's framer (`spdy/read.go`, `spdy/write.go`,
//! <https://github.com/moby/spdystream>) reads and writes them. Flow control is
//! not enforced: spdystream neither sends nor waits for `WINDOW_UPDATE`s.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

use super::dictionary::DICTIONARY;
use super::{Error, Result};

const VERSION: u16 = 3;
/// The `FIN` flag of data and control frames.
pub(super) const FLAG_FIN: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// One frame, as far as the server needs it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Frame {
    /// A new stream from the client with its headers (names lowercase).
    SynStream {
        stream: u32,
        fin: bool,
        headers: Vec<(String, String)>,
    },
    /// Data on a stream; `fin` half-closes it.
    Data { stream: u32, fin: bool, data: Bytes },
    /// The client abandoned a stream.
    RstStream { stream: u32 },
    /// A ping to echo.
    Ping { id: u32 },
    /// The client is going away.
    GoAway,
    /// Frames the server ignores (`SETTINGS`, `WINDOW_UPDATE`, `HEADERS`,
    /// `SYN_REPLY`).
    Other,
}

/// Reads frames from bytes as they arrive.
pub(super) struct Reader {
    buf: BytesMut,
    inflate: Decompress,
}

impl Reader {
    pub(super) fn new() -> Self {
        Reader {
            buf: BytesMut::new(),
            inflate: Decompress::new(true),
        }
    }

    /// Add bytes read from the connection.
    pub(super) fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    pub(super) fn next(&mut self) -> Result<Option<Frame>> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([0, self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if self.buf.len() < 8 + len {
            return Ok(None);
        }
        let head = self.buf.split_to(8);
        let mut body = self.buf.split_to(len).freeze();
        let flags = head[4];
        if head[0] & 0x80 == 0 {
            let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            return Ok(Some(Frame::Data {
                stream,
                fin: flags & FLAG_FIN != 0,
                data: body,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(Error::Spdy(format!("SPDY version {version}, not 3")));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let need = |n: usize| {
            if len < n {
                Err(Error::Spdy(format!("control frame {kind} of {len} bytes")))
            } else {
                Ok(())
            }
        };
        Ok(Some(match kind {
            SYN_STREAM => {
                need(10)?;
                let stream = body.get_u32() & 0x7fff_ffff;
                body.advance(6);
                let block = self.inflate(&body)?;
                Frame::SynStream {
                    stream,
                    fin: flags & FLAG_FIN != 0,
                    headers: parse_headers(&block)?,
                }
            }
            RST_STREAM => {
                need(8)?;
                Frame::RstStream {
                    stream: body.get_u32() & 0x7fff_ffff,
                }
            }
            PING => {
                need(4)?;
                Frame::Ping { id: body.get_u32() }
            }
            GOAWAY => Frame::GoAway,
            SYN_REPLY | HEADERS => {
                // Their header blocks still advance the shared zlib context.
                need(4)?;
                body.advance(4);
                self.inflate(&body)?;
                Frame::Other
            }
            SETTINGS | WINDOW_UPDATE => Frame::Other,
            other => return Err(Error::Spdy(format!("unknown control frame type {other}"))),
        }))
    }

    /// Inflate one header block; the context carries over to the next block.
    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let start = self.inflate.total_in();
        loop {
            let used = (self.inflate.total_in() - start) as usize;
            let produced = out.len();
            match self
                .inflate
                .decompress_vec(&input[used..], &mut out, FlushDecompress::Sync)
            {
                Err(e) if e.needs_dictionary().is_some() => self
                    .inflate
                    .set_dictionary(DICTIONARY)
                    .map(drop)
                    .map_err(|e| Error::Spdy(format!("header dictionary: {e}")))?,
                Err(e) => return Err(Error::Spdy(format!("header block: {e}"))),
                Ok(_) => {
                    let now = (self.inflate.total_in() - start) as usize;
                    if now == input.len() && out.len() < out.capacity() {
                        return Ok(out);
                    }
                    if now == used && out.len() == produced && out.len() < out.capacity() {
                        return Err(Error::Spdy("header block does not inflate".into()));
                    }
                    out.reserve(256);
                }
            }
        }
    }
}

/// A header block: a count, then length-prefixed names and values.
fn parse_headers(mut b: &[u8]) -> Result<Vec<(String, String)>> {
    let bad = || Error::Spdy("truncated header block".into());
    let take = |b: &mut &[u8]| -> Result<String> {
        if b.len() < 4 {
            return Err(bad());
        }
        let n = b.get_u32() as usize;
        if b.len() < n {
            return Err(bad());
        }
        let s = String::from_utf8_lossy(&b[..n]).into_owned();
        b.advance(n);
        Ok(s)
    };
    if b.len() < 4 {
        return Err(bad());
    }
    let count = b.get_u32();
    let mut out = Vec::new();
    for _ in 0..count {
        let name = take(&mut b)?;
        let value = take(&mut b)?;
        out.push((name, value));
    }
    Ok(out)
}

/// Writes frames; owns the compressing zlib context.
pub(super) struct Writer {
    deflate: Compress,
}

impl Writer {
    pub(super) fn new() -> Result<Self> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(DICTIONARY)
            .map_err(|e| Error::Spdy(format!("header dictionary: {e}")))?;
        Ok(Writer { deflate })
    }

    /// `SYN_REPLY` with no headers, as Kubernetes' SPDY server answers each stream
    /// (`httpstream/spdy/connection.go` in apimachinery).
    pub(super) fn syn_reply(&mut self, stream: u32) -> Result<Bytes> {
        let block = self.compress(&0u32.to_be_bytes())?;
        let mut body = BytesMut::with_capacity(4 + block.len());
        body.put_u32(stream);
        body.extend_from_slice(&block);
        Ok(control(SYN_REPLY, 0, &body))
    }

    fn compress(&mut self, input: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(input.len() + 64);
        let start = self.deflate.total_in();
        loop {
            let used = (self.deflate.total_in() - start) as usize;
            self.deflate
                .compress_vec(&input[used..], &mut out, FlushCompress::Sync)
                .map_err(|e| Error::Spdy(format!("compressing headers: {e}")))?;
            // A sync flush is complete once it leaves room in the output.
            if (self.deflate.total_in() - start) as usize == input.len()
                && out.len() < out.capacity()
            {
                return Ok(out);
            }
            out.reserve(256);
        }
    }
}

/// A data frame.
pub(super) fn data(stream: u32, fin: bool, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + payload.len());
    b.put_u32(stream & 0x7fff_ffff);
    b.put_u8(if fin { FLAG_FIN } else { 0 });
    b.put_uint(payload.len() as u64, 3);
    b.extend_from_slice(payload);
    b.freeze()
}

/// A `PING` answering the client's.
pub(super) fn ping(id: u32) -> Bytes {
    control(PING, 0, &id.to_be_bytes())
}

/// `RST_STREAM` with a status (`1` protocol error, `5` cancel).
pub(super) fn rst_stream(stream: u32, status: u32) -> Bytes {
    let mut body = [0u8; 8];
    body[..4].copy_from_slice(&stream.to_be_bytes());
    body[4..].copy_from_slice(&status.to_be_bytes());
    control(RST_STREAM, 0, &body)
}

fn control(kind: u16, flags: u8, body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + body.len());
    b.put_u16(0x8000 | VERSION);
    b.put_u16(kind);
    b.put_u8(flags);
    b.put_uint(body.len() as u64, 3);
    b.extend_from_slice(body);
    b.freeze()
}

/// Test helpers: the client's half (a `SYN_STREAM` with headers), so tests can
/// drive the reader without kubectl.
#[cfg(test)]
pub(super) fn syn_stream(deflate: &mut Compress, stream: u32, headers: &[(&str, &str)]) -> Bytes {
    let mut block = BytesMut::new();
    block.put_u32(headers.len() as u32);
    for (n, v) in headers {
        block.put_u32(n.len() as u32);
        block.extend_from_slice(n.as_bytes());
        block.put_u32(v.len() as u32);
        block.extend_from_slice(v.as_bytes());
    }
    let mut out = Vec::with_capacity(block.len() + 128);
    deflate
        .compress_vec(&block, &mut out, FlushCompress::Sync)
        .expect("compress");
    let mut body = BytesMut::new();
    body.put_u32(stream);
    body.put_u32(0);
    body.put_u16(0);
    body.extend_from_slice(&out);
    control(SYN_STREAM, 0, &body)
}
