"""Tracing: each request to a front as a span of OpenTelemetry's, in the trace its caller started.

With tracing.endpoint set (an OTLP/HTTP collector), the API front and the HTTP front read W3C trace context
from a request (`traceparent`, `tracestate`; a malformed one is ignored and a trace starts here), open one
server span per request (service `<tracing.service_name>-api` or `-front`), and pass its context on to Triton:
gRPC metadata from the API front, HTTP headers from the HTTP front. tritonserver, started with OpenTelemetry
tracing towards the same collector (serving/launcher/triton_command.py), then adds its request span and the
compute spans to that trace, so one request is one trace. A caller's sampled traceparent is always traced;
a request without one is traced at tracing.sample_rate (the fronts' and Triton's). A coalesced Triton call
(serving/api/coalescer.py) carries the context of its first request. Off (endpoint ""), nothing here runs:
no provider, no spans, no headers.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping

from settings.schema import TracingSettings


class Tracing:
    """One process's spans, exported to tracing.endpoint; `None` of it exists while tracing is off, and
    OpenTelemetry is imported only when it is on."""

    def __init__(self, settings: TracingSettings, component: str) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace, self._context, self._propagator = trace, Context, TraceContextTextMapPropagator()
        resource = Resource.create({"service.name": f"{settings.service_name}-{component}"})
        # A request without a caller's context is sampled here, before OpenTelemetry sees it (request_span), so
        # the SDK traces every root it is given and follows a caller's flag.
        self.provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
        self.sample_rate, self._draw = settings.sample_rate, random.Random().random
        exporter = OTLPSpanExporter(endpoint=f"{settings.endpoint.rstrip('/')}/v1/traces")
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self.tracer = self.provider.get_tracer("bert-triton")

    @classmethod
    def of(cls, settings: TracingSettings, component: str) -> Tracing | None:
        return cls(settings, component) if settings.endpoint else None

    @contextlib.contextmanager
    def request_span(self, name: str, headers: Mapping[str, str], request_id: str) -> Iterator[dict[str, str]]:
        """A server span for one request, in the caller's trace if its headers carry one; yields the headers
        that pass this span's context on (empty when it is not sampled). A request without a traceparent that
        the sample rate leaves out costs one random draw, no span and no context: with the SDK's unsampled spans
        the API front served 5 % less at c=64 on an H200 at a 1 % rate (docs/deployment.md)."""
        if "traceparent" not in headers and self._draw() >= self.sample_rate:
            yield {}
            return
        parent = self._propagator.extract({key.lower(): value for key, value in headers.items()})
        with self.tracer.start_as_current_span(
            name, context=parent, kind=self._trace.SpanKind.SERVER, attributes={"request.id": request_id}
        ) as span:
            carrier: dict[str, str] = {}
            if span.get_span_context().trace_flags.sampled:
                self._propagator.inject(carrier, context=self._trace.set_span_in_context(span, self._context()))
            yield carrier

    def set_attribute(self, key: str, value: str) -> None:
        """An attribute of the request's span, if it has one (an unsampled request has none)."""
        self._trace.get_current_span().set_attribute(key, value)

    def shutdown(self) -> None:
        self.provider.shutdown()  # what is batched goes out before the process ends


def set_attribute(tracing: Tracing | None, key: str, value: str) -> None:
    """An attribute of the current request's span (the tenant, say); nothing with tracing off."""
    if tracing is not None:
        tracing.set_attribute(key, value)


def request_span(tracing: Tracing | None, name: str, headers: Mapping[str, str], request_id: str):
    """`tracing`'s span for one request (Tracing.request_span); with tracing off, none and no headers to pass on."""
    return contextlib.nullcontext({}) if tracing is None else tracing.request_span(name, headers, request_id)
