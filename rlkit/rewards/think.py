r"""Thinking rewards for Qwen3-style ``<think>`` blocks: ``think_format`` and ``short_think``.

Both read, in each assistant turn, only the thinking: ``reasoning_content`` when TRL's response parser
moved it there, else the ``<think>…</think>`` block in ``content``. Tool results and tool-call
arguments are never read. TRL's own ``think_format_reward`` reads ``content`` only, so it scores 0
exactly when the parser has done its job; these read both.

A turn is **well-formed** when it has exactly one non-empty think block, before anything else
(only whitespace may precede ``<think>``), closed, with no ``<think>`` nested inside and no second
block. A ``reasoning_content`` string counts as that block, unless ``content`` holds think tags too
(the thinking is then duplicated). A content that opens with no ``<think>`` but holds one
``</think>`` had its opening tag pre-filled by the chat template: what precedes ``</think>`` is the
block. ``think_spans`` parses one turn; ``analyze`` reuses it.

``approx_tokens`` is the dependency-free token count ``short_think`` uses unless given a tokenizer.
"""

import functools
import math
import re
from typing import NamedTuple

OPEN, CLOSE = "<think>", "</think>"
_TAG = re.compile(r"</?think>")
# Turns whose thinking is absent rather than broken: `short_think` scores them `empty_score`.
NO_THINKING = ("missing", "empty")


class ThinkSpans(NamedTuple):
    """The think blocks of one assistant turn, and why it is malformed (``problem``; None if well-formed).

    ``problem`` is one of "missing", "empty", "text before <think>", "nested <think>", "stray </think>",
    "unclosed <think>", "more than one think block", "duplicated in reasoning_content and content",
    "not a message", "content is not text". ``blocks`` holds what was found even when malformed (an
    unclosed block runs to the end of the text, as when generation hit the length limit).
    """

    blocks: tuple[str, ...]
    problem: str | None

    @property
    def well_formed(self) -> bool:
        return self.problem is None


def think_spans(turn: object) -> ThinkSpans:
    """Parse one assistant turn: a message dict, or the raw text of a string completion.

    >>> think_spans("<think>6 * 7 = 42</think>\\n\\n#### 42")
    ThinkSpans(blocks=('6 * 7 = 42',), problem=None)
    >>> think_spans("6 * 7 = 42</think>#### 42").well_formed  # `<think>` pre-filled by the template
    True
    >>> think_spans({"role": "assistant", "reasoning_content": "hm", "content": "<think>hm</think>42"}).problem
    'duplicated in reasoning_content and content'
    """
    if isinstance(turn, str):
        return _parse(turn)
    if not isinstance(turn, dict):
        return ThinkSpans((), "not a message")
    content = _content_text(turn.get("content"))
    reasoning = turn.get("reasoning_content")
    if content is None or not isinstance(reasoning, (str, type(None))):
        return ThinkSpans((), "content is not text")
    # A blank `reasoning_content` is what a parser leaves for an empty block: as good as absent.
    if reasoning is None or not reasoning.strip():
        return _parse(content)
    if _TAG.search(content):
        return ThinkSpans((reasoning, *_parse(content).blocks), "duplicated in reasoning_content and content")
    return ThinkSpans((reasoning,), None)


def _content_text(content: object) -> str | None:
    if content is None:
        return ""  # an assistant message that only calls tools
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        parts = (part.get("text") for part in content if isinstance(part, dict))
        return "".join(part for part in parts if isinstance(part, str))
    return None


def _parse(text: str) -> ThinkSpans:
    tags = list(_TAG.finditer(text))
    if not tags:
        return ThinkSpans((), "missing")
    problems, blocks = [], []
    inside = prefilled = tags[0].group() == CLOSE
    start = 0
    if not prefilled and text[: tags[0].start()].strip():
        problems.append("text before <think>")
    for tag in tags:
        if tag.group() == OPEN:
            if inside:
                problems.append("nested <think>")
            else:
                inside, start = True, tag.end()
        elif inside:
            blocks.append(text[start: tag.start()])
            inside = False
        else:
            problems.append("stray </think>")
    if inside:
        blocks.append(text[start:])
        problems.append("unclosed <think>")
    if len(blocks) > 1:
        problems.append("more than one think block")
    if not problems and not blocks[0].strip():
        problems.append("empty")
    return ThinkSpans(tuple(blocks), problems[0] if problems else None)


def assistant_turns(completion: object) -> list[ThinkSpans]:
    """The parsed assistant turns of a completion: a string is one turn; tool and user messages are skipped."""
    if isinstance(completion, str):
        return [think_spans(completion)]
    if not isinstance(completion, (list, tuple)):
        return []
    return [think_spans(m) for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]


