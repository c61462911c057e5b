"""A local model served over the OpenAI-compatible chat protocol, with injectable faults, for
trying endpoint policies (``python -m core.endpoint_server``).

    server          the HTTP server and its handler
    chat_request    the request parser (pure)
    chat_model      the model behind it
    bounded_server  connection cap and body limits
    client_watch    generation stops when the client leaves
    fault_plan      the faults a test asks for, and what the server saw
"""
import importlib

# Each name loads its module on first use (PEP 562), so importing one light module of this
# package (a dataclass, a pure function) does not load torch with its heavier siblings.
_EXPORTS = {
    "ChatModel": ("core.serve.server", "ChatModel"),
    "Limits": ("core.serve.server", "Limits"),
    "serve": ("core.serve.server", "serve"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
