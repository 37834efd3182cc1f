"""Short-answer QA (MultiHop-RAG): answer extraction, the three metrics, and the rewards built on them.

The answer is read from the final assistant message's visible text (outside ``<think>``): the last
``<answer>…</answer>``, else what follows the last ``Answer:`` line, else the whole text. Tool
results and ``reasoning_content`` are never read, so a search result that contains the gold does not
score.

- ``exact_match`` and ``f1`` are SQuAD's (lowercase, drop punctuation and the articles a/an/the,
  compare whitespace tokens). A null query's gold is exactly "Insufficient information.", so
  "insufficient information" matches it.
- ``accuracy`` is MultiHop-RAG's own, as upstream's ``qa_evaluate.py`` computes it
  (github.com/yixuantt/MultiHop-RAG): 1.0 if the lowercased prediction and gold share at least one
  whitespace-separated word. It is kept verbatim, so that numbers compare with the paper's: no
  punctuation is stripped ("Yes." does not match "yes") and any shared word counts ("the" too).
  Upstream reads the answer from its prompt's 'The answer to the question is "…"'; rlkit reads
  ``final_answer``. Upstream's "precision / recall / F1" are this same per-question rate, not SQuAD's
  F1. Being that easy to game, accuracy is reported, never used as a reward.
"""

import collections
import re
import string
from collections.abc import Sequence

from rlkit.rewards.text import completion_text, strip_think

# No tag inside the content, which also keeps `findall` linear on degenerate output ("<answer>" * n).
_TAGGED = re.compile(r"<answer>((?:(?!</?answer>).)*)</answer>", re.DOTALL)
# A line that opens with "Answer:" (or "Final answer:"), allowing markdown bullets, quotes and bold.
_ANSWER_LINE = re.compile(r"^[ \t>*#-]*(?:final[ \t]+)?answer[ \t*]*:[ \t*]*", re.IGNORECASE | re.MULTILINE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def final_answer(text: str) -> str:
    """The answer in a reply's visible text: the last ``<answer>`` tag, else after the last ``Answer:`` line.

    >>> [final_answer(t) for t in ("<think>Paris?</think><answer> Lyon </answer>", "Hmm.\\nAnswer: Yes", "No.")]
    ['Lyon', 'Yes', 'No.']
    """
    visible = strip_think(text)
    tagged = _TAGGED.findall(visible)
    if tagged:
        return tagged[-1].strip()
    lines = list(_ANSWER_LINE.finditer(visible))
    return visible[lines[-1].end():].strip() if lines else visible.strip()


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, no punctuation, no articles, single spaces.

    >>> normalize_answer("The  Verge's answer: Insufficient information.")
    'verges answer insufficient information'
    """
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """SQuAD's token F1 of the normalised strings; two empty strings match (SQuAD v2).

    >>> round(f1("the Federal Reserve Bank", "Federal Reserve"), 6)
    0.8
    """
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not wanted:
        return float(predicted == wanted)
    same = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def accuracy(prediction: str, gold: str) -> float:
    """MultiHop-RAG's accuracy (upstream ``qa_evaluate.py``): 1.0 if the lowercased strings share a word.

    >>> accuracy("yes it did", "Yes"), accuracy("Yes.", "yes")
    (1.0, 0.0)
    """
    return float(bool(set(prediction.lower().split()) & set(gold.lower().split())))


def qa_scores(prediction_text: str, gold: str, aliases: Sequence[str] = ()) -> dict[str, float]:
    """EM, F1 and accuracy of a reply's ``final_answer``, each the best over the gold and its ``aliases``.

    >>> qa_scores("<answer>The Fed</answer>", "Federal Reserve")
    {'em': 0.0, 'f1': 0.0, 'accuracy': 0.0}
    >>> qa_scores("<answer>UK</answer>", "United Kingdom", ["U.K.", "Britain"])
    {'em': 1.0, 'f1': 1.0, 'accuracy': 0.0}
    """
    prediction = final_answer(prediction_text)
    golds = [gold, *aliases]
    return {name: max(metric(prediction, g) for g in golds) for name, metric in
            (("em", exact_match), ("f1", f1), ("accuracy", accuracy))}


_REWARD_METRICS = {"em": exact_match, "f1": f1}


def qa_correct(completions: list, answer: list, scale: float = 2.0, metric: str = "f1", min_tool_calls: int = 0,
               **kwargs) -> list[float]:
    """``scale`` times the F1 (or EM, ``metric="em"``) of each completion's final answer against the gold.

    ``answer`` is the dataset's gold column; a gold that is not a string scores 0.0. With an ``aliases``
    column (the ``qa`` task's), the best score over the answer and its aliases counts. ``min_tool_calls``
    N scores 0.0 for an episode with fewer than N tool results: where half the questions are Yes/No, an
    answer guessed without searching otherwise pays as much as one found.

    >>> qa_correct(["<answer>Lyon</answer>", "Answer: the city of Lyon", None], answer=["Lyon"] * 3)
    [2.0, 1.0, 0.0]
    >>> searched = [{"role": "assistant", "tool_calls": [{}]}, {"role": "tool", "content": "Lyon ..."},
    ...             {"role": "assistant", "content": "<answer>Yes</answer>"}]
    >>> qa_correct([searched, "<answer>Yes</answer>"], answer=["Yes"] * 2, scale=1.0, min_tool_calls=1)
    [1.0, 0.0]
    """
    if metric not in _REWARD_METRICS:
        raise ValueError(f"qa_correct: unknown metric {metric!r}; valid: {', '.join(_REWARD_METRICS)}")
    score = _REWARD_METRICS[metric]
    aliases = kwargs.get("aliases") or [()] * len(answer)
    return [
        scale * max(score(final_answer(completion_text(completion)), g) for g in [gold, *(others or ())])
        if isinstance(gold, str) and tool_results(completion) >= min_tool_calls else 0.0
        for completion, gold, others in zip(completions, answer, aliases, strict=True)
    ]


def tool_results(completion: object) -> int:
    """How many tool results a conversational completion holds (0 for plain text)."""
    if not isinstance(completion, (list, tuple)):
        return 0
    return sum(isinstance(m, dict) and m.get("role") == "tool" for m in completion)


def has_answer_form(text: str) -> bool:
    """Whether the visible text holds exactly one non-empty ``<answer>`` tag with nothing after it.

    >>> [has_answer_form(t) for t in ("Found it.\\n<answer>Lyon</answer>\\n", "<answer>Lyon</answer>.")]
    [True, False]
    """
    visible = strip_think(text)
    if visible.count("<answer>") != 1 or visible.count("</answer>") != 1:
        return False
    inside, closer, after = visible.partition("<answer>")[2].partition("</answer>")
    return bool(closer) and bool(inside.strip()) and not after.strip()


def answer_tag_format(completions: list, score: float = 0.5, **kwargs) -> list[float]:
    """``score`` where the final assistant message has the answer form (``has_answer_form``), else 0.0.

    Registered as ``answer_format`` with ``form: answer_tag``.
    """
    return [score if has_answer_form(completion_text(completion)) else 0.0 for completion in completions]