def think_format(completions: list, partial: bool = False, **kwargs) -> list[float]:
    """1.0 where every assistant turn is well-formed (``think_spans``), else 0.0; no assistant turn: 0.0.

    With ``partial=True``, the share of well-formed assistant turns instead.

    >>> think_format(["<think>7 * 6</think>42", "42", "<think></think>42", None])
    [1.0, 0.0, 0.0, 0.0]
    """
    rewards = []
    for completion in completions:
        turns = assistant_turns(completion)
        good = sum(turn.well_formed for turn in turns)
        if not turns:
            rewards.append(0.0)
        elif partial:
            rewards.append(good / len(turns))
        else:
            rewards.append(1.0 if good == len(turns) else 0.0)
    return rewards


# Qwen2/Qwen3's pre-tokenizer (tokenizer.json), in Python's `re`: \p{L} is [^\W\d_], \p{N} is \d.
# CJK characters are split off one per piece (Qwen's pre-tokenizer keeps a run of them as one piece).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_LETTERS = rf"[^\W\d_{_CJK}]+"
_PIECE = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    rf"|(?:[^\r\n\w]|_)?{_LETTERS}"
    rf"|[{_CJK}]"
    r"|\d"
    r"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)
_LONG_PIECE = 12


def approx_tokens(text: str) -> int:
    """About how many Qwen3 tokens ``text`` is, without a tokenizer.

    It counts the pieces of Qwen's own pre-tokenizer (the regex BPE runs inside; BPE never merges
    across pieces), with two corrections where one piece is clearly several tokens: a piece counts
    one token per started 12 characters, and each CJK character is a piece. In Qwen's 151k-token
    vocabulary nearly every common English word, with its leading space, is one token, punctuation
    runs are one, and digits are always one each, so on ordinary English prose and math this is
    exact or a few percent under (rare words and names that BPE splits are the gap); code identifiers
    and non-Latin scripts undercount more (Qwen averages ~1.4 Chinese characters a token: over by ~40%).

    >>> approx_tokens("Let me think: 48 / 2 = 24, so she sold 72 clips.")
    23
    """
    return sum(-(-len(piece) // _LONG_PIECE) for piece in _PIECE.findall(text))


@functools.cache
def _hf_tokenizer(name: str):
    from transformers import AutoTokenizer  # deferred: importing rewards stays cheap

    from rlkit.tiny import resolve_model_id

    return AutoTokenizer.from_pretrained(resolve_model_id(name))


def _counter(tokenizer: str | None):
    if tokenizer is None:
        return approx_tokens
    hf = _hf_tokenizer(tokenizer)
    return lambda text: len(hf.encode(text, add_special_tokens=False))


def length_score(length: int, max_tokens: int = 300, min_tokens: int = 1, empty_score: float = 0.0) -> float:
    """``short_think``'s score of one think block of ``length`` tokens (0 = no thinking)."""
    if length == 0 or length < min_tokens:
        return empty_score
    if length <= max_tokens:
        s = (length - min_tokens) / (max_tokens - min_tokens)
    else:
        s = min(1 + (length - max_tokens) / max_tokens, 2.0)
    return 0.5 + 0.5 * math.cos(math.pi / 2 * s)


def short_think(completions: list, max_tokens: int = 300, min_tokens: int = 1, empty_score: float = 0.0,
                tokenizer: str | None = None, **kwargs) -> list[float]:
    r"""Rewards short thinking: the mean over assistant turns of a score of each think block's length L.

    With ``s = (L - min_tokens) / (max_tokens - min_tokens)`` up to ``max_tokens`` and
    ``s = 1 + (L - max_tokens) / max_tokens`` beyond (capped at 2), a turn scores
    ``0.5 + 0.5 * cos(pi/2 * s)``: 1.0 at ``min_tokens``, 0.5 at ``max_tokens``, 0.0 at twice
    ``max_tokens`` and after, one half cosine (a single one, ``cos(pi*L / (2*max_tokens))``-shaped, when
    ``min_tokens`` is 0). A turn with no thinking (missing or blank block) or fewer than ``min_tokens``
    scores ``empty_score``; a malformed one (``think_spans``: duplicated, nested, unclosed, text
    before it) 0.0. No assistant turn: 0.0.

    L is counted by ``approx_tokens`` (Qwen's pre-tokenizer pieces, no dependency), or with the
    Hugging Face tokenizer ``tokenizer`` (a model id, a path, or an rlkit pseudo id such as ``TINY_MODEL``).

    >>> [round(r, 4) for r in short_think(["<think>a b c</think>x", "<think>" + "a " * 9 + "</think>x"],
    ...                                  max_tokens=5)]
    [0.8536, 0.0245]
    """
    if min_tokens < 0 or max_tokens <= min_tokens:
        raise ValueError(f"short_think: need 0 <= min_tokens < max_tokens, got min_tokens={min_tokens}, "
                         f"max_tokens={max_tokens}")
    count = _counter(tokenizer)
    rewards = []
    for completion in completions:
        scores = []
        for turn in assistant_turns(completion):
            if turn.problem in NO_THINKING:
                scores.append(empty_score)
            elif turn.problem is not None:
                scores.append(0.0)
            else:
                scores.append(length_score(count(turn.blocks[0].strip()), max_tokens, min_tokens, empty_score))
        rewards.append(sum(scores) / len(scores) if scores else 0.0)
    return rewards
