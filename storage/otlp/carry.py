"""For the agent's side: a span processor that puts the trajectory's identity on every span as it
starts, so the receiver (``agentrl otlp``) names the task from the agent's first span on.

An OpenTelemetry SDK exports a span when it ends, and an agent's root span (the one that carries
``agentrl.task_id``) ends last: until then the receiver only sees the LLM and tool spans below
it, and an open trajectory could only be named by its prompt's hash. With this processor each
span starts with ``agentrl.task_id``, ``agentrl.group_id``, ``agentrl.split`` and
``agentrl.step`` (conventions.py ``IDENTITY``) taken from its parent span (set them on the root
span when it starts), else from the OpenTelemetry baggage of its context (when spans are made
by an instrumentation, the agent's code only sets the baggage); a value the span was started
with is kept, and one that can name nothing (a list, text over 256 characters) is not copied.
Install it before the exporter's processor::

    from storage.otlp.carry import CarryIdentity
    provider = TracerProvider(resource=...)
    provider.add_span_processor(CarryIdentity())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=...)))
    with tracer.start_as_current_span("invoke_agent", attributes={"agentrl.task_id": "add"}):
        ...  # every span started here carries agentrl.task_id = "add"

    # or, around code whose spans an instrumentation makes:
    token = context.attach(baggage.set_baggage("agentrl.task_id", "add"))

An agent process that runs one trajectory can instead put ``agentrl.task_id`` on its resource,
which the receiver reads too. ``export --format otlp`` (storage/otlp_export.py) writes the
identity on every span itself.
"""
from __future__ import annotations

from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from storage.otlp.conventions import IDENTITY

MAX_CARRIED_CHARS = 256
"""The longest text copied (storage/interchange.py ``MAX_ID_CHARS``): a longer task or group id
fails its trajectory at the receiver anyway, and copied onto every span it would multiply each
export's size by its span count (a 10 MB value on the root, 10 MB a span)."""


def _carried(value):
    """``value`` if it can name a task, group, split or step (a number, or text of at most
    ``MAX_CARRIED_CHARS``), else None: not copied (the span it was set on keeps it)."""
    if isinstance(value, str):
        return value if 0 < len(value) <= MAX_CARRIED_CHARS else None
    return value if isinstance(value, (int, float)) else None


class CarryIdentity(SpanProcessor):
    """Copies the IDENTITY attributes from a span's parent (or its context's baggage) onto the
    span as it starts (module docstring)."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        parent = trace.get_current_span(parent_context)
        inherited = getattr(parent, "attributes", None) or {}
        own = span.attributes or {}
        for key in IDENTITY:
            if key in own:
                continue
            value = _carried(inherited.get(key))
            if value is None:
                value = _carried(baggage.get_baggage(key, parent_context))
            if value is not None:
                span.set_attribute(key, value)

    def on_end(self, span: ReadableSpan) -> None:
        return None
