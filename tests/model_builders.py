"""Tiny random causal LMs of other families, written at test time into a directory that
``--model DIR`` loads (no downloads): the SmolLM2 tokenizer's files with another chat template
(and, for Llama 3, its special tokens), and a small random network of the family.

* ``qwen2``   Qwen2ForCausalLM, Qwen2's ChatML template (its default system message when none).
* ``llama3``  LlamaForCausalLM, Llama 3's header/eot template and special tokens, eos <|eot_id|>.
* ``gpt2``    GPT2LMHeadModel (Conv1D layers) and no chat template at all: raw prompts.
"""
from __future__ import annotations

from pathlib import Path

import torch

QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
FAMILIES = ("qwen2", "llama3", "gpt2")
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048)


def build(family: str, folder: Path) -> Path:
    """Write a tiny random model of ``family`` (and its tokenizer) into ``folder``; return it."""
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)

    from core.model.policy import load_tokenizer
    tok = load_tokenizer("tiny")
    if family == "qwen2":
        tok.chat_template = QWEN2_TEMPLATE
        tok.eos_token = "<|im_end|>"
    elif family == "llama3":
        tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIAL})
        tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
        tok.chat_template = LLAMA3_TEMPLATE
    elif family == "gpt2":
        tok.chat_template = None
    else:
        raise ValueError(family)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    torch.manual_seed(0)
    if family == "qwen2":
        net = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True,
                                           **SMALL, **ids))
    elif family == "llama3":
        net = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), tie_word_embeddings=False,
                                           **SMALL, **ids))
    else:
        net = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4,
                                         n_positions=2048, **ids))
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


GGUF_VOCAB = 4096
"""Tokens of the SmolLM2 vocabulary kept in the GGUF test model (its first ids: the special
tokens, the byte alphabet and the commonest merges), so that transformers' GGUF tokenizer
conversion takes seconds, not minutes; any text still tokenizes, in more pieces."""


def build_gguf(path: Path) -> Path:
    """A tiny random Llama written as a GGUF file (fp32 tensors) with a cut-down SmolLM2 BPE
    tokenizer and a ChatML template, as ``llama.cpp``'s converter lays such a file out."""
    import json

    import gguf
    import numpy as np

    from core.model.policy import cache_root, load_tokenizer
    load_tokenizer("tiny")  # makes sure the SmolLM2 tokenizer files are cached
    spec = json.loads((cache_root() / "smollm2-tokenizer" / "tokenizer.json").read_text())
    tokens = [""] * len(spec["model"]["vocab"])
    for text, i in spec["model"]["vocab"].items():
        tokens[i] = text
    tokens = tokens[:GGUF_VOCAB]
    keep = set(tokens)
    merges = [m if isinstance(m, list) else m.split(" ") for m in spec["model"]["merges"]]
    merges = [f"{a} {b}" for a, b in merges if a in keep and b in keep and a + b in keep]
    special = {a["id"] for a in spec.get("added_tokens", []) if a.get("special")}
    hidden, layers, ffn, heads, kv = 64, 2, 128, 4, 2
    head_dim = hidden // heads
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("agentrl-test-tiny")
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
                       for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(QWEN2_TEMPLATE)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int, ones: bool = False) -> None:
        data = np.ones(shape) if ones else rng.standard_normal(shape) * 0.02
        w.add_tensor(name, data.astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden)
    tensor("output_norm.weight", hidden, ones=True)
    for i in range(layers):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", hidden, ones=True)
        tensor(p + "ffn_norm.weight", hidden, ones=True)
        tensor(p + "attn_q.weight", hidden, hidden)
        tensor(p + "attn_k.weight", kv * head_dim, hidden)
        tensor(p + "attn_v.weight", kv * head_dim, hidden)
        tensor(p + "attn_output.weight", hidden, hidden)
        tensor(p + "ffn_gate.weight", ffn, hidden)
        tensor(p + "ffn_up.weight", ffn, hidden)
        tensor(p + "ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
