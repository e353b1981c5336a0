//! The HTTP/2 `:authority` grpc-go writes inside a WebSocket, made one the h2 crate
//! accepts.
//!
//! GitLab's agentk dials a `ws://` or `wss://` kas through grpc-go with the target
//! `passthrough:<kas URL>` and a WebSocket dialer (`constructKasConnection` in
//! `cmd/agentk/agentkapp/app.go`,
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/cmd/agentk/agentkapp/app.go>);
//! grpc-go takes a request's authority from the target's endpoint, so every
//! request's `:authority` is the URL itself, `ws://host:port`. GitLab's kas
//! (grpc-go) does not look at it; the h2 crate under tonic refuses an `:authority`
//! that is not an RFC 3986 authority and resets the stream.
//!
//! So the agent listener rewrites the header blocks a client sends inside a
//! WebSocket before h2 reads them ([`AuthorityFix`]): each `HEADERS` frame, with its
//! `CONTINUATION`s, is decoded with the client's HPACK state; an `:authority` that is
//! a URL becomes that URL's authority (`ws://host:port` → `host:port`); and the block
//! is encoded again with this side's own HPACK state, which h2's decoder then
//! follows (so every block is re-encoded, changed or not). Every other frame
//! passes unchanged, and a stream that does not start with the HTTP/2 preface passes
//! untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame sent on: h2's default `SETTINGS_MAX_FRAME_SIZE`, which the
/// agent listener keeps.
const MAX_FRAME: usize = 16_384;
/// The HPACK dynamic table h2 allows a client (its default
/// `SETTINGS_HEADER_TABLE_SIZE`).
const TABLE_SIZE: usize = 4_096;
/// The largest frame, header block or decoded header list (RFC 7541 sizes) kept;
/// gRPC's are far smaller.
const MAX_BUFFERED: usize = 1 << 20;

