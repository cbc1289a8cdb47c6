//! Server-Sent Events, the framing of Streamable HTTP responses.
//!
//! [`Decoder`] turns a byte stream into events (used by the HTTP upstream and
//! the stdio bridge); [`encode`] frames one JSON-RPC message; [`Replay`]
//! keeps a session's events so that a client can resume a broken stream
//! with `Last-Event-ID` (handshake era, 2025-11-25).

use std::collections::{BTreeMap, VecDeque};

use bytes::{Bytes, BytesMut};

/// What an upstream transport hands whoever relays one request: the
/// messages of the request's stream, and two facts about the stream itself.
/// The facts are their own variants, never messages: nothing an upstream
/// sends can pose as one, and nothing has to be filtered out before a
/// client sees the messages.
#[derive(Debug, Clone)]
pub enum UpstreamEvent {
    /// A message for the client: a notification, a request of the server,
    /// or the answer.
    Message(crate::wire::jsonrpc::Message),
    /// The upstream answers as an SSE stream: a client that accepts SSE
    /// gets a stream too, with the gateway's own priming event and ids.
    Streamed,
    /// The upstream closed the request's stream before answering, and the
    /// transport resumes it (SEP-1699): the client's stream is closed at
    /// the same point, and the client resumes it from the gateway with
    /// `Last-Event-ID`.
    Resumed,
}

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
    /// The stream's last event id (SSE's "last event ID buffer"): set by
    /// every `id:` field, dispatched event or not (a priming event only
    /// sets it).
    last_id: Option<String>,
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
            last_id: None,
        }
    }

    /// The id a resumption names in `Last-Event-ID`: the last `id:` field
    /// seen, priming events included.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_id.as_deref()
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
                // An event with empty data is not dispatched (the SSE
                // standard): a 2025-11-25 server's priming event only sets
                // the last event id.
                if self.has_data && !self.data.is_empty() {
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
                "id" => {
                    self.id = Some(value.to_owned());
                    self.last_id = Some(value.to_owned());
                }
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

/// The payload of the last non-empty `data:` line of a whole SSE body: the
/// answer, for a client that reads a request's stream to its end.
pub fn last_data(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .find(|d| !d.is_empty())
}

/// Frame one JSON text as an SSE `message` event.
pub fn encode(json: &[u8]) -> Bytes {
    encode_with_id(None, json)
}

/// Frame one JSON text as an SSE `message` event with an `id`.
pub fn encode_with_id(id: Option<&str>, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 48);
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
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

/// How long a client waits before reconnecting a broken stream (the `retry`
/// field of the priming event), in milliseconds.
pub const RETRY_MS: u64 = 1000;

/// Most events kept per stream for resumption.
const KEEP_EVENTS: usize = 256;
/// Most bytes of events kept per stream.
const KEEP_BYTES: usize = 1 << 20;
/// Most streams kept per session (finished ones are forgotten first).
const KEEP_STREAMS: usize = 32;

/// The standalone (GET) stream of a session.
pub const STANDALONE: u64 = 0;

/// The events of one session's SSE streams, kept (bounded) for resumption.
/// An event id is `STREAM-SEQ`: unique in the session, and naming the stream
/// it was sent on, so a resumption replays only that stream's events.
#[derive(Debug, Default)]
pub struct Replay {
    streams: BTreeMap<u64, Kept>,
    next: u64,
}

#[derive(Debug, Default)]
struct Kept {
    events: VecDeque<(u64, Bytes)>,
    bytes: usize,
    next_seq: u64,
    done: bool,
    /// The first connection of the stream ends after this event (the
    /// upstream closed its own stream early); a resumption goes on.
    cut: Option<u64>,
}

/// What a resumption gets: the events after the client's last one, and
/// whether the stream has ended (no more will come).
#[derive(Debug)]
pub struct Resumed {
    /// Events after the last one the client saw, in order.
    pub events: Vec<Bytes>,
    /// The sequence number of the last of them (or the client's).
    pub last: u64,
    /// The stream ended.
    pub done: bool,
    /// Events between the client's last one and `events` were no longer kept.
    pub gap: bool,
    /// The first connection of the stream ends after this event.
    pub cut: Option<u64>,
}

/// `STREAM-SEQ`.
pub fn parse_event_id(id: &str) -> Option<(u64, u64)> {
    let (stream, seq) = id.trim().split_once('-')?;
    Some((stream.parse().ok()?, seq.parse().ok()?))
}

impl Replay {
    /// A new stream; returns its number and its priming event (an id and
    /// empty data, with `retry`), which lets the client resume before any
    /// message was sent.
    pub fn open(&mut self) -> (u64, Bytes) {
        self.next += 1;
        let stream = self.next;
        self.streams.insert(stream, Kept::default());
        self.evict();
        (stream, self.priming(stream))
    }

    /// The priming event of `stream` (the standalone stream is opened on
    /// first use).
    pub fn priming(&mut self, stream: u64) -> Bytes {
        let kept = self.streams.entry(stream).or_default();
        let id = format!("{stream}-{}", kept.next_seq);
        Bytes::from(format!("id: {id}\nretry: {RETRY_MS}\ndata: \n\n"))
    }

    fn evict(&mut self) {
        while self.streams.len() > KEEP_STREAMS {
            let victim = self
                .streams
                .iter()
                .filter(|(n, _)| **n != STANDALONE)
                .min_by_key(|(n, k)| (!k.done, **n))
                .map(|(n, _)| *n);
            match victim {
                Some(n) => {
                    self.streams.remove(&n);
                }
                None => break,
            }
        }
    }

    /// Frame `json` as the next event of `stream` and keep it.
    pub fn push(&mut self, stream: u64, json: &[u8]) -> Bytes {
        let kept = self.streams.entry(stream).or_default();
        kept.next_seq += 1;
        let frame = encode_with_id(Some(&format!("{stream}-{}", kept.next_seq)), json);
        kept.bytes += frame.len();
        kept.events.push_back((kept.next_seq, frame.clone()));
        while kept.events.len() > KEEP_EVENTS || kept.bytes > KEEP_BYTES {
            match kept.events.pop_front() {
                Some((_, old)) => kept.bytes -= old.len(),
                None => break,
            }
        }
        frame
    }

    /// The first connection of `stream` ends after the events kept so far;
    /// the rest is for a resumption.
    pub fn cut(&mut self, stream: u64) {
        if let Some(k) = self.streams.get_mut(&stream) {
            k.cut.get_or_insert(k.next_seq);
        }
    }

    /// `stream` has sent its last event.
    pub fn finish(&mut self, stream: u64) {
        if let Some(k) = self.streams.get_mut(&stream) {
            k.done = true;
        }
    }

    /// The events of `stream` after `after`; `None` when the stream is not
    /// (or no longer) known.
    pub fn since(&self, stream: u64, after: u64) -> Option<Resumed> {
        let kept = self.streams.get(&stream)?;
        let events: Vec<(u64, Bytes)> = kept
            .events
            .iter()
            .filter(|(seq, _)| *seq > after)
            .cloned()
            .collect();
        let gap = events.first().is_some_and(|(seq, _)| *seq > after + 1);
        Some(Resumed {
            last: events.last().map_or(after, |(seq, _)| *seq),
            events: events.into_iter().map(|(_, f)| f).collect(),
            done: kept.done,
            gap,
            cut: kept.cut,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_priming_event_sets_the_last_event_id() {
        let mut d = Decoder::new(1024);
        assert!(d
            .feed(b"id: rc-1\nretry: 100\ndata: \n\n")
            .unwrap()
            .is_empty());
        assert_eq!(d.last_event_id(), Some("rc-1"));
    }

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
    fn a_priming_event_is_not_dispatched() {
        let mut d = Decoder::new(1024);
        let ev = d
            .feed(b"id: 1-0\nretry: 1000\ndata: \n\nid: 1-1\ndata: {}\n\n")
            .unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].id.as_deref(), Some("1-1"));
    }

    #[test]
    fn replay_resumes_one_stream_from_an_id() {
        let mut r = Replay::default();
        let (a, priming) = r.open();
        assert!(String::from_utf8_lossy(&priming).contains(&format!("id: {a}-0\nretry: ")));
        let (b, _) = r.open();
        r.push(a, b"{\"n\":1}");
        r.push(b, b"{\"other\":1}");
        let second = r.push(a, b"{\"n\":2}");
        assert!(String::from_utf8_lossy(&second).starts_with(&format!("id: {a}-2\n")));
        let got = r.since(a, 1).unwrap();
        assert_eq!(got.events, vec![second]);
        assert!(!got.done && !got.gap);
        r.finish(a);
        assert!(r.since(a, 2).unwrap().done);
        assert_eq!(
            r.since(a, 0).unwrap().events.len(),
            2,
            "from the priming event"
        );
        assert!(r.since(99, 0).is_none());
        assert_eq!(parse_event_id("3-14"), Some((3, 14)));
        assert_eq!(parse_event_id("x"), None);
    }

    #[test]
    fn replay_is_bounded() {
        let mut r = Replay::default();
        let (a, _) = r.open();
        for _ in 0..(KEEP_EVENTS + 10) {
            r.push(a, b"{}");
        }
        let got = r.since(a, 0).unwrap();
        assert_eq!(got.events.len(), KEEP_EVENTS);
        assert!(
            got.gap,
            "the oldest were dropped, and the resumption says so"
        );
        for _ in 0..KEEP_STREAMS + 5 {
            let (s, _) = r.open();
            r.finish(s);
        }
        assert!(r.streams.len() <= KEEP_STREAMS);
    }

    #[test]
    fn encode_round_trips() {
        let mut d = Decoder::new(1024);
        let ev = d.feed(&encode(b"{\"x\":\"y\"}")).unwrap();
        assert_eq!(ev[0].data, "{\"x\":\"y\"}");
    }
}
