"""A tiny, fully offline chat model for tests and the CPU demo.

This module owns the tiny tokenizer, its Qwen2.5-style chat template (tools, ``{% generation %}`` assistant masks),
the tiny random Llama-architecture model built on it, and ``save_tiny`` which writes both to a directory loadable
with ``from_pretrained``. Nothing here touches the network.

The tokenizer is a byte-level BPE trained in code on a small generic corpus plus a built-in domain's texts (the
bank's by default; rendered dialogues and rehearse prompts of its train split). Two choices make the demo's sequences
about five times shorter than a word-level tokenizer's, which is what lets a 1 M-parameter model learn the domain on
two CPU cores: (1) the pre-tokenizer only isolates numbers, so merges may span words and the domain's fixed text (system
prompts, tool schemas, JSON keys) collapses into a few long tokens, much like a prefix cache would; (2) every whole
number 0..999 is one token, so the rehearse role's arithmetic (balance + amount) is a table lookup rather than
digit-wise carrying. ``AutoTokenizer`` reloads it unchanged (the Llama model type keeps ``tokenizer.json`` as is).
"""

from __future__ import annotations

import functools

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from envace.policy.templates import load_chat_template

NUMBER_PAT = r"\p{N}{1,3}"  # the only pre-tokenizer split: runs of up to three digits stand alone
DEFAULT_VOCAB = 4096

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

# The packaged ChatML tool template (Qwen2.5-style, with {% generation %} assistant masks; envace.policy.templates).
CHAT_TEMPLATE = load_chat_template("chatml-tools")

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
NUMBERS = " ".join(str(i) for i in range(1000))
"""Every whole number 0..999, so that the trainer learns each as one token."""


def domain_corpus(max_tasks: int = 96, domain: str = "bank") -> list[str]:
    """Texts of a built-in domain, as the model sees them: rendered act dialogues and rehearse prompts.

    Args:
        max_tasks: how many tasks of the packaged train split to render (their order is fixed).
        domain: the built-in domain (``bank``, ``desk`` or ``library``).

    Returns:
        One text per act dialogue (chat template with tools, reference continuation included) and one per recorded
        call (the rehearse role's chat with the real response), rendered with a byte-level stand-in tokenizer that
        carries the same chat template.
    """
    from envace.builtin.task_sets import resolve_task_path
    from envace.data.task_reference import reference_steps
    from envace.data.tasks import load_tasks
    from envace.roles.rehearse import build_rehearse_messages, default_system_prompt, format_result

    stand_in = _untrained_tokenizer()
    texts = []
    for task in load_tasks(resolve_task_path(f"builtin:{domain}"))[:max_tasks]:
        dialogue = list(task.messages) + list(task.reference)
        texts.append(stand_in.apply_chat_template(dialogue, tools=list(task.tools), tokenize=False))
        for call, content, history in reference_steps(task):
            chat = build_rehearse_messages(task, call, history, system_prompt=default_system_prompt())
            rendered = stand_in.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            texts.append(rendered + format_result(content))
    return texts


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Isolate numbers (up to three digits), then map bytes to BPE symbols; no split at spaces or punctuation."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(NUMBER_PAT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers tokenizer around ``tok``: pad, eos, the control tokens, left padding, the chat template."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
        padding_side="left",
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _base_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    return tok


def _untrained_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with the chat template but no merges: only for rendering text (``tokenize=False``)."""
    tok = _base_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    return _wrap(tok)


@functools.lru_cache(maxsize=4)
def _trained_tokenizer_json(vocab_size: int, domains: tuple[str, ...] = ("bank",)) -> str:
    """Train the byte-level BPE once per ``vocab_size`` and domains; serialised (immutable, so safe to cache)."""
    tok = _base_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text encodes
    )
    texts = [text for domain in domains for text in domain_corpus(domain=domain)]
    tok.train_from_iterator(CORPUS + [NUMBERS] * 4 + texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP])
    return tok.to_str()


def build_tokenizer(vocab_size: int = DEFAULT_VOCAB, domains: tuple[str, ...] = ("bank",)) -> PreTrainedTokenizerFast:
    """Build the tiny tokenizer (deterministic; training is cached, every call returns a fresh object).

    Args:
        vocab_size: BPE vocabulary size before the markup tokens are added (the trainer may stop earlier when the
            corpus has no more merges).
        domains: the built-in domains whose texts the BPE is fitted to, besides the generic corpus (the bank by
            default; ``("desk",)`` for the help desk).

    Returns:
        A fast tokenizer with ``<|endoftext|>`` as pad (id 0), ``<|im_end|>`` as eos, the markup tags as single
        non-special tokens, left padding and the Qwen2.5-style tools chat template.
    """
    return _wrap(Tokenizer.from_str(_trained_tokenizer_json(vocab_size, tuple(domains))))


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    max_positions: int = 2048,
) -> LlamaForCausalLM:
    """Build a random tiny Llama-architecture causal LM for ``tokenizer`` (deterministic in ``seed``).

    The global random state is left untouched.

    Args:
        tokenizer: the tokenizer whose vocabulary, eos and pad ids the model uses.
        hidden: hidden size (must be divisible by ``heads``); the MLP is ``3 * hidden`` wide.
        layers: number of decoder layers.
        heads: attention heads.
        kv_heads: key/value heads (grouped-query attention; must divide ``heads``).
        seed: seed of the weight initialisation.
        max_positions: maximum sequence length (rotary embedding range).

    Returns:
        The model in eval mode, with ``generation_config`` eos/pad ids set, tied input/output embeddings.
    """
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
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
        model = LlamaForCausalLM(cfg)
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
