//! A deadline on writing to each connection (issue 16: a client that never reads). A client that
//! stops reading fills its socket's send buffer, and then every write to it waits: hyper would
//! wait forever, holding the connection, its request and (on shutdown) the drain. [`WriteDeadline`]
//! wraps the socket and fails a write that has taken no byte for `--write-timeout`; hyper then
//! drops the connection, which drops the response body and so cancels its job.
//!
//! The deadline is on progress, not on the whole reply: a slow reader that takes some bytes
//! within each `--write-timeout` keeps its connection (how slow a reader may be is the worker's
//! `--min-read-rate`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A socket whose writes fail once one has waited `timeout` without progress.
pub struct WriteDeadline<T> {
    inner: T,
    timeout: Duration,
    /// Armed while a write waits; disarmed by any progress.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    pub fn new(inner: T, timeout: Duration) -> WriteDeadline<T> {
        WriteDeadline { inner, timeout, deadline: None }
    }

    /// `poll` is the inner write's result: progress disarms the deadline, waiting arms it (once),
    /// and a wait past it becomes a `TimedOut` error.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.deadline = None;
            return poll;
        }
        let timeout = self.timeout;
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if deadline.as_mut().poll(cx).is_ready() {
            metrics::counter!(crate::telemetry::CONNECTIONS_WRITE_TIMED_OUT_TOTAL).increment(1);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no bytes for {timeout:?}"),
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A write into a pipe nobody reads fails after the timeout; one the reader drains in time
    /// goes through, however long the whole transfer takes.
    #[tokio::test]
    async fn a_write_without_progress_times_out_and_a_slow_one_does_not() {
        let timeout = Duration::from_millis(300);
        let (near, _far) = tokio::io::duplex(1024);
        let mut stuck = WriteDeadline::new(near, timeout);
        let started = std::time::Instant::now();
        let e = stuck.write_all(&[0u8; 64 * 1024]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= timeout && started.elapsed() < timeout * 10, "{:?}", started.elapsed());

        let (near, mut far) = tokio::io::duplex(1024);
        let mut slow = WriteDeadline::new(near, timeout);
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut got = 0;
            let mut buf = [0u8; 512];
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                match far.read(&mut buf).await.unwrap() {
                    0 => return got,
                    n => got += n,
                }
            }
        });
        // 8 KiB at 512 bytes per 100 ms: 1.6 s in all, each wait well under the timeout.
        slow.write_all(&[1u8; 8 * 1024]).await.unwrap();
        slow.shutdown().await.unwrap();
        drop(slow);
        assert_eq!(reader.await.unwrap(), 8 * 1024);
    }
}
