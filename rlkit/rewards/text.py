"""What a completion says: its final answer text, and that text without its ``<think>`` reasoning.

Every reward reads completions through these two, so a tool result or reasoning is never scored
as the answer.
"""

import re

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_think(text: str) -> str:
    """The text outside ``<think>`` blocks.

    Closed blocks go. A ``</think>`` left without an opening tag means the chat template pre-filled
    ``<think>`` (Qwen3 does), so everything before it is reasoning. A ``<think>`` left without a
    closing tag is reasoning cut off by the length limit, so everything after it goes.

    >>> [strip_think(t) for t in ("<think>5?</think>#### 7", "5?</think>#### 7", "#### 7<think>5?")]
    ['#### 7', '#### 7', '#### 7']
    """
    # A `<think>` after the last `</think>` is unclosed. Cutting it first also keeps the regex linear
    # on degenerate output such as "<think>" repeated a thousand times.
    head, closer, tail = text.rpartition("</think>")
    text = _THINK_BLOCK.sub("", head + closer + tail.partition("<think>")[0])
    # Any `</think>` still here had no opening tag.
    return text.rpartition("</think>")[2]


def completion_text(completion: object) -> str:
    """The text a completion answers with: the string itself, or the final assistant message's content.

    A conversational completion (a list of messages, possibly with tool calls and tool results)
    answers in its final assistant message; ``reasoning_content`` and tool output are not read.

    >>> completion_text([{"role": "assistant", "content": None, "tool_calls": []},
    ...                  {"role": "tool", "content": "42"}, {"role": "assistant", "content": "#### 42"}])
    '#### 42'
    """
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, (list, tuple)):
        return ""
    for message in reversed(completion):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
                parts = (part.get("text") for part in content if isinstance(part, dict))
                return "".join(part for part in parts if isinstance(part, str))
            return content if isinstance(content, str) else ""
    return ""


# A run of one character (not a digit or a space) eight times or more: "########", "!!!!!!!!".
_CHAR_RUN = re.compile(r"([^\s\d])\1{7,}")
# The text ends in one unit of 1-40 characters written three times or more in a row, 16 characters or more in all
# (so "#### 1000" is not a loop of zeros): a loop the token limit cut.
_LOOP_TAIL = re.compile(r"(.{1,40}?)\1{2,}\s*\Z", re.DOTALL)


def degenerate(text: str, answer: object) -> str | None:
    """Why a reply is degenerate, or None: ``no answer`` (``answer``, the task's reading of it, is None or empty),
    ``character run`` (one character eight times or more, e.g. ``########``) or ``loop`` (the reply ends in the same
    piece written three times or more: it was cut mid-repetition). The first that applies; only the visible text
    (outside ``<think>``) and its last 400 characters for loops are read.

    >>> [degenerate(t, a) for t, a in (("3 + 4 = 7\\n#### 7", "7"), ("########", None), ("7 = 7\\n#### 1000", "1000"),
    ...                                 ("#### 7#### 7#### 7#### 7", "7"), ("So 3 + 4 is 7.", "7"), ("a!!!!!!!!", "7"))]
    [None, 'no answer', None, 'loop', None, 'character run']
    """
    visible = strip_think(text)
    if answer is None or answer == "":
        return "no answer"
    if _CHAR_RUN.search(visible):
        return "character run"
    loop = _LOOP_TAIL.search(visible[-400:].rstrip())
    if loop and loop.end() - loop.start() >= 16:
        return "loop"
    return None
