r"""GSM8K answer extraction and the two rewards built on it.

rlkit asks for one final-answer format, GSM8K's own: the reply's last line is ``#### <number>``.
``gsm8k_correct`` is lenient about where the number sits (``\boxed{}``, ``<answer>``, "the answer
is", or just the last number), so a model that has not learned the format yet is still rewarded for
being right; ``answer_format`` is the separate reward that teaches the format. Text inside
``<think>`` blocks never counts, and a tool's output is never read as the model's answer.
``answer_format(form="answer_tag")`` checks the QA answer form instead (``rlkit.rewards.qa``).
"""

import decimal
import re

from rlkit.rewards.qa import answer_tag_format
from rlkit.rewards.text import completion_text, strip_think

# A sign, a `$`, thousands separators only in groups of three, decimals. Not glued to a word or a
# dot on its left, so "x2", "3-5" and "v1.2" do not yield "2", "-5" and "2".
_NUMBER = r"(?<![\w.])-?\$?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
# What may sit between a marker and its number: spaces, markdown bold, a colon, `$` or `\(`.
_LEAD = r"[\s*:$\\(]*"

# Where a final answer is announced, in priority order; group 1 holds it, and its last number counts.
# `####` and "answer is" need the number right away, so "#### Step 1" (a markdown heading) or "the
# answer is 3 + 4 = 7" do not count, and extraction falls through to the next marker.
_MARKERS = (
    re.compile(rf"####{_LEAD}({_NUMBER})"),
    re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}"),
    re.compile(r"<answer>([^<]*)</answer>"),  # no `<` inside: a `.*?` would be quadratic on "<answer>" * n
    re.compile(rf"\banswer\**\s*(?:is\b|:){_LEAD}({_NUMBER})", re.IGNORECASE),
)
_FORMAT_LINE = re.compile(rf"####[ \t]*{_NUMBER}")


def normalize_number(text: str) -> str | None:
    """The canonical string of a number (commas, ``$``, ``%`` and trailing zeros dropped), or None.

    >>> [normalize_number(s) for s in ("$1,234.50", "72.00", "-0", "1e3", "ten")]
    ['1234.5', '72', '0', '1000', None]
    """
    try:
        value = decimal.Decimal(re.sub(r"[,$%]", "", text))
    except decimal.InvalidOperation:
        return None
    # NaN and infinities are not answers, and `format` would write "1e999999999" out in full.
    if not value.is_finite() or abs(value.adjusted()) > 100:
        return None
    if value.is_zero():
        return "0"
    digits = format(value, "f")
    return digits.rstrip("0").rstrip(".") if "." in digits else digits


def _last_number(text: str) -> str | None:
    numbers = _NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def extract_answer(text: str) -> str | None:
    r"""The final answer in a reply as a normalised number string, or None if it holds no number.

    Only text outside ``<think>`` is read. The first of these markers present wins, at its last
    occurrence: ``#### N``, ``\boxed{N}``, ``<answer>N</answer>``, "the answer is N" / "final
    answer: N". With none of them, the last number in the text is the answer.

    >>> extract_answer("3 + 4 = 7, so the answer is **$1,234.00**.\nTake 5.")
    '1234'
    """
    visible = strip_think(text)
    for marker in _MARKERS:
        for found in reversed(marker.findall(visible)):
            number = _last_number(found)
            if number is not None:
                return number
    return _last_number(visible)


def gold_answer(gold: object) -> str | None:
    """The gold number: after the last ``####`` of a GSM8K solution, or a bare number (str, int, float).

    >>> gold_answer("48 / 2 = 24\\n#### 72"), gold_answer(72), gold_answer("0.50"), gold_answer(None)
    ('72', '72', '0.5', None)
    """
    if isinstance(gold, str) and "####" in gold:
        found = _NUMBER_RE.search(gold.rpartition("####")[2])
        return normalize_number(found.group()) if found else None
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float, decimal.Decimal)):
        return None
    return normalize_number(str(gold))


def gsm8k_correct(completions: list, answer: list, **kwargs) -> list[float]:
    """1.0 where the completion's final answer equals the gold number, else 0.0.

    ``answer`` is the dataset column TRL passes through: full GSM8K solutions or bare numbers. A
    gold that holds no number scores every completion 0.0.

    >>> gsm8k_correct(["6 * 7 = 42\\n#### 42", "\\\\boxed{41}", None], answer=["#### 42", 41, "42"])
    [1.0, 1.0, 0.0]
    """
    return [
        1.0 if gold is not None and extract_answer(completion_text(completion)) == gold else 0.0
        for completion, gold in zip(completions, map(gold_answer, answer), strict=True)
    ]


def answer_format(completions: list, form: str = "gsm8k", score: float | None = None, **kwargs) -> list[float]:
    """The format reward, for one of two answer forms.

    ``form="gsm8k"``: 1.0 if the visible reply ends with the line ``#### <number>``, 0.5 if that
    appears elsewhere, else 0.0. ``form="answer_tag"`` (QA): ``score`` (default 0.5) for exactly one
    non-empty ``<answer>…</answer>`` with nothing after it, else 0.0 (``rlkit.rewards.qa``).

    >>> answer_format(["6 * 7 = 42\\n#### 42\\n", "#### 42\\nHope this helps!", "The answer is 42."])
    [1.0, 0.5, 0.0]
    """
    if form == "answer_tag":
        return answer_tag_format(completions, score=0.5 if score is None else score)
    if form != "gsm8k":
        raise ValueError(f"answer_format: unknown form {form!r}; valid: answer_tag, gsm8k")
    if score is not None:
        raise ValueError("answer_format: `score` applies to form='answer_tag' only; gsm8k scores 1.0 / 0.5 / 0.0")
    rewards = []
    for completion in completions:
        visible = strip_think(completion_text(completion))
        last_line = visible.rstrip().rpartition("\n")[2].strip()
        if _FORMAT_LINE.fullmatch(last_line):
            rewards.append(1.0)
        else:
            rewards.append(0.5 if _FORMAT_LINE.search(visible) else 0.0)
    return rewards
