//! The suite's one HTTP client, for backlogd's endpoint and the servers the suite runs
//! (nginx, Prometheus). Hand-rolled on purpose: the service tests send malformed, slow
//! and abusive requests that a client library refuses to make, and must see the very
//! bytes the server sent (is a chunked body whole? is the connection closed?).

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// How long a request may wait for its whole answer (a /metrics page with thousands of
/// listeners, read on a busy CI machine).
const READ_LIMIT: Duration = Duration::from_secs(20);

/// A response read whole from a connection the server closes after it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Status line and headers, without the blank line that ends them.
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn parse(bytes: &[u8]) -> std::io::Result<Self> {
        let shown = || String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
        let end = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other(format!("no response head in {:?}", shown())))?;
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status in {:?}", shown())))?;
        Ok(Self {
            status,
            head,
            body: bytes[end + 4..].to_vec(),
        })
    }

    /// A header's value (names compare case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The body, after checking it is whole: exactly Content-Length bytes, or a chunked
    /// body up to and including its final zero-size chunk (/metrics is streamed).
    pub fn complete_body(&self) -> Result<Vec<u8>, String> {
        let chunked = self
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"));
        if !chunked {
            let length: usize = self
                .header("content-length")
                .ok_or_else(|| format!("neither content-length nor chunked: {}", self.head))?
                .parse()
                .map_err(|e| format!("content-length: {e}"))?;
            if self.body.len() != length {
                return Err(format!(
                    "truncated: body of {} bytes, content-length {length}",
                    self.body.len()
                ));
            }
            return Ok(self.body.clone());
        }
        let mut out = Vec::new();
        let mut rest = self.body.as_slice();
        loop {
            let truncated = |out: &[u8]| {
                format!(
                    "chunked body truncated after {} bytes (no final chunk)",
                    out.len()
                )
            };
            let line_end = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or_else(|| truncated(&out))?;
            let size_text = String::from_utf8_lossy(&rest[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|e| format!("chunk size {size_text:?}: {e}"))?;
            rest = &rest[line_end + 2..];
            if size == 0 {
                return Ok(out);
            }
            if rest.len() < size + 2 {
                return Err(truncated(&out));
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
    }

    /// [`Reply::complete_body`] as text; panics if it is not whole.
    #[track_caller]
    pub fn complete_text(&self) -> String {
        let body = self
            .complete_body()
            .unwrap_or_else(|e| panic!("{e}: {}", self.head));
        String::from_utf8(body).expect("utf-8 body")
    }
}

/// `GET path` over HTTP/1.1 with `Connection: close`, optional basic-auth credentials (see
/// [`basic`]) and extra header lines (each ending in CRLF).
pub fn get_request(path: &str, auth: Option<&str>, extra: &str) -> Vec<u8> {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: Basic {a}\r\n"));
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}{extra}\r\n").into_bytes()
}

/// Sends `request` on a new connection and reads the response until the server closes.
pub fn exchange(addr: SocketAddr, request: &[u8]) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(READ_LIMIT))?;
    s.write_all(request)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Reply::parse(&out)
}

/// `GET path` over HTTP/1.0 (the server answers without chunked encoding and closes):
/// (status, body).
pub fn try_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let reply = exchange(
        addr,
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )?;
    let body = String::from_utf8(reply.body).map_err(std::io::Error::other)?;
    Ok((reply.status, body))
}

/// [`try_get`] that panics with the address and path when the exchange fails.
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    try_get(addr, path).unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// Sends raw bytes and returns what came back, until the server closes or 5 s pass.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one response from a kept-alive connection: its status (the body, which must have
/// a Content-Length, is read and skipped).
pub fn read_one_response(s: &mut TcpStream) -> std::io::Result<u16> {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.push(byte[0]);
    }
    let reply = Reply::parse(&got)?;
    let length: usize = reply
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no content-length: {}", reply.head)))?;
    let mut body = vec![0u8; length];
    s.read_exact(&mut body)?;
    Ok(reply.status)
}

/// Basic-auth credentials as they go into the Authorization header.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_standard_base64() {
        // RFC 7617's own example.
        assert_eq!(
            basic("Aladdin", "open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
    }

    #[test]
    fn a_chunked_body_is_whole_only_with_its_final_chunk() {
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        let whole = Reply::parse(format!("{head}3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").as_bytes());
        assert_eq!(whole.unwrap().complete_body().unwrap(), b"abcde");
        let cut = Reply::parse(format!("{head}3\r\nabc\r\n2\r\nde\r\n").as_bytes()).unwrap();
        assert!(
            cut.complete_body()
                .unwrap_err()
                .contains("truncated after 5 bytes")
        );
    }

    #[test]
    fn a_sized_body_must_have_its_length() {
        let reply =
            Reply::parse(b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnot").unwrap();
        assert_eq!(reply.status, 404);
        assert_eq!(reply.header("CONTENT-LENGTH"), Some("4"));
        assert!(reply.complete_body().is_err());
    }
}
