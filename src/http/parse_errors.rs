//! OpenAI-shaped bodies for the replies hyper writes itself (issue 16, finding 7). A request
//! that hyper cannot parse (a bad or conflicting `Content-Length`, a NUL or a folded header line,
//! an unknown HTTP version, headers over the limit, an over-long URI) never reaches the router:
//! hyper answers it with a bare `400`, `431` or `414` and an empty body, and closes. The clients
//! we serve parse every error as `{"error": {...}}`, so [`OpenAiParseErrors`] wraps each
//! connection's socket and rewrites such a head into the same reply with a JSON body.
//!
//! Which replies: a head whose status is 4xx or 5xx and whose `content-length` is 0. The router
//! never sends one (every [`ApiError`] has a JSON body), so only hyper's own are rewritten.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::error::ApiError;

/// A socket whose hyper-made error replies gain OpenAI error bodies.
pub struct OpenAiParseErrors<T> {
    inner: T,
    /// A rewritten reply still being written, and the length of hyper's that it replaces.
    pending: Vec<u8>,
    replaced: usize,
}

impl<T> OpenAiParseErrors<T> {
    pub fn new(inner: T) -> OpenAiParseErrors<T> {
        OpenAiParseErrors { inner, pending: Vec::new(), replaced: 0 }
    }
}

/// The reply to send instead of `head`, if `head` is one of hyper's bodiless error replies.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    // Every write passes here, streamed audio included: two byte compares settle nearly all.
    if !(head.starts_with(b"HTTP/1.1 4") || head.starts_with(b"HTTP/1.1 5")) {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let status_line = text.strip_prefix("HTTP/1.1 ")?;
    let status: u16 = status_line.get(..3)?.parse().ok()?;
    let (headers, rest) = text.split_once("\r\n\r\n")?;
    if !(400..600).contains(&status) || !rest.is_empty() {
        return None;
    }
    let mut lines = headers.split("\r\n");
    let first = lines.next()?;
    let kept: Vec<&str> = lines.collect();
    let empty = kept.iter().any(|l| l.eq_ignore_ascii_case("content-length: 0"));
    if !empty {
        return None;
    }
    let error = ApiError::Unparsable { status };
    let body = serde_json::to_vec(&error.body()).expect("an error body always serialises");
    let mut out = format!("{first}\r\n");
    for line in kept.iter().filter(|l| !l.to_ascii_lowercase().starts_with("content-length:")) {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()));
    let mut out = out.into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

impl<T: AsyncRead + Unpin> AsyncRead for OpenAiParseErrors<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for OpenAiParseErrors<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_empty()
            && let Some(reply) = rewrite(buf)
        {
            this.pending = reply;
            this.replaced = buf.len();
        }
        if this.pending.is_empty() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        // hyper retries the same buffer until told it was written: report it once the
        // replacement is out.
        while !this.pending.is_empty() {
            match Pin::new(&mut this.inner).poll_write(cx, &this.pending) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    this.pending.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(this.replaced))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then hands over each head in one buffer, which `rewrite` must see whole.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bodiless_errors_gain_an_openai_body() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(rewrite(head).unwrap()).unwrap();
        let (headers, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(headers.starts_with("HTTP/1.1 431 "), "{headers}");
        assert!(headers.contains("date: x") && headers.contains("content-type: application/json"), "{headers}");
        assert!(headers.contains(&format!("content-length: {}", body.len())), "{headers}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "request_header_fields_too_large");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn replies_with_bodies_and_successes_pass_unchanged() {
        for head in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 52\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{\"partial\"",
            b"RIFF....WAVEfmt ",
        ] {
            assert!(rewrite(head).is_none(), "{}", String::from_utf8_lossy(head));
        }
    }
}
