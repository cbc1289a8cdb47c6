"""OpenTelemetry for the trace tests' MCP peers: the official Python SDK
(`opentelemetry-sdk`) and its OTLP/HTTP exporter, set up from the standard
`OTEL_EXPORTER_OTLP_ENDPOINT`. With it installed, the `mcp` SDK's client
makes a CLIENT span per request and injects its context into
`params._meta` (SEP-414), and its server continues the context it finds
there in a SERVER span; both are the SDK's own behaviour, not ours.
"""

import os


def setup(service: str):
    """A tracer provider exporting every span as it ends, or None."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider
