"""OpenTelemetry in: an OTLP/HTTP receiver that turns agents' spans into trajectories.

    receiver    ``agentrl otlp`` / ``python -m storage.otlp``: the ASGI app on uvicorn, its limits
    decode      protobuf / JSON / gzip bodies -> ``Span`` and ``LogRecord`` (opentelemetry-proto)
    conventions GenAI (span and event mode), OpenInference and rl-insight spans -> calls and tools
    assemble    routing what arrives into open conversations, bounded
    record      a conversation's spans -> a generic trajectory record
    store       raw spans and log records appended to ``spans`` / ``span_logs`` before the 200
    writer      trajectories derived from the stored spans, through the import writer
"""
from storage.otlp.assemble import Assembler, Bounds
from storage.otlp.receiver import Limits, Receiver, main

__all__ = ["Assembler", "Bounds", "Limits", "Receiver", "main"]
