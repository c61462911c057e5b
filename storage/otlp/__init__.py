"""OpenTelemetry in: an OTLP/HTTP receiver that turns agents' spans into trajectories.

    receiver    ``agentrl otlp`` / ``python -m storage.otlp``: the HTTP server, its limits
    decode      protobuf / JSON / gzip bodies -> ``Span`` and ``LogRecord`` (opentelemetry-proto)
    conventions GenAI (span and event mode), OpenInference and rl-insight spans -> calls and tools
    assemble    open conversations -> generic trajectory records, bounded
    writer      raw spans into ``spans`` / ``span_logs``, trajectories through the import writer
"""
from storage.otlp.assemble import Assembler, Bounds
from storage.otlp.receiver import Limits, Receiver, main

__all__ = ["Assembler", "Bounds", "Limits", "Receiver", "main"]
