"""``stream: true`` on the project's chat-completions server (core/serve/server.py): the reply as
server-sent events, read by the real openai client; agent harnesses that only stream (verifiers'
null harness, tests/fixtures/verifiers/toy_sum_taskset.py) can then run against it."""
from __future__ import annotations

import pytest

from core.serve.server import ChatModel, serve


@pytest.fixture(scope="module")
def url():
    srv = serve(ChatModel("tiny"))
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_a_streamed_reply_is_the_same_reply_in_chunks(url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url, api_key="unused")
    request = client.chat.completions.create
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "Say hi."}],
           "max_tokens": 8, "seed": 7, "temperature": 0.0}
    with client:  # its keep-alive connection closed: the server's shutdown waits for it
        whole = request(**ask)
        chunks = list(request(**ask, stream=True, stream_options={"include_usage": True}))
        with pytest.raises(openai.BadRequestError, match="stream"):
            request(**{**ask, "stream": "yes"})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
