//! Line framing on stdio pipes: never a panic or a hang, no line longer
//! than the cap, and every line accounted for.
#![no_main]

use countersign::wire::lines::{read_line, Line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cap, input)) = data.split_first() else {
        return;
    };
    let max = usize::from(cap) + 1;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        // A small buffer, so lines cross reads.
        let mut reader = tokio::io::BufReader::with_capacity(7, input);
        let mut buf = Vec::new();
        for _ in 0..=input.len() + 1 {
            match read_line(&mut reader, &mut buf, max).await.expect("reading a slice") {
                Line::Line => assert!(buf.len() <= max, "a line over the cap"),
                Line::TooLong => {}
                Line::Eof => return,
            }
        }
        panic!("more lines than bytes");
    });
});
