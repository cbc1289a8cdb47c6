//! Log output: one event, one line, whatever a client put in its fields.
//!
//! Values that come from clients (tool names, methods, ids, reasons) reach
//! log lines. A newline in one would start a forged line of its own, an
//! ESC sequence would recolour or rewrite the operator's terminal, and a
//! bidi override would reorder what follows. Every character of an event
//! that does not display itself is written escaped (`\u{a}`, `\u{1b}`,
//! `\u{202e}`, by [`crate::core::legible::visible`]), except the newline
//! that ends it; colours are off, so no ESC is ever ours.

use std::io::{self, Write};

use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Start logging to stderr (never stdout: in stdio mode it is the
/// protocol), filtered by `COUNTERSIGN_LOG` (default `info`). With
/// `tracer`, spans of [`crate::telemetry::TARGET`] go to OpenTelemetry,
/// and only they: the log filter never hides them, and no log event
/// becomes a span event (log lines may name keys and principals).
pub(crate) fn init(tracer: Option<opentelemetry_sdk::trace::SdkTracer>) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("COUNTERSIGN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Spans made for traces are not log lines, whatever the variable says.
    if let Ok(off) = format!("{}=off", crate::telemetry::TARGET).parse() {
        filter = filter.add_directive(off);
    }
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(Escaping(io::stderr))
        .event_format(Traced(Format::default().with_ansi(false)))
        .with_filter(filter);
    let logs = tracing_subscriber::registry().with(fmt);
    // Two types, not an `Option` layer: an absent layer declares an interest
    // in every callsite, and each disabled `debug!` on the hot path would
    // then be checked at every call. Both filters are static (per callsite).
    let _ = match tracer {
        Some(t) => logs
            .with(
                tracing_opentelemetry::layer().with_tracer(t).with_filter(
                    tracing_subscriber::filter::Targets::new()
                        .with_target(crate::telemetry::TARGET, tracing::Level::TRACE),
                ),
            )
            .try_init(),
        None => logs.try_init(),
    };
}

/// The default line format, with the `trace_id` and `span_id` of the call
/// it was written in at its end, when traces are on: a log line leads to
/// its trace.
struct Traced<F>(F);

impl<S, N, F> FormatEvent<S, N> for Traced<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let ids = if crate::telemetry::on() {
            crate::telemetry::ids(&tracing::Span::current())
        } else {
            None
        };
        let Some((trace_id, span_id)) = ids else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let line = line.strip_suffix('\n').unwrap_or(&line);
        writeln!(writer, "{line} trace_id={trace_id} span_id={span_id}")
    }
}

/// A [`MakeWriter`] whose writers escape control characters.
#[derive(Clone, Copy)]
pub(crate) struct Escaping<F>(pub F);

impl<'a, F, W> MakeWriter<'a> for Escaping<F>
where
    F: Fn() -> W + 'static,
    W: Write,
{
    type Writer = EscapingWriter<W>;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingWriter((self.0)())
    }
}

/// Writes each buffer with its control characters escaped, keeping one
/// final newline.
pub(crate) struct EscapingWriter<W>(W);

impl<W: Write> Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(escape(buf).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// The text of `buf` with every control character escaped, but a final
/// newline kept (the formatter writes one event per buffer).
pub(crate) fn escape(buf: &[u8]) -> String {
    let text = String::from_utf8_lossy(buf);
    let (body, end) = match text.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (text.as_ref(), ""),
    };
    // The rule every display of agent text follows: controls, bidi
    // overrides, zero-width and other invisible characters come out as
    // `\u{..}` (a log line's own escapes are left as they are).
    let mut out = crate::core::legible::visible(body).into_owned();
    out.push_str(end);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_client_value_cannot_start_a_line_or_send_escapes() {
        let event = "2026-11-30T10:00:00Z  WARN upstream call failed method=x\n2026-01-01T00:00:00Z WARN countersign::forged\u{1b}[2J\u{0}\u{202e}\n";
        let out = super::escape(event.as_bytes());
        assert_eq!(out.matches('\n').count(), 1, "{out}");
        assert!(out.ends_with('\n'));
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{0}') && !out.contains('\u{202e}'),
            "{out}"
        );
        assert!(
            out.contains("\\u{a}2026-01-01T00:00:00Z WARN countersign::forged\\u{1b}[2J\\u{0}"),
            "{out}"
        );
    }
}
