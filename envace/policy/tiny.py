"""A tiny, fully offline chat model for tests and CPU smoke runs.

This module owns the tiny tokenizer (a byte-level BPE trained in code on a small corpus, with Qwen2's NFC
normaliser and pre-tokenizer regex so that ``AutoTokenizer`` reloads it identically), its Qwen2.5-style chat
template (tools, ``{% generation %}`` assistant masks), the tiny random ``Qwen2ForCausalLM`` built on it, and
``save_tiny`` which writes both to a directory loadable with ``from_pretrained``. Nothing here touches the network.
"""

from __future__ import annotations

import functools
import json

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

QWEN_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501

# Control tokens, stripped by ``decode(skip_special_tokens=True)``. ``<|endoftext|>`` is id 0 (the pad token).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Markup tags: single tokens as in Qwen2.5/3, but not "special", so decoding with skip_special_tokens keeps them.
MARKUP = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<execution_result>",
    "</execution_result>",
]

# Qwen2.5-style ChatML template with tools; {% generation %} marks assistant tokens so that
# apply_chat_template(..., return_assistant_tokens_mask=True) yields a loss mask.
CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- generation %}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{%- if message.content or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>' }}
{%- endgeneration %}
{{- '\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""  # noqa: E501

_CORPUS_LINES = [
    "You are a helpful assistant. The user asks a question and the assistant answers.",
    'Call a tool: {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > ; : , . ! ?",
    "Solve 12 * 7 = 84. Step by step: first multiply, then check the result, then answer.",
    "# Tools\nfunction, arguments, name, type, object, string, number, properties, required, description",
    '<tool_call>\n{"name": "get_balance", "arguments": {"account_id": "A-1001"}}\n</tool_call>',
    '<tool_call>\n{"name": "transfer", "arguments": {"from_account": "A-1", "to_account": "B-2", "amount": 250}}\n'
    "</tool_call>",
    '<execution_result>\n{"balance": 1250.5, "currency": "USD", "account_id": "A-1001"}\n</execution_result>',
    '<execution_result>\n{"error": "insufficient funds", "status": "failed"}\n</execution_result>',
    '<tool_response>\n{"status": "ok", "deposit": 100, "new_balance": 1350.5}\n</tool_response>',
    "The deposit to your account succeeded. Your balance is now 1350.50 after the transfer of the amount.",
    "You are the environment: reply with the tool's execution result as JSON. Error: account not found.",
    "The balance of the account after the deposit and the transfer: amount, error, status, currency, funds.",
]
CORPUS = _CORPUS_LINES * 20


def domain_corpus() -> list[str]:
    """Texts of the built-in bank domain: the tools block of its prompts, its system prompt, the rehearse prompt.

    The tiny tokenizer is also trained on these, so the embedded demo's prompts (mostly tool schemas) take about
    half as many tokens: training cost falls roughly with the square of the prompt length.
    """
    from envace.builtin.bank import Bank
    from envace.builtin.make_tasks import SYSTEM_PROMPT
    from envace.envs.real import tool_schemas_from_class
    from envace.roles.rehearse import default_system_prompt

    schemas = [json.dumps(s, ensure_ascii=False) for s in tool_schemas_from_class(Bank)]
    preamble = CHAT_TEMPLATE.split("{%- for tool in tools %}")[0]
    return [SYSTEM_PROMPT, default_system_prompt(), preamble, *schemas]


@functools.lru_cache(maxsize=4)
def _trained_tokenizer_json(vocab_size: int) -> str:
    """Train the byte-level BPE once per ``vocab_size`` and return it serialised (immutable, so safe to cache)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    # Same pre-tokenizer as transformers' Qwen2Tokenizer, so AutoTokenizer (which maps
    # model_type qwen2 -> Qwen2Tokenizer) encodes exactly as the trained tokenizer does.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text encodes
    )
    tok.train_from_iterator(CORPUS + domain_corpus() * 20, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP])
    return tok.to_str()


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Build the tiny tokenizer (deterministic; training is cached, every call returns a fresh object).

    Args:
        vocab_size: BPE vocabulary size before the markup tokens are added (the trainer may stop earlier when the
            corpus has no more merges).

    Returns:
        A fast tokenizer with ``<|endoftext|>`` as pad (id 0), ``<|im_end|>`` as eos, the markup tags as single
        non-special tokens, left padding and the Qwen2.5-style tools chat template.
    """
    tok = Tokenizer.from_str(_trained_tokenizer_json(vocab_size))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
        padding_side="left",
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    max_positions: int = 2048,
) -> Qwen2ForCausalLM:
    """Build a random tiny Qwen2 causal LM for ``tokenizer`` (deterministic in ``seed``; global RNG untouched).

    Args:
        tokenizer: the tokenizer whose vocabulary, eos and pad ids the model uses.
        hidden: hidden size (must be divisible by ``heads``); the MLP is ``2 * hidden`` wide.
        layers: number of decoder layers.
        heads: attention heads.
        kv_heads: key/value heads (grouped-query attention; must divide ``heads``).
        seed: seed of the weight initialisation.
        max_positions: maximum sequence length (rotary embedding range).

    Returns:
        The model in eval mode, with ``generation_config`` eos/pad ids set, tied input/output embeddings.
    """
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def save_tiny(out_dir: str, **model_kwargs: int) -> str:
    """Write the tiny tokenizer and a tiny model to ``out_dir`` (loadable with ``from_pretrained`` offline).

    Args:
        out_dir: target directory (created if missing).
        **model_kwargs: forwarded to ``build_model`` (``hidden``, ``layers``, ``heads``, ``kv_heads``, ``seed``,
            ``max_positions``).

    Returns:
        ``out_dir``.
    """
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, **model_kwargs)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    return out_dir
