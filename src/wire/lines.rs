//! Newline-delimited reading with a length cap.
//!
//! stdio MCP frames messages by `\n`. A peer that never sends one must not
//! make the reader buffer without bound, so every line read here is capped.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What one read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line (without its `\n`, and without a trailing `\r`).
    Line,
    /// The line was longer than the cap; it was consumed up to its end and discarded.
    TooLong,
    /// End of input.
    Eof,
}

/// Read one line into `buf` (cleared first), at most `max` bytes.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    buf.clear();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if too_long {
                Line::TooLong
            } else if buf.is_empty() {
                Line::Eof
            } else {
                Line::Line
            });
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = found.unwrap_or(available.len());
        reader.consume(used);
        if found.is_some() {
            if too_long {
                return Ok(Line::TooLong);
            }
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(Line::Line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn caps_and_recovers() {
        let data: &[u8] = b"short\r\nthis line is far too long\nok\nlast";
        let mut r = tokio::io::BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Line);
        assert_eq!(buf, b"short");
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::TooLong);
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Line);
        assert_eq!(buf, b"ok");
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Line);
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Eof);
    }
}
