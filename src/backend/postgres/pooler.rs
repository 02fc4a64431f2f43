//! Whether a connection goes straight to the server, without a pooler in between.
//!
//! At startup the server sends every connection a cancel key (`BackendKeyData`): the process
//! id of the server process that serves the connection and a secret. A pooler
//! (PgBouncer, pgcat, Supavisor, RDS Proxy, Odyssey) answers the startup itself and hands out
//! keys of its own, since the server process behind a client changes with every transaction;
//! PgBouncer's process ids are random numbers. So the connection goes straight to the server
//! (or through something that ties it to one server process for good, such as a TCP proxy)
//! exactly when the key's process id is the one the server names as this session's,
//! `pg_backend_pid()`: then named statements stay where they were prepared.
//!
//! The driver keeps the key to itself, except to write it into a cancel request: the key's
//! process id is read from a cancel request written into memory, never sent anywhere.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};
use tokio_postgres::CancelToken;

/// The code of a cancel request (protocol: `CancelRequest`).
const CANCEL_REQUEST_CODE: i32 = 80_877_102;

/// The process id in `token`'s cancel key, read from the cancel request the driver writes
/// (into memory here); `None` if it writes something else.
pub(super) fn key_process_id(
    runtime: &tokio::runtime::Runtime,
    token: &CancelToken,
) -> Option<i32> {
    let mut memory = Memory::default();
    runtime
        .block_on(token.cancel_query_raw(&mut memory, Plain))
        .ok()?;
    // An encryption request (8 bytes) may come first; the cancel request is the last 16.
    let written = memory.written;
    let request = written.get(written.len().checked_sub(16)?..)?;
    let word = |at: usize| i32::from_be_bytes(request[at..at + 4].try_into().expect("4 bytes"));
    (word(0) == 16 && word(4) == CANCEL_REQUEST_CODE).then(|| word(8))
}

/// A stream in memory: keeps what is written, and answers "yes" (`S`) to an encryption
/// request, after which [`Plain`] "encrypts" by passing bytes through.
#[derive(Default)]
struct Memory {
    written: Vec<u8>,
    answered: bool,
}

impl AsyncRead for Memory {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.answered && buf.remaining() > 0 {
            buf.put_slice(b"S");
            self.answered = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Memory {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// "Encryption" that passes bytes through, so that the driver writes its cancel request into
/// [`Memory`] whatever the connection's `sslmode`.
struct Plain;

/// A stream [`Plain`] "encrypted".
struct PlainStream<S>(S);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsConnect<S> for Plain {
    type Stream = PlainStream<S>;
    type Error = std::io::Error;
    type Future = std::future::Ready<std::io::Result<PlainStream<S>>>;

    fn connect(self, stream: S) -> Self::Future {
        std::future::ready(Ok(PlainStream(stream)))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PlainStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PlainStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PlainStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
