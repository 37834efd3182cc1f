"""A tiny, random-initialised Qwen3 and a locally trained tokenizer, built offline.

Tests, `--smoke` runs and the offline demo need a model that loads with the Auto classes exactly like
`Qwen/Qwen3-*` does, but nothing may be downloaded. `build_tiny_model` writes one in a few seconds:

- a byte-level BPE tokenizer (vocab 1024) trained on a built-in corpus of GSM8K-style problems,
  tool-call JSON, markdown and plain English, with Qwen3's pre-tokenizer (one digit per token) and
  Qwen3's special and added tokens. It is saved as a `Qwen2Tokenizer`, the class real Qwen3 loads as;
  transformers rebuilds that class's pipeline on load, so ours is built to be identical to it.
- the chat template is the exact text of TRL's packaged Qwen3 template. TRL recognises templates by
  string equality, so the tiny model gets the same response parser and training template as Qwen3.
- a `Qwen3ForCausalLM` with random weights, sized for CPU (`SIZES`), seeded inside `fork_rng` so the
  caller's global RNG is untouched. Same seed, same bytes.

`tiny_model_path()` caches a build under `$RLKIT_CACHE` (default `~/.cache/rlkit`); recipes name it
with the pseudo model id `TINY_MODEL`, which `resolve_model_id` maps to that path.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

from rlkit.cache import cache_dir
from rlkit.prompts import MATH_TUTOR

TINY_MODEL = "rlkit/tiny-qwen3"
TINY_MODEL_SMALL = "rlkit/tiny-qwen3-small"
_PSEUDO_IDS = {TINY_MODEL: "tiny", TINY_MODEL_SMALL: "small"}
CACHE_VERSION = "tiny-qwen3-v2"  # bump when anything below changes the built files

# Qwen3's relative order: <|endoftext|>, <|im_start|>, <|im_end|>, then the tool and think tags.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# special=False, as in Qwen3: they survive `decode(skip_special_tokens=True)`, so parsers can see them.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
VOCAB_SIZE = 1024  # learned BPE tokens + the nine above; equals the model's embedding rows

SIZES = {
    # Unit tests: forward+backward in milliseconds.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=256),
    # Offline demo: learns templated arithmetic with LoRA SFT on 2 CPU cores in minutes.
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=32, intermediate_size=768),
}

_NAMES = ["Tom", "Anna", "Maria", "James", "Li", "Sara", "Omar", "Emma", "Noah", "Priya", "Ben", "Julia",
          "Carlos", "Fatima", "George", "Hana", "Ivan", "Kofi", "Lucy", "Mateo", "Nina", "Ravi", "Yuki"]
_ITEMS = ["apples", "pencils", "cookies", "books", "marbles", "stickers", "eggs", "cards", "flowers", "coins",
          "oranges", "candies", "toys", "shells", "stamps", "balloons", "cupcakes", "bottles", "plants"]
# Generic English, so that the tokenizer is not only arithmetic.
_ENGLISH = """The quick brown fox jumps over the lazy dog. You are a helpful assistant.
Please reason step by step, and put your final answer within \\boxed{}. Let me think about this carefully.
The capital of France is Paris, and the river that runs through it is the Seine.
Search the documents to find which film was released first. I could not find the answer, so I will try again.
The meeting was moved to Thursday because the room was not available. Write a short poem about the sea.
Answer in all lowercase letters and do not use any commas. Which author wrote both novels?
Scientists study how plants grow under different light conditions. The train leaves the station at noon.
She opened the window, and a cold wind filled the kitchen. We walked along the beach until the sun went down.
Our school library has new computers, maps, and history magazines. Music and sports are popular after class.
The company announced its results on Monday; profits were higher than expected.
He was born in a small village near the mountains and later moved to the city.
Water boils at one hundred degrees Celsius at sea level. The museum is closed on public holidays.
Check your work: if the result is wrong, explain the mistake and correct it.
Summarize the article in two sentences, then list three key points.
The band released their first album in the spring, and it became famous worldwide.
Thank you for your question. Here is a detailed explanation with examples."""
_SENTENCES = _ENGLISH.splitlines()
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:"
)


def _problem(rng: random.Random) -> tuple[str, str, str, int]:
    """One GSM8K-style problem: (question, expression, worked solution, answer)."""
    name, item, friend = rng.choice(_NAMES), rng.choice(_ITEMS), rng.choice(_NAMES)
    a, b = rng.randint(2, 99), rng.randint(2, 12)
    kind = rng.randrange(4)
    if kind == 0:
        c, expr = a + b, f"{a} + {b}"
        q = f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?"
    elif kind == 1:
        a, c, expr = a + b, a, f"{a + b} - {b}"
        q = f"{name} had {a} {item} and gave {b} to {friend}. How many {item} are left?"
    elif kind == 2:
        c, expr = a * b, f"{a} * {b}"
        q = f"Each box holds {b} {item}. {name} has {a} boxes. How many {item} are there in total?"
    else:
        c, expr = a, f"{a * b} / {b}"
        q = f"{name} shares {a * b} {item} equally among {b} friends. How many {item} does each friend get?"
    compact = expr.replace(" ", "")
    solution = f"{expr} = <<{compact}={c}>>{c}\n#### {c}" if rng.random() < 0.5 else f"{expr} = {c}\n#### {c}"
    return q, expr, solution, c


def _corpus(n: int = 1500) -> list[str]:
    """Deterministic text resembling what the tiny model sees: problems, tool calls, markdown, English."""
    rng = random.Random(0)
    calc = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic "
            "expression.", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                          "required": ["expression"]}}}
    # The prompts rlkit sends: frequent enough that BPE merges them into few tokens.
    docs = [_TOOLS_HEADER + "\n" + json.dumps(calc)] * 20 + [MATH_TUTOR] * 50
    for _ in range(n):
        q, expr, solution, c = _problem(rng)
        call = json.dumps({"name": "calculator", "arguments": {"expression": expr.replace(" ", "")}})
        query = " ".join(rng.choice(_SENTENCES).split()[:4])
        docs += [
            f"{q}\n{solution}",
            f"{call}\n{c}\nThe answer is {c}.",
            f"## Solution\n\n- **Step 1:** compute {expr}.\n- **Step 2:** the result is {c}.\n\n"
            f"$\\boxed{{{c}}}$",
            " ".join(rng.sample(_SENTENCES, 3)),
            json.dumps({"name": "search", "arguments": {"query": query}}),
        ]
    return docs


def _build_tokenizer():
    """Train byte-level BPE with Qwen3's normalizer and pre-tokenizer, wrapped as a `Qwen2Tokenizer`."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer

    from rlkit.compat import qwen2_pretokenize_regex, qwen3_chat_template

    # The same pipeline `Qwen2Tokenizer.__init__` builds; its regex isolates each digit (`\p{N}`).
    bpe = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen2_pretokenize_regex()), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    n_learned = VOCAB_SIZE - len(SPECIAL_TOKENS) - len(ADDED_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=n_learned, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    corpus = _corpus()
    bpe.train_from_iterator(corpus, trainer, length=len(corpus))
    if bpe.get_vocab_size() != n_learned:
        raise RuntimeError(f"BPE learned {bpe.get_vocab_size()} tokens, not {n_learned}: enlarge the corpus")

    model = json.loads(bpe.to_str())["model"]
    vocab = dict(model["vocab"])
    # Put the added tokens in the vocab at fixed ids so their order does not depend on how
    # transformers collects special tokens.
    for i, token in enumerate(SPECIAL_TOKENS + ADDED_TOKENS):
        vocab[token] = n_learned + i
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[tuple(m) for m in model["merges"]], unk_token=None, bos_token=None,
        eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=2048,
    )
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
                         special_tokens=True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tokenizer.chat_template = qwen3_chat_template()
    if len(tokenizer) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, expected {VOCAB_SIZE}")
    return tokenizer


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, size: str = "tiny") -> Path:
    """Write a random Qwen3 (safetensors), its tokenizer and generation config to `out_dir`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; valid: {', '.join(SIZES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE, max_position_embeddings=2048, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},  # Qwen3's value
        max_window_layers=SIZES[size]["num_hidden_layers"],
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, dtype="float32",
        **SIZES[size],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_model_path(size: str = "tiny") -> Path:
    """The cached build for `size` (seed 0), built on first use; safe when processes race."""
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; valid: {', '.join(SIZES)}")
    final = cache_dir() / CACHE_VERSION / size
    if final.is_dir():  # only ever created by the atomic rename below, so it is complete
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{size}-building-", dir=final.parent))
    try:
        build_tiny_model(tmp, size=size)
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race (whose winner's build is byte-identical)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_model_id(name: str) -> str:
    """Map the pseudo ids `TINY_MODEL` / `TINY_MODEL_SMALL` / `rlkit/smollm2-135m-instruct` to their cached
    builds; pass others through."""
    if name in _PSEUDO_IDS:
        return str(tiny_model_path(_PSEUDO_IDS[name]))
    from rlkit.smollm2 import SMOLLM2_MODEL, smollm2_path

    if name == SMOLLM2_MODEL:
        return str(smollm2_path())
    return name