/// Why the client's HTTP/2 stream cannot be read: the connection ends, as h2 would
/// end it (not retryable on the same connection).
#[derive(Debug, Error)]
pub enum Error {
    /// A frame's padding or priority does not fit in it.
    #[error("malformed HEADERS frame on stream {0}")]
    Malformed(u32),
    /// A header block was interrupted by another frame.
    #[error("expected CONTINUATION of stream {0}")]
    Interrupted(u32),
    /// A frame, a header block or the header list it decodes to is larger than kas
    /// keeps.
    #[error("frame or header list larger than {MAX_BUFFERED} bytes")]
    TooLarge,
    /// The header block does not decode (HPACK `COMPRESSION_ERROR`).
    #[error("header block of stream {stream}: {why}")]
    Hpack {
        /// The stream.
        stream: u32,
        /// The decoder's reason.
        why: String,
    },
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Where in the client's byte stream the reader is.
enum State {
    /// Matching the preface; this many bytes of it seen.
    Preface(usize),
    /// Frame by frame.
    Frames,
    /// Not HTTP/2: everything passes unchanged.
    Passthrough,
}

/// A `HEADERS` frame waiting for its `CONTINUATION`s.
struct Pending {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// A client's HTTP/2 byte stream with its `:authority` headers made authorities
/// (see the module docs); writes pass unchanged.
pub struct AuthorityFix<S> {
    inner: S,
    state: State,
    /// Read from `inner`, not parsed yet.
    input: BytesMut,
    /// Ready for the reader.
    output: BytesMut,
    pending: Option<Pending>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    /// Rewrite what is read from `inner`.
    pub fn new(inner: S) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        AuthorityFix {
            inner,
            state: State::Preface(0),
            input: BytesMut::new(),
            output: BytesMut::new(),
            pending: None,
            decoder,
            encoder: loona_hpack::Encoder::new(),
            eof: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Move what `input` holds to `output`, rewritten as far as it is complete.
    fn process(&mut self) -> Result<(), Error> {
        loop {
            match self.state {
                State::Passthrough => {
                    let all = self.input.split();
                    self.output.extend_from_slice(&all);
                    return Ok(());
                }
                State::Preface(seen) => {
                    let n = self.input.len().min(PREFACE.len() - seen);
                    if self.input[..n] != PREFACE[seen..seen + n] {
                        self.state = State::Passthrough;
                        continue;
                    }
                    let part = self.input.split_to(n);
                    self.output.extend_from_slice(&part);
                    if seen + n < PREFACE.len() {
                        self.state = State::Preface(seen + n);
                        return Ok(());
                    }
                    self.state = State::Frames;
                }
                State::Frames => return self.frames(),
            }
        }
    }

    /// Every complete frame in `input`.
    fn frames(&mut self) -> Result<(), Error> {
        while self.input.len() >= FRAME_HEADER {
            let len = usize::from(self.input[0]) << 16
                | usize::from(self.input[1]) << 8
                | usize::from(self.input[2]);
            if len > MAX_BUFFERED {
                return Err(Error::TooLarge);
            }
            if self.input.len() < FRAME_HEADER + len {
                self.input.reserve(FRAME_HEADER + len - self.input.len());
                return Ok(());
            }
            let (kind, flags) = (self.input[3], self.input[4]);
            let stream = u32::from_be_bytes([
                self.input[5] & 0x7f,
                self.input[6],
                self.input[7],
                self.input[8],
            ]);
            let frame = self.input.split_to(FRAME_HEADER + len);
            let payload = &frame[FRAME_HEADER..];
            match (kind, self.pending.take()) {
                (HEADERS, None) => {
                    let (priority, block) = headers_payload(stream, flags, payload)?;
                    self.headers(Pending {
                        stream,
                        flags,
                        priority,
                        block: block.to_vec(),
                    })?;
                }
                (CONTINUATION, Some(mut p)) if p.stream == stream => {
                    if p.block.len() + payload.len() > MAX_BUFFERED {
                        return Err(Error::TooLarge);
                    }
                    p.block.extend_from_slice(payload);
                    p.flags |= flags & END_HEADERS;
                    self.headers(p)?;
                }
                (_, Some(p)) => return Err(Error::Interrupted(p.stream)),
                (_, None) => self.output.extend_from_slice(&frame),
            }
        }
        Ok(())
    }

    /// A header block: kept until complete, then rewritten into `output`.
    fn headers(&mut self, p: Pending) -> Result<(), Error> {
        if p.flags & END_HEADERS == 0 {
            self.pending = Some(p);
            return Ok(());
        }
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        // Indexed fields expand: a small block can name a large list. Past the
        // bound nothing more is kept, and the connection ends below.
        let mut size = 0usize;
        self.decoder
            .decode_with_cb(&p.block, |name, value| {
                size += name.len() + value.len() + 32;
                if size > MAX_BUFFERED {
                    return;
                }
                let value = match &*name {
                    b":authority" => authority(&value).unwrap_or_else(|| value.into_owned()),
                    _ => value.into_owned(),
                };
                fields.push((name.into_owned(), value));
            })
            .map_err(|e| Error::Hpack {
                stream: p.stream,
                why: format!("{e:?}"),
            })?;
        if size > MAX_BUFFERED {
            return Err(Error::TooLarge);
        }
        let block = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut first = Vec::with_capacity(block.len() + 5);
        if let Some(priority) = p.priority {
            first.extend_from_slice(&priority);
        }
        first.extend_from_slice(&block);
        let mut chunks = first.chunks(MAX_FRAME).peekable();
        let mut kind = HEADERS;
        let mut flags = p.flags & (END_STREAM | PRIORITY);
        while let Some(chunk) = chunks.next() {
            if chunks.peek().is_none() {
                flags |= END_HEADERS;
            }
            self.frame(kind, flags, p.stream, chunk);
            (kind, flags) = (CONTINUATION, 0);
        }
        if first.is_empty() {
            self.frame(HEADERS, flags | END_HEADERS, p.stream, &[]);
        }
        Ok(())
    }

    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len();
        self.output.extend_from_slice(&[
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
        ]);
        self.output.put_u32(stream);
        self.output.extend_from_slice(payload);
    }
}

/// A `HEADERS` payload's priority fields and header block fragment, padding removed.
fn headers_payload(
    stream: u32,
    flags: u8,
    payload: &[u8],
) -> Result<(Option<[u8; 5]>, &[u8]), Error> {
    let mut rest = payload;
    if flags & PADDED != 0 {
        let (&pad, body) = rest.split_first().ok_or(Error::Malformed(stream))?;
        rest = body
            .get(
                ..body
                    .len()
                    .checked_sub(usize::from(pad))
                    .ok_or(Error::Malformed(stream))?,
            )
            .ok_or(Error::Malformed(stream))?;
    }
    let priority = if flags & PRIORITY != 0 {
        let (p, body) = rest
            .split_first_chunk::<5>()
            .ok_or(Error::Malformed(stream))?;
        rest = body;
        Some(*p)
    } else {
        None
    };
    Ok((priority, rest))
}

/// The authority of an `:authority` value that is a URL (`ws://host:port/path` →
/// `host:port`); `None` when the value is already an authority or holds none.
pub fn authority(value: &[u8]) -> Option<Vec<u8>> {
    if http::uri::Authority::try_from(value).is_ok() {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    let (_, rest) = text.split_once("://")?;
    let found = rest.split(['/', '?', '#']).next()?;
    http::uri::Authority::try_from(found)
        .ok()
        .map(|_| found.as_bytes().to_vec())
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The end: whatever is left goes on as it is, for h2 to judge.
                this.eof = true;
                let rest = this.input.split();
                this.output.extend_from_slice(&rest);
                continue;
            }
            this.input.extend_from_slice(read.filled());
            this.process()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
