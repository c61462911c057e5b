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

    from core.policy import load_tokenizer
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
