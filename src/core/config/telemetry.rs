//! `[telemetry]`: OpenTelemetry traces (DESIGN.md section 18).

use super::*;

/// `[telemetry]` (DESIGN.md section 18): OpenTelemetry traces over
/// OTLP/HTTP (protobuf). Off unless an endpoint is given, here or in the
/// standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`)
/// variable; what is set here wins over the variables.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `false` keeps traces off even when an `OTEL_*` endpoint is set.
    pub enabled: Option<bool>,
    /// The collector's base url (`http://collector:4318`); spans go to its
    /// `/v1/traces`, as with `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    /// `service.name` (default: `OTEL_SERVICE_NAME`, else `countersign`).
    pub service_name: Option<String>,
    /// The sampler, named as `OTEL_TRACES_SAMPLER` names it (default: that
    /// variable, else `parentbased_always_on`).
    pub sampler: Option<String>,
    /// The ratio of the `traceidratio` samplers (as `OTEL_TRACES_SAMPLER_ARG`).
    pub sampler_arg: Option<f64>,
    /// Record each call's arguments (`gen_ai.tool.call.arguments`). Off:
    /// they may hold personal data or secrets.
    pub arguments: bool,
    /// Record each tool result (`gen_ai.tool.call.result`). Off, as above.
    pub results: bool,
    /// Finished spans waiting for export at most; more are dropped and
    /// counted (`countersign_trace_spans{result="dropped"}`).
    pub max_queue: usize,
    /// Spans per export request at most.
    pub max_batch: usize,
    /// How long finished spans wait to fill a batch.
    #[serde(deserialize_with = "duration")]
    pub export_interval: Duration,
    /// How long one export request may take.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// TLS to an https collector (as `[servers.NAME.tls]`).
    pub tls: Option<UpstreamTls>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            enabled: None,
            endpoint: None,
            service_name: None,
            sampler: None,
            sampler_arg: None,
            arguments: false,
            results: false,
            max_queue: 2048,
            max_batch: 512,
            export_interval: Duration::from_secs(2),
            timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

/// The sampler names of `OTEL_TRACES_SAMPLER` that countersign takes.
pub const SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

impl TelemetryConfig {
    /// `[telemetry]`: an http(s) endpoint, a known sampler with a ratio in
    /// [0, 1], a queue and a batch of at least one span.
    pub(super) fn check(&self, path: &Path) -> Result<(), ConfigError> {
        if let Some(url) = &self.endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(
                    path,
                    format!("telemetry.endpoint `{url}` must be an http:// or https:// url"),
                ));
            }
        }
        if let Some(s) = &self.sampler {
            if !SAMPLERS.contains(&s.as_str()) {
                return Err(invalid(
                    path,
                    format!(
                        "telemetry.sampler `{s}` is not one of {}",
                        SAMPLERS.join(", ")
                    ),
                ));
            }
        }
        if let Some(r) = self.sampler_arg {
            if !(0.0..=1.0).contains(&r) {
                return Err(invalid(
                    path,
                    format!("telemetry.sampler_arg {r} must be between 0 and 1"),
                ));
            }
        }
        if self.max_queue == 0 || self.max_batch == 0 {
            return Err(invalid(
                path,
                "telemetry.max_queue and telemetry.max_batch must be at least 1".into(),
            ));
        }
        if self.timeout.is_zero() || self.export_interval.is_zero() {
            return Err(invalid(
                path,
                "telemetry.timeout and telemetry.export_interval must be more than 0".into(),
            ));
        }
        Ok(())
    }
}
