"""A local model served over the OpenAI-compatible chat protocol, with injectable faults, for
trying endpoint policies (``python -m core.endpoint_server``).

    server          the HTTP routes (a starlette app on storage/asgi_serve.py's uvicorn)
    chat_request    the request parser (pure)
    chat_model      the model behind it
    generations     the model's work on one thread, off the event loop, from a bounded queue
    client_watch    generation stops when the client leaves
    fault_plan      the faults a test asks for, and what the server saw
"""
from core.faces import lazy_face

__getattr__, __all__ = lazy_face(__name__, {
    "ChatModel": "core.serve.server",
    "Limits": "core.serve.server",
    "serve": "core.serve.server",
})
