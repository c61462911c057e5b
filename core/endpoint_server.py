"""A small OpenAI-compatible chat-completions server for a local model, with injectable faults.

    python -m core.endpoint_server --model tiny --port 8000
    python -m core.train --model openai:http://127.0.0.1:8000/v1 --model-name tiny --env bandit

It is what the endpoint policy (core/endpoint.py) is tested against, and a way to try
``--model openai:URL`` without a GPU server: ``POST /v1/chat/completions`` renders the messages
with the model's chat template and samples with transformers ``generate``; ``GET /v1/models``
lists the one model. It honours ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
``top_p``, ``seed``, ``stop`` (cut before the stop string, which is not returned, as OpenAI and
vLLM do) and ``logprobs`` / ``top_logprobs`` (each returned token's logprob under the sampling
distribution, temperature applied). One request generates at a time (a lock); the others wait.

Authentication: with ``--api-key-env VAR`` a request must carry ``Authorization: Bearer``
followed by that variable's value (a key never appears on a command line), else 401.

Faults (``--faults FILE.json``, or ``server.faults`` when started in-process with ``serve``): a list
of rules, each ``{"fault": KIND, "when": TEXT, "times": N, ...}``. A request whose messages
contain ``when`` (every request when absent) gets the first rule that still has ``times`` left
(-1 = always). KIND: ``timeout`` (sleep ``delay`` seconds, default 30, then a 503), ``500``,
``503``, ``429`` (with ``Retry-After: retry_after``), ``malformed`` (a 200 whose body is not JSON),
``reply`` (answer ``text`` instead of sampling, cut at ``stop`` like a real answer, its logprobs
scored by the model), ``401``.
"""
from __future__ import annotations

import argparse
import codecs
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

MAX_TOKENS = 256
"""Default ``max_tokens`` when a request gives none."""


