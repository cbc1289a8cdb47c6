//! JSON-RPC envelopes and batches, from clients and from upstreams: never
//! a panic, and a parsed message serializes to bytes that parse again as
//! the same kind and method.
#![no_main]

use countersign::wire::jsonrpc::{parse_client_body, Body, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = parse_client_body(data) {
        let messages: Vec<Message> = match body {
            Body::Single(m) => vec![m],
            Body::Batch(ms) => ms.into_iter().flatten().collect(),
        };
        for m in messages {
            let again = Message::parse(&m.to_bytes()).expect("our own bytes parse");
            assert_eq!(again.kind(), m.kind());
            assert_eq!(again.method(), m.method());
        }
    }
    let _ = Message::parse_from_upstream(data);
});
