"""The shared inputs of ``benchmarks/vs_trl.py``: the protocol's settings, the model folder, the prompts, the reward.

Both sides (``vs_trl_runs``) load the same model folder, get the same prompts in the same order and score with the
same reward function; ``benchmarks/vs_trl.py``'s docstring states the protocol.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from envace.types import Episode  # light: the CLI resolves the reward's type hints against it

SEED = 0
NUM_PROMPTS = 64
PROMPTS_PER_STEP = 8
GROUP_SIZE = 4
NEW_TOKENS = 32
LEARNING_RATE = 1e-5
CLIP_EPSILON = 0.2
MODEL_DIR = "model"  # weights, config and tokenizer: HFPolicy and from_pretrained both read one folder
TASKS_FILE = "tasks.jsonl"
WORDS = ("the", "account", "balance", "is", "transfer", "money", "to", "from", "please", "check", "what", "how",
         "much", "open", "close", "card", "number", "answer", "question", "tool", "call", "result", "error", "user",
         "assistant", "system", "you", "are", "helpful")


def arithmetic_rows(count: int = NUM_PROMPTS) -> list[tuple[str, str]]:
    """The benchmark's prompts and answers: ``count`` deterministic addition questions."""
    rng = random.Random(SEED)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append((f"What is {a} + {b}? Answer with the number.", str(a + b)))
    return rows


def corpus_lines(count: int = 12_000) -> list[str]:
    """Tokenizer training text: arithmetic, plain words and tool-call JSON, deterministic."""
    rng = random.Random(SEED)
    words = WORDS
    lines = []
    for i in range(count):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if i % 3 == 0:
            lines.append(f"What is {a} + {b}? Answer with the number. The answer is {a + b}.")
        elif i % 3 == 1:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))))
        else:
            lines.append(json.dumps({"name": "add", "arguments": {"a": a, "b": b}}))
    return lines


def build_model_dir(out: Path) -> None:
    """Build the tiny Qwen2 and its tokenizer in code and save both to ``out``.

    Raises:
        RuntimeError: the saved tokenizer's chat template is not TRL's ``qwen2_5.jinja`` byte for byte.
    """
    import importlib.resources as ir

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(corpus_lines(), trainers.BpeTrainer(
        vocab_size=2048, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    template = (ir.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     additional_special_tokens=["<|im_start|>", "<|im_end|>"], padding_side="left",
                                     clean_up_tokenization_spaces=False, model_max_length=4096)
    hf_tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"])
    hf_tok.chat_template = template
    hf_tok.save_pretrained(out)

    torch.manual_seed(SEED)
    cfg = Qwen2Config(vocab_size=len(hf_tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, eos_token_id=hf_tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=hf_tok.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg).float()
    model.generation_config.eos_token_id = [cfg.eos_token_id, hf_tok.pad_token_id]
    model.save_pretrained(out)
    if AutoTokenizer.from_pretrained(out).chat_template != template:
        raise RuntimeError(f"{out}: the saved chat template differs from TRL's qwen2_5.jinja")


def use_model_dir(source: Path, out: Path) -> None:
    """Copy a local Hugging Face model (e.g. ``models/smollm2-135m-instruct``) to ``out``, with TRL's template.

    Both sides then load the same real model and tokenizer; the chat template is TRL's ``qwen2_5.jinja`` (ChatML,
    the format SmolLM2's own template writes), set on the model's own tokenizer.

    Raises:
        RuntimeError: the tokenizer has no ChatML control tokens (``<|im_start|>``, ``<|im_end|>``).
    """
    import importlib.resources as ir

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" not in vocab or "<|im_end|>" not in vocab:
        raise RuntimeError(f"{source}: its tokenizer has no <|im_start|>/<|im_end|> tokens for the ChatML template")
    tokenizer.chat_template = (ir.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")
    tokenizer.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    stops = [vocab["<|im_end|>"]] + ([tokenizer.pad_token_id] if tokenizer.pad_token_id != vocab["<|im_end|>"] else [])
    model.generation_config.eos_token_id = stops
    model.save_pretrained(out)


def write_tasks(path: Path) -> None:
    """The prompts as an envace JSONL task file: one user message, no tools, the answer as a ``contains`` check."""
    with path.open("w", encoding="utf-8") as f:
        for i, (question, answer) in enumerate(arithmetic_rows()):
            record = {"id": f"add-{i:02d}", "messages": [{"role": "user", "content": question}], "tools": [],
                      "success": {"answer": {"contains": [answer]}}}
            f.write(json.dumps(record) + "\n")


def contains_answer(text: str, answer: str) -> float:
    """The benchmark's reward, identical on both sides: 1.0 if ``answer`` occurs in ``text``, else 0.0."""
    return 1.0 if answer in text else 0.0


class ContainsAnswer:
    """envace reward (the ``Reward`` protocol): ``contains_answer`` on the episode's final answer."""

    def __call__(self, episode: Episode) -> float:
        """Score ``episode`` against its task's first ``contains`` string."""
        expected = episode.task.success.answer
        return contains_answer(episode.final_answer or "", expected.contains[0] if expected else "")
