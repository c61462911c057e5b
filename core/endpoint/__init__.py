"""The OpenAI-compatible endpoint policy's client: one bounded request (transport), the reply's
fields checked (reply), and the chat client with retries and backoff (client)."""
from core.endpoint.client import PREFIX, ChatClient, EndpointError, EndpointRefused

__all__ = ["ChatClient", "EndpointError", "EndpointRefused", "PREFIX"]
