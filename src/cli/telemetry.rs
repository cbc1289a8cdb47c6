//! `serve`'s trace export (DESIGN.md section 18): where spans go, and the
//! bounded queue between the calls that end them and the collector.
//!
//! A call never waits for the collector. A finished span is put in a
//! queue of `max_queue` spans without blocking; a full queue drops it and
//! counts it (`countersign_trace_spans{result="dropped"}`, logged once).
//! One task sends batches of up to `max_batch` spans, each request bounded
//! by `timeout`; a batch the collector refuses or never answers is counted
//! as `failed` and logged when the collector starts and stops answering.
//! The OpenTelemetry SDK's own batch processor keeps its drop count to
//! itself, hence this small one; the exporter (OTLP/HTTP protobuf) is the
//! official one, given the gateway's own HTTP client.

use anyhow::Context as _;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, oneshot};

use crate::core::config::{TelemetryConfig, UpstreamTls, SAMPLERS};

/// Where traces go and how, once `[telemetry]` and the `OTEL_*` variables
/// are read.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The full OTLP/HTTP traces url (`.../v1/traces`).
    pub endpoint: String,
    /// `service.name`.
    pub service_name: String,
    /// The sampler's name (one of [`SAMPLERS`]) and ratio.
    pub sampler: (String, Option<f64>),
    /// Opt-ins: arguments and results in spans.
    pub arguments: bool,
    pub results: bool,
    pub max_queue: usize,
    pub max_batch: usize,
    pub export_interval: Duration,
    pub timeout: Duration,
    pub tls: Option<UpstreamTls>,
}

/// The settings `c` and the environment `env` give, or `None` when traces
/// stay off. What `[telemetry]` sets wins over the variables. A value that
/// cannot be used is an error naming where it came from: a gateway told to
/// trace does not start without tracing.
pub(crate) fn settings(
    c: &TelemetryConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Settings>, String> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if c.enabled == Some(false) {
        return Ok(None);
    }
    if c.enabled.is_none()
        && (var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none")))
    {
        return Ok(None);
    }
    let http = |url: &str, from: &str| {
        if url.starts_with("http://") || url.starts_with("https://") {
            Ok(())
        } else {
            Err(format!("{from} `{url}` must be an http:// or https:// url"))
        }
    };
    let traces = |base: &str| format!("{}/v1/traces", base.trim_end_matches('/'));
    let endpoint = if let Some(base) = &c.endpoint {
        traces(base)
    } else if let Some(url) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        http(&url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?;
        url
    } else if let Some(base) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        http(&base, "OTEL_EXPORTER_OTLP_ENDPOINT")?;
        traces(&base)
    } else if c.enabled == Some(true) {
        traces("http://localhost:4318")
    } else {
        return Ok(None);
    };
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = var(name) {
            if p != "http/protobuf" {
                return Err(format!(
                    "{name} `{p}`: countersign exports traces over http/protobuf only"
                ));
            }
        }
    }
    let service_name = c
        .service_name
        .clone()
        .or_else(|| var("OTEL_SERVICE_NAME"))
        .unwrap_or_else(|| "countersign".to_owned());
    let sampler = match &c.sampler {
        Some(s) => (s.clone(), c.sampler_arg),
        None => match var("OTEL_TRACES_SAMPLER") {
            Some(s) => {
                if !SAMPLERS.contains(&s.as_str()) {
                    return Err(format!(
                        "OTEL_TRACES_SAMPLER `{s}` is not one of {}",
                        SAMPLERS.join(", ")
                    ));
                }
                let arg = match var("OTEL_TRACES_SAMPLER_ARG") {
                    None => None,
                    Some(a) => match a.parse::<f64>() {
                        Ok(r) if (0.0..=1.0).contains(&r) => Some(r),
                        _ => {
                            return Err(format!(
                                "OTEL_TRACES_SAMPLER_ARG `{a}` must be a number between 0 and 1"
                            ))
                        }
                    },
                };
                (s, arg)
            }
            None => ("parentbased_always_on".to_owned(), None),
        },
    };
    Ok(Some(Settings {
        endpoint,
        service_name,
        sampler,
        arguments: c.arguments,
        results: c.results,
        max_queue: c.max_queue,
        max_batch: c.max_batch,
        export_interval: c.export_interval,
        timeout: c.timeout,
        tls: c.tls.clone(),
    }))
}

fn sampler(name: &str, arg: Option<f64>) -> Sampler {
    let ratio = arg.unwrap_or(1.0);
    match name {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
        }
        _ => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
    }
}

/// The running export: the tracer the log layer feeds, and what stops it.
pub(crate) struct Export {
    /// The tracer for `tracing-opentelemetry`.
    pub tracer: SdkTracer,
    provider: SdkTracerProvider,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Export {
    /// Send what is queued (up to `grace`), then stop.
    pub(crate) async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(());
        if tokio::time::timeout(grace, self.task).await.is_err() {
            tracing::warn!("traces: the last spans were not sent within {grace:?}");
        }
        let _ = self.provider.shutdown();
    }
}

