"""An oracle teacher: a policy that knows each question's gold evidence, for offline teacher -> SFT runs.

The DeepSearch-RL recipe keeps a strong teacher's successful trajectories. Offline there is no strong
model, so ``OraclePolicy`` stands where an endpoint policy would (``rlkit rollout --oracle``): one
search per evidence hop, then ``<answer>gold</answer>``. Its episodes run through the same engine,
tools, rewards, success filter and ``--sft-out`` rows as an ``--endpoint`` teacher's, so a user swaps
one for the other and nothing else changes.

Each hop's query is what a student can learn to write: the question's own words that also occur in
that evidence (its fact sentence, title or outlet), in the question's order; the fact itself when no
word is shared. For a corpus whose gold is only ``supporting_ids`` (bring-your-own data), the query is
the supporting title. A question with neither (MultiHop-RAG's null queries) gets one search for its own
words before the answer: "the corpus does not say" is then something the agent looked for, and the rows
teach what a ``min_tool_calls: 1`` reward pays for (without that search, RL scored the taught behaviour 0).
The oracle does not read the search results: an episode whose search missed the evidence still answers,
and the success filter decides, as for any teacher.

With ``cite`` (``rlkit rollout --oracle --cite``) the answer turn first quotes each hop's evidence that the
episode's searches returned, with its outlet and date as the results show them ("Wired, November 9, 2023:
Hexawave Systems reported ... up 24% ..."), then answers: a student that copies the two facts before its Yes/No
has the numbers or dates to compare next to the answer. A fact no search returned is not quoted (a row must not
teach facts the context lacks).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rlkit.agents.episodes import Turn
from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe import Recipe

_STOP = frozenset({"a", "an", "the", "of", "for", "to", "in", "on", "by", "at", "and", "or", "than", "did", "does",
                   "do", "was", "were", "is", "are", "which", "what", "who", "whom", "whose", "that", "this",
                   "according", "from", "with", "as", "its", "it", "his", "her", "their", "be", "been", "has",
                   "have", "had", "report", "reported", "higher", "lower", "before", "after"})
_WORD = re.compile(r"[A-Za-z0-9$%][\w$%'-]*")


class OraclePolicy:
    """Gold searches, then the gold answer; ``gold`` maps a question (the prompt's last user message) to
    ``{"searches": [query, ...], "answer": str}`` and optionally ``"notes": [(fact, "Outlet, date: fact"), ...]``,
    each line written before the answer when a search result of the episode holds its fact."""

    concurrent = False

    def __init__(self, gold: dict[str, dict[str, Any]]) -> None:
        self.gold = gold

    def generate(self, conversations: Sequence[list[dict[str, Any]]], tools: list[dict]) -> list[Turn]:
        return [self._turn(messages) for messages in conversations]

    def _turn(self, messages: list[dict[str, Any]]) -> Turn:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        question = messages[last_user]["content"]
        if question not in self.gold:
            raise UserError(f"the oracle teacher has no gold evidence for the question {question[:80]!r}")
        gold = self.gold[question]
        done = sum(1 for m in messages[last_user:] if m["role"] == "assistant" and m.get("tool_calls"))
        if done < len(gold["searches"]):
            call = {"type": "function", "function": {"name": "search",
                                                    "arguments": {"query": gold["searches"][done]}}}
            return Turn({"role": "assistant", "content": "", "tool_calls": [call]}, finish_reason="tool_calls")
        shown = "\n".join(str(m.get("content") or "") for m in messages[last_user:] if m["role"] == "tool")
        notes = "".join(f"{line}\n" for fact, line in gold.get("notes", ()) if fact in shown)
        return Turn({"role": "assistant", "content": f"{notes}<answer>{gold['answer']}</answer>"})


def hop_query(question: str, evidence: dict[str, Any]) -> str:
    """The question's words found in this evidence (fact, title, outlet), in the question's order."""
    fields = (str(evidence.get(field) or "") for field in ("fact", "title", "source"))
    haystack = {w.lower() for text in fields for w in _WORD.findall(text)}
    return (" ".join(_content_words(question, haystack.__contains__))
            or str(evidence.get("fact") or evidence.get("title") or question))


def look_query(question: str) -> str:
    """The question's own words, in order: the search for a question whose answer the corpus may not hold."""
    return " ".join(_content_words(question)) or question


def _content_words(question: str, keep: Callable[[str], bool] = lambda key: True) -> list[str]:
    """The question's words that ``keep`` accepts (by lower-case form), stop words and repeats dropped."""
    words, seen = [], set()
    for word in _WORD.findall(question):
        key = word.lower().rstrip("?")
        if keep(key) and key not in _STOP and key not in seen:
            words.append(word.rstrip("?"))
            seen.add(key)
    return words


def evidence_note(evidence: dict[str, Any]) -> tuple[str, str]:
    """One hop's fact, and the line the student can copy from the search result: "Outlet, date: fact" (both ""
    when the evidence names no fact)."""
    from rlkit.retrieval.corpus import byline

    fact = str(evidence.get("fact") or "").strip()
    by = byline(evidence.get("source"), evidence.get("published_at"))
    return fact, (f"{by}: {fact}" if by and fact else fact)


def oracle_gold(recipe: Recipe, split: str, limit: int | None, cite: bool = False) -> dict[str, dict[str, Any]]:
    """Gold searches and answers for the split's questions, keyed by the question as the prompt shows it;
    with ``cite``, each hop's evidence note goes before the answer."""
    from rlkit.data import load_rows, task_rows

    source = recipe.data.eval if split == "eval" else recipe.data.train
    if source is None:
        raise UserError(f"the recipe has no data.{split} split")
    if limit:
        source = source.model_copy(update={"limit": limit})
    raw = load_rows(recipe.data.task, source)
    rows = task_rows(recipe, "eval", raw).to_list()
    if len(rows) != len(raw):
        raise UserError(f"--oracle: the task kept {len(rows)} of {len(raw)} rows, so gold evidence cannot be "
                        "matched to questions; use --endpoint")
    gold = {}
    for source_row, row in zip(raw.to_list(), rows, strict=True):
        question = next(m["content"] for m in reversed(row["prompt"]) if m["role"] == "user")
        evidence = source_row.get("evidence_list") or []
        searches = ([hop_query(question, e) for e in evidence] if evidence
                    else [str(t) for t in row.get("supporting_ids") or []] or [look_query(question)])
        gold[question] = {"searches": searches, "answer": row["answer"]}
        if cite:
            gold[question]["notes"] = [note for note in map(evidence_note, evidence) if note[0]]
    return gold
