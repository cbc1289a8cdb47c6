//! The SSE decoder: never a panic, and the events do not depend on where
//! the stream was cut into chunks.
#![no_main]

use countersign::wire::sse::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let whole = Decoder::new(4096).feed(stream);
    let mut chunked = Decoder::new(4096);
    let step = usize::from(cut % 17) + 1;
    let mut events = Vec::new();
    let mut failed = false;
    for chunk in stream.chunks(step) {
        match chunked.feed(chunk) {
            Ok(evs) => events.extend(evs),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    if let (Ok(w), false) = (whole, failed) {
        let a: Vec<_> = w.iter().map(|e| (e.id.clone(), e.data.clone())).collect();
        let b: Vec<_> = events.iter().map(|e| (e.id.clone(), e.data.clone())).collect();
        assert_eq!(a, b, "the events depend on the chunking");
    }
});