/// Start exporting with `s` (on the current runtime).
pub(crate) fn start(s: &Settings) -> anyhow::Result<Export> {
    let tls = crate::upstream::tls::collector_config(s.tls.as_ref())?;
    // No redirects: one could send spans to a host nobody configured.
    let http = crate::upstream::tls::http_client(tls, s.timeout, "the trace collector")?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Collector(http))
        .with_endpoint(&s.endpoint)
        .with_timeout(s.timeout)
        .build()
        .with_context(|| format!("traces: the exporter to `{}`", s.endpoint))?;
    let resource = Resource::builder()
        .with_service_name(s.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    exporter.set_resource(&resource);
    let (tx, rx) = mpsc::channel(s.max_queue);
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(export(
        exporter,
        rx,
        stopped,
        s.max_batch,
        s.export_interval,
        s.endpoint.clone(),
    ));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Queue { tx })
        .with_sampler(sampler(&s.sampler.0, s.sampler.1))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("countersign");
    crate::telemetry::enable(s.arguments, s.results);
    Ok(Export {
        tracer,
        provider,
        stop,
        task,
    })
}

/// The span processor: a bounded queue that never blocks a call.
#[derive(Debug)]
struct Queue {
    tx: mpsc::Sender<SpanData>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() && crate::telemetry::counts().dropped() {
            tracing::warn!(
                "traces: the export queue is full (the collector is slow or down): spans are dropped and counted in countersign_trace_spans{{result=\"dropped\"}}; this is logged once"
            );
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task: a batch when `max_batch` spans are queued or
/// `interval` after the first, one request at a time.
async fn export(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<SpanData>,
    mut stop: oneshot::Receiver<()>,
    max_batch: usize,
    interval: Duration,
    endpoint: String,
) {
    let counts = crate::telemetry::counts();
    let mut answering = true;
    let mut stopping = false;
    let mut batch = Vec::with_capacity(max_batch);
    while !stopping {
        tokio::select! {
            n = rx.recv_many(&mut batch, max_batch) => if n == 0 { break },
            _ = &mut stop => stopping = true,
        }
        let deadline = tokio::time::Instant::now() + interval;
        while !stopping && batch.len() < max_batch {
            let room = max_batch - batch.len();
            tokio::select! {
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
                () = tokio::time::sleep_until(deadline) => break,
                _ = &mut stop => stopping = true,
            }
        }
        if stopping {
            while let Ok(span) = rx.try_recv() {
                batch.push(span);
            }
        }
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(max_batch));
            let sent = std::mem::replace(&mut batch, rest);
            let n = sent.len();
            match exporter.export(sent).await {
                Ok(()) => {
                    counts.exported(n);
                    if !answering {
                        tracing::info!(%endpoint, "traces: the collector answers again");
                        answering = true;
                    }
                }
                Err(e) => {
                    counts.failed(n);
                    if answering {
                        tracing::warn!(%endpoint, "traces: an export failed ({e}); spans are lost until the collector answers (countersign_trace_spans{{result=\"failed\"}})");
                        answering = false;
                    }
                }
            }
        }
    }
}

/// The exporter's HTTP client: the gateway's reqwest, with the
/// collector's TLS settings, a time limit and no redirects.
#[derive(Debug)]
struct Collector(reqwest::Client);

/// The most of a collector's answer that is read (its partial-success
/// message at most).
const MAX_ANSWER: usize = 64 * 1024;

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Collector {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let mut resp = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await
            .map_err(|e| crate::upstream::error_chain(&e))?;
        let status = resp.status();
        let headers = std::mem::take(resp.headers_mut());
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if body.len() + chunk.len() > MAX_ANSWER {
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let mut answer = http::Response::new(bytes::Bytes::from(body));
        *answer.status_mut() = status;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn off_by_default_and_on_with_an_endpoint_from_either_place() {
        let c = TelemetryConfig::default();
        assert!(settings(&c, &env(&[])).unwrap().is_none());
        let on = settings(
            &c,
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(on.endpoint, "http://c:4318/v1/traces");
        assert_eq!(on.service_name, "countersign");
        assert_eq!(on.sampler, ("parentbased_always_on".to_owned(), None));
        let signal = settings(
            &c,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(signal.endpoint, "http://t:1/x");
        let configured = TelemetryConfig {
            endpoint: Some("http://mine:4318".into()),
            service_name: Some("gw-1".into()),
            ..TelemetryConfig::default()
        };
        let s = settings(
            &configured,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SERVICE_NAME", "other"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint, "http://mine:4318/v1/traces");
        assert_eq!(s.service_name, "gw-1");
    }

    #[test]
    fn the_standard_switches_turn_it_off() {
        let c = TelemetryConfig::default();
        for off in [
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "true"),
            ][..],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_EXPORTER", "none"),
            ],
        ] {
            assert!(settings(&c, &env(off)).unwrap().is_none());
        }
        let never = TelemetryConfig {
            enabled: Some(false),
            endpoint: Some("http://mine:4318".into()),
            ..TelemetryConfig::default()
        };
        assert!(settings(&never, &env(&[])).unwrap().is_none());
    }

    #[test]
    fn unusable_variables_are_named() {
        let c = TelemetryConfig::default();
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let cases: [(&[(&str, &str)], &str); 4] = [
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT `c:4318`",
            ),
            (
                &[base, ("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER `sometimes`",
            ),
            (
                &[
                    base,
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER_ARG `2`",
            ),
            (
                &[base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "http/protobuf only",
            ),
        ];
        for (vars, says) in cases {
            let err = settings(&c, &env(vars)).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        let ratio = settings(
            &c,
            &env(&[
                base,
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            ratio.sampler,
            ("parentbased_traceidratio".to_owned(), Some(0.25))
        );
    }
}
