"""The model behind core/serve/server.py: chat template, sampling with per-token logprobs,
and generation that stops between tokens once the request's ``ClientWatch`` stops (the client
left, or the deadline passed), so the one generation lock is not held for a departed client.
"""
from __future__ import annotations

import codecs
import threading

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from core.model.policy import load_base_model, load_tokenizer
from core.serve.client_watch import ClientWatch


class ChatModel:
    """The model behind the server: chat template, sampling, per-token logprobs."""

    def __init__(self, model: str = "tiny"):
        self.name = model
        self.tokenizer = load_tokenizer(model)
        self.net = load_base_model(model, len(self.tokenizer))
        self.lock = threading.Lock()
        cfg = self.net.config
        self.context = int(getattr(cfg, "max_position_embeddings", None)
                           or getattr(cfg, "n_positions", None) or 2048)
        """The model's context in tokens: prompt plus completion never exceed it."""
        longest = max((len(piece) for piece in self.tokenizer.get_vocab()), default=1)
        self.max_prompt_chars = 2 * self.context * max(longest, 1)
        """Message text longer than this cannot fit the context: no token spells more than the
        vocabulary's longest piece (2x for a normaliser that folds characters). Refused before
        the tokenizer sees it: a 4 MiB prompt held the one worker ~30 s to learn it was too long."""

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if hasattr(out, "keys") else out)
        text = "\n\n".join(str(m.get("content") or "") for m in messages) + "\n\n"
        return tok.encode(text, add_special_tokens=False)

    def complete(self, ids: list[int], *, max_tokens: int, temperature: float, top_p: float,
                 seed: int | None, stop: list[str], top_k: int, reply: str | None = None,
                 watch: ClientWatch | None = None) -> dict | None:
        """{"text", "finish_reason", "tokens": [(text, bytes, logprob, [(alt, logprob), ...])],
        "usage"} for the prompt ``ids``. With a ``watch``, sampling stops between tokens once it
        stops (client gone, deadline; then see ``watch.reason``), and None when it stopped
        before the lock was free."""
        tok = self.tokenizer
        if watch is not None and not watch.acquire(self.lock):
            return None
        if watch is None:
            self.lock.acquire()
        try:
            with torch.no_grad():
                if seed is not None:
                    torch.manual_seed(int(seed) % 2 ** 63)
                if reply is None:
                    gen, logps = self._sample(ids, max_tokens, temperature, top_p, stop, watch)
                else:
                    gen = tok.encode(reply, add_special_tokens=False)[:max_tokens]
                    logps = self._score(ids, gen, temperature)
        finally:
            self.lock.release()
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

    def _sample(self, ids, max_tokens, temperature, top_p, stop, watch):
        steps = _EachStep(watch, self._entry, stop, lambda t: token_bytes(self.tokenizer, t))
        kwargs = dict(do_sample=temperature > 0, max_new_tokens=max_tokens,
                      output_scores=True, return_dict_in_generate=True,
                      pad_token_id=self.tokenizer.eos_token_id,
                      stopping_criteria=StoppingCriteriaList([steps]))
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        out = self.net.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                dtype=torch.long), **kwargs)
        gen = out.sequences[0, len(ids):].tolist()
        return gen, steps.entries[:len(gen)]

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


class _EachStep(StoppingCriteria):
    """What ``generate`` calls after each sampled token (batch of one): the token's entry
    (logprob and top 20) under the distribution it was sampled from, and whether to stop.

    The processed scores are temperature-scaled logits (top-p masks set -inf), so their
    log-softmax is the sampling distribution. Taken here, step by step, rather than from
    ``out.scores`` at the end: the step's full-vocabulary row is then emptied, so a generation
    keeps 21 numbers per token instead of the vocabulary (49,152 floats, 192 KiB, per token for
    tiny: 786 MB for 4,000 tokens). ``generate`` reads a step's scores only before this call.

    The request's ``stop`` strings are looked for here too, in the text decoded so far (only
    where a new token can complete one), not by transformers' ``stop_strings``: that one
    precomputes, per stop string, a table over the whole vocabulary before the first token and
    caches eight of them for the process (a 10,000-character stop string: 22 s on the one
    worker and 1 GB kept; four of them over 60 s)."""

    def __init__(self, watch: ClientWatch | None, entry, stop: list[str] = (),
                 to_bytes=None):
        self.watch, self.entry, self.entries = watch, entry, []
        self.stop, self.to_bytes = [s for s in stop if s], to_bytes
        self.text = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _stopped(self, token: int) -> bool:
        """Whether the text now holds a stop string (one that ends in the newest token's part)."""
        if not self.stop:
            return False
        before = len(self.text)
        self.text += self._decoder.decode(self.to_bytes(token))
        return any(s in self.text[max(0, before - len(s) + 1):] for s in self.stop)

    def __call__(self, input_ids, scores, **kwargs):
        last = scores[-1]
        self.entries.append(self.entry(torch.log_softmax(last[0].float(), -1),
                                       int(input_ids[0, -1])))
        last.set_()  # frees the row's storage; the tuple keeps an empty tensor
        stop = self._stopped(int(input_ids[0, -1])) or \
            (self.watch is not None and self.watch.stop())
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool,
                          device=input_ids.device)


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
