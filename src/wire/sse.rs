//! Server-Sent Events, the framing of Streamable HTTP responses.
//!
//! [`Decoder`] turns a byte stream into events (used by the HTTP upstream and
//! the stdio bridge); [`encode`] frames one JSON-RPC message.

use bytes::{Bytes, BytesMut};

/// One event: its `data` lines joined with `\n`, and its `id` if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field (`message` when absent).
    pub event: Option<String>,
    /// The `data:` payload.
    pub data: String,
    /// The `id:` field.
    pub id: Option<String>,
}

/// Incremental SSE parser with a cap on one event's size, so a peer that
/// never ends an event cannot grow the buffer without bound.
pub struct Decoder {
    buf: BytesMut,
    max_event: usize,
    event: Option<String>,
    data: String,
    id: Option<String>,
    has_data: bool,
}

/// An event grew past the limit.
#[derive(Debug, thiserror::Error)]
#[error("server-sent event larger than {0} bytes")]
pub struct TooLarge(pub usize);

impl Decoder {
    /// A decoder refusing events larger than `max_event` bytes.
    pub fn new(max_event: usize) -> Decoder {
        Decoder {
            buf: BytesMut::new(),
            max_event,
            event: None,
            data: String::new(),
            id: None,
            has_data: false,
        }
    }

    /// Feed bytes; returns the events they complete.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, TooLarge> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let line = self.buf.split_to(pos + 1);
            let mut line = &line[..pos];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line);
            if line.is_empty() {
                if self.has_data {
                    out.push(Event {
                        event: self.event.take(),
                        data: std::mem::take(&mut self.data),
                        id: self.id.take(),
                    });
                }
                self.has_data = false;
                self.event = None;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_ref(), ""),
            };
            match field {
                "data" => {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                    self.has_data = true;
                }
                "event" => self.event = Some(value.to_owned()),
                "id" => self.id = Some(value.to_owned()),
                _ => {}
            }
            if self.data.len() > self.max_event {
                return Err(TooLarge(self.max_event));
            }
        }
        if self.buf.len() > self.max_event {
            return Err(TooLarge(self.max_event));
        }
        Ok(out)
    }
}

/// Frame one JSON text as an SSE `message` event.
pub fn encode(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    // Compact JSON has no raw newlines; if it ever did, each line needs its own `data:`.
    for (i, line) in json.split(|&b| b == b'\n').enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\ndata: ");
        }
        out.extend_from_slice(line);
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_across_chunks_and_crlf() {
        let mut d = Decoder::new(1024);
        assert!(d.feed(b"event: message\r\nda").unwrap().is_empty());
        let ev = d
            .feed(b"ta: {\"a\":1}\r\n\r\n: keepalive\n\ndata: x\ndata: y\nid: 7\n\n")
            .unwrap();
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].data, "{\"a\":1}");
        assert_eq!(ev[0].event.as_deref(), Some("message"));
        assert_eq!(ev[1].data, "x\ny");
        assert_eq!(ev[1].id.as_deref(), Some("7"));
    }

    #[test]
    fn refuses_huge_event() {
        let mut d = Decoder::new(16);
        assert!(d.feed(&[b'a'; 64]).is_err());
        let mut d = Decoder::new(16);
        assert!(d.feed(b"data: 0123456789abcdefghij\n").is_err());
    }

    #[test]
    fn encode_round_trips() {
        let mut d = Decoder::new(1024);
        let ev = d.feed(&encode(b"{\"x\":\"y\"}")).unwrap();
        assert_eq!(ev[0].data, "{\"x\":\"y\"}");
    }
}