class ChatModel:
    """The model behind the server: chat template, sampling, per-token logprobs."""

    def __init__(self, model: str = "tiny"):
        from core.policy import load_base_model, load_tokenizer
        self.name = model
        self.tokenizer = load_tokenizer(model)
        self.net = load_base_model(model, len(self.tokenizer))
        self.lock = threading.Lock()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if hasattr(out, "keys") else out)
        text = "\n\n".join(str(m.get("content") or "") for m in messages) + "\n\n"
        return tok.encode(text, add_special_tokens=False)

    def complete(self, messages: list[dict], *, max_tokens: int, temperature: float, top_p: float,
                 seed: int | None, stop: list[str], top_k: int, reply: str | None = None) -> dict:
        """{"text", "finish_reason", "tokens": [(text, bytes, logprob, [(alt, logprob), ...])],
        "usage"}."""
        tok = self.tokenizer
        ids = self.prompt_ids(messages)
        with self.lock, torch.no_grad():
            if seed is not None:
                torch.manual_seed(int(seed) % 2 ** 63)
            if reply is None:
                gen, logps = self._sample(ids, max_tokens, temperature, top_p, stop)
            else:
                gen = tok.encode(reply, add_special_tokens=False)[:max_tokens]
                logps = self._score(ids, gen, temperature)
        eos = tok.eos_token_id
        ended = bool(gen) and gen[-1] == eos
        if ended:
            gen, logps = gen[:-1], logps[:-1]
        # Each token's text is what its bytes add to the UTF-8 decoded whole ("" for the first
        # part of a character split across tokens), so the texts always spell the content.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        raw = [token_bytes(tok, t) for t in gen]
        pieces = [decoder.decode(b) for b in raw]
        text = "".join(pieces) + decoder.decode(b"", final=True)
        cut = min([text.find(s) for s in stop if s and s in text], default=-1)
        finish = "stop" if ended or cut >= 0 else ("length" if len(gen) >= max_tokens else "stop")
        if cut >= 0:
            text = text[:cut]
        tokens, used = [], 0
        for piece, b, (lp, alts) in zip(pieces, raw, logps):  # the returned text's tokens only
            if used + len(piece) > len(text) or (used == len(text) and cut >= 0):
                break
            tokens.append((piece, b, lp, [(tok.decode([a]), v) for a, v in alts[:top_k]]))
            used += len(piece)
        return {"text": text, "finish_reason": finish, "tokens": tokens,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(gen),
                          "total_tokens": len(ids) + len(gen)}}

    def _sample(self, ids, max_tokens, temperature, top_p, stop):
        kwargs = dict(do_sample=temperature > 0, max_new_tokens=max_tokens,
                      output_scores=True, return_dict_in_generate=True,
                      pad_token_id=self.tokenizer.eos_token_id)
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        out = self.net.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                dtype=torch.long), **kwargs)
        gen = out.sequences[0, len(ids):].tolist()
        logps = []
        for token, scores in zip(gen, out.scores):
            # temperature-scaled: the processed scores are logits / T (top-p masks set -inf)
            logp = torch.log_softmax(scores[0].float(), -1)
            logps.append(self._entry(logp, token))
        return gen, logps

    def _score(self, ids, gen, temperature):
        if not gen:
            return []
        logits = self.net(torch.tensor([ids + gen])).logits[0, len(ids) - 1:-1].float()
        logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), -1)
        return [self._entry(row, t) for row, t in zip(logp, gen)]

    @staticmethod
    def _entry(logp: torch.Tensor, token: int, k: int = 20):
        top = torch.topk(logp, k)
        return float(logp[token]), list(zip(top.indices.tolist(), top.values.tolist()))


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's bytes_to_unicode), inverted."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
            + list(range(ord("\xae"), ord("\xff") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _byte_alphabet()


def token_bytes(tok, token_id: int) -> bytes:
    """The raw bytes of one token of a byte-level BPE vocabulary (its decoded text otherwise)."""
    piece = tok.convert_ids_to_tokens(token_id)
    if isinstance(piece, str) and piece and all(ch in _BYTE_OF for ch in piece) \
            and token_id not in set(getattr(tok, "all_special_ids", ()) or ()):
        return bytes(_BYTE_OF[ch] for ch in piece)
    return tok.decode([token_id]).encode("utf-8")


class FaultPlan:
    """The fault rules, consumed thread-safely (see the module docstring)."""

    def __init__(self, rules: list[dict] | None = None):
        self.lock = threading.Lock()
        self.rules = [dict(r) for r in rules or []]
        self.seen: list[dict] = []
        """Every request: its fault (or None), whether it carried the key (never the key), its
        seed and messages."""
        self.in_flight = self.most_in_flight = 0
        """Chat requests being answered now, and the most there ever were at once."""

    def enter(self, delta: int) -> None:
        with self.lock:
            self.in_flight += delta
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def take(self, body_text: str) -> dict | None:
        with self.lock:
            for rule in self.rules:
                if rule.get("times", 1) != 0 and rule.get("when", "") in body_text:
                    if rule.get("times", 1) > 0:
                        rule["times"] = rule.get("times", 1) - 1
                    return rule
        return None


def make_handler(model: ChatModel, faults: FaultPlan, api_key: str | None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        entered = False
        """A chat request of this connection is counted in flight (set by do_POST)."""

        def log_message(self, fmt, *args):  # quiet: tests and demos read their own output
            pass

        def _leave(self) -> None:
            """The request stops counting as in flight, once."""
            if self.entered:
                self.entered = False
                faults.enter(-1)

        def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
            # before the first byte goes out: a client that has its answer may send its next
            # request at once, and counted until after the write it would read as one too many
            self._leave()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                pass

        def _error(self, status: int, message: str, headers: dict | None = None) -> None:
            body = {"error": {"message": message, "type": "server_error", "code": status}}
            self._send(status, json.dumps(body).encode(), headers)

        def do_GET(self):
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._error(401, "invalid API key")
            elif self.path.rstrip("/").endswith("/models"):
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": model.name, "object": "model", "owned_by": "local"}]}).encode())
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self):
            faults.enter(1)
            self.entered = True
            try:
                self._post()
            finally:
                self._leave()

        def _post(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode("utf-8", "replace")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                return self._error(404, f"no route {self.path}")
            keyed = self.headers.get("Authorization") == f"Bearer {api_key}" if api_key else True
            rule = faults.take(raw)
            try:
                req = json.loads(raw)
                messages = req["messages"]
            except (ValueError, KeyError, TypeError):
                req, messages = {}, None
            with faults.lock:
                faults.seen.append({"fault": rule.get("fault") if rule else None,
                                    "authorized": keyed, "seed": req.get("seed"),
                                    "messages": messages})
            if not keyed or (rule and rule["fault"] == "401"):
                return self._error(401, "invalid API key")
            if not isinstance(messages, list):
                return self._error(400, "body must be JSON with messages")
            if int(req.get("n") or 1) != 1:
                return self._error(400, "n > 1 is not supported")
            kind = rule["fault"] if rule else None
            if kind == "timeout":  # the client has given up by now: answer without generating
                time.sleep(float(rule.get("delay", 30)))
                return self._error(503, "answered too late")
            if kind in ("500", "503"):
                return self._error(int(kind), "injected server error")
            elif kind == "429":
                return self._error(429, "rate limited",
                                   {"Retry-After": str(rule.get("retry_after", 1))})
            elif kind == "malformed":
                return self._send(200, b'{"id": "chatcmpl-broken", "choices": [{"mess')
            stop = req.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            top_k = int(req.get("top_logprobs") or 0) if req.get("logprobs") else 0
            out = model.complete(
                messages, max_tokens=int(req.get("max_completion_tokens") or req.get("max_tokens")
                                         or MAX_TOKENS),
                temperature=float(req.get("temperature", 1.0)),
                top_p=float(req.get("top_p", 1.0)), seed=req.get("seed"), stop=stop,
                top_k=top_k, reply=rule.get("text") if kind == "reply" else None)
            logprobs = None
            if req.get("logprobs"):
                logprobs = {"content": [
                    {"token": t, "logprob": lp, "bytes": list(b),
                     "top_logprobs": [{"token": a, "logprob": v, "bytes": list(a.encode())}
                                      for a, v in alts]}
                    for t, b, lp, alts in out["tokens"]]}
            body = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
                    "created": int(time.time()), "model": req.get("model", model.name),
                    "choices": [{"index": 0, "finish_reason": out["finish_reason"],
                                 "message": {"role": "assistant", "content": out["text"]},
                                 "logprobs": logprobs}],
                    "usage": out["usage"]}
            self._send(200, json.dumps(body).encode())

    return Handler


def serve(model: ChatModel, host: str = "127.0.0.1", port: int = 0,
          faults: list[dict] | None = None, api_key: str | None = None) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; ``server.server_address`` has the port, ``server.faults``
    the fault plan (``server.faults.rules`` may be replaced between requests). Stop with
    ``server.shutdown(); server.server_close()`` (the second waits for requests in flight)."""
    plan = FaultPlan(faults)
    server = ThreadingHTTPServer((host, port), make_handler(model, plan, api_key))
    # server_close() waits for the requests in flight: none is cut off in the middle of torch
    server.daemon_threads, server.block_on_close = False, True
    server.faults = plan
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    import os
    parser = argparse.ArgumentParser(prog="python -m core.endpoint_server",
                                     description="Serve a local model over the OpenAI "
                                                 "chat-completions protocol.")
    parser.add_argument("--model", default="tiny", help="tiny | smollm2-135m | a local HF dir")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--faults", metavar="FILE.json", help="fault rules (module docstring)")
    parser.add_argument("--api-key-env", metavar="VAR",
                        help="require Authorization: Bearer $VAR on every request")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            parser.error(f"--api-key-env {args.api_key_env}: that variable is not set")
    rules = json.loads(open(args.faults).read()) if args.faults else None
    server = serve(ChatModel(args.model), args.host, args.port, rules, key)
    host, port = server.server_address[:2]
    print(f"serving {args.model} at http://{host}:{port}/v1 (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
