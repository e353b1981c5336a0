//! The protobuf codec of every podgate gRPC service and client: prost's, with 1 KiB
//! buffers instead of tonic's 8 KiB.
//!
//! tonic gives every stream an encode and a decode buffer of the codec's buffer
//! size, and with gzip on (every agentk call, [`gzip_server!`](crate::gzip_server!)) one more of
//! each: an 8 KiB buffer for the uncompressed message being sent, and the
//! decompressed message's buffer, reserved in steps of the buffer size and kept
//! for the stream's life. A kas holds an agent's configuration stream and its idle
//! reverse tunnels open for hours, mostly idle, so those buffers were most of what
//! a connected agent cost it. Smaller steps cost a large message (a Graph API
//! snapshot) only a few more reallocations: `BytesMut` grows by doubling.

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::ProstCodec;

/// The buffer size (and growth step) of every stream's buffers.
pub const BUFFER_SIZE: usize = 1024;

/// How much a stream encodes before it yields to the runtime (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_SIZE`] buffers; the generated services and clients
/// use it (`agent/build.rs`, `codec_path`).
#[derive(Debug, Clone, Copy)]
pub struct Small<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for Small<T, U> {
    fn default() -> Self {
        Small(std::marker::PhantomData)
    }
}

impl<T, U> Codec for Small<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}
