"""A `search` tool over a document collection (the recipe's `retrieval:` section), for tool-using agents.

`factory_kwargs(recipe)` builds the index once (or loads it from the cache) and every `RetrievalEnv`
of the run shares that retriever; TRL resets an instance with `reset(**row)` before each episode and
offers `search` to the model as its one tool. The episode records what the model searched for
(`queries`, the passage ids each search returned in `retrieved`) and counts it in `metrics`:
`searches`, `empty_results` (searches that found nothing) and `repeated_queries` (the same query,
ignoring case and spacing, searched again in the episode), which the trainer logs.
"""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError
from rlkit.retrieval.corpus import byline


class RetrievalEnv:
    """One search tool per rollout; `top_k` passages per search (default: `retrieval.top_k`)."""

    def __init__(self, retriever: Any, top_k: int | None = None) -> None:
        self.retriever = retriever
        self.top_k = top_k or retriever.spec.top_k
        self.reset()

    def reset(self, **row) -> None:
        self.queries: list[str] = []
        self.retrieved: list[list[str]] = []
        self.metrics: dict[str, float] = {"searches": 0.0, "empty_results": 0.0, "repeated_queries": 0.0}

    def search(self, query: str) -> str:
        """Search the document collection for passages relevant to a query.

        Name the entities, outlets and dates you are looking for; each search returns the best-matching
        passages, each with its title, source, publication date and text.

        Args:
            query: Keywords or a question, e.g. "TechCrunch OpenAI board October 2023".

        Returns:
            The passages found, numbered, or "No results.".
        """
        if not query.strip():
            raise ValueError("empty query; give keywords to search for")
        normalized = " ".join(query.lower().split())
        if normalized in {" ".join(q.lower().split()) for q in self.queries}:
            self.metrics["repeated_queries"] += 1
        passages = self.retriever.search(query, k=self.top_k)
        self.queries.append(query)
        self.retrieved.append([p.id for p in passages])
        self.metrics["searches"] += 1
        if not passages:
            self.metrics["empty_results"] += 1
            return "No results."
        return "\n\n".join(format_passage(i, p) for i, p in enumerate(passages, start=1))


def format_passage(number: int, passage: Any) -> str:
    """A passage as the `search` tool shows it: `[n] Title (Source, October 5, 2023)`, then the text."""
    by = byline(passage.source, passage.published_at)
    header = f"[{number}] {passage.title}" + (f" ({by})" if by else "")
    return f"{header}\n{passage.text.strip()}"


def factory_kwargs(recipe: Any) -> dict[str, Any]:
    """The shared retriever for `RetrievalEnv`, from `recipe.retrieval` (built once, then cached on disk)."""
    if recipe.retrieval is None:
        raise UserError("env retrieval needs a `retrieval:` section (`corpus:` a file or Hub id, or `synthetic:` "
                        "an article count) in the recipe")
    from rlkit.retrieval import build_retriever

    return {"retriever": build_retriever(recipe.retrieval, model_name=recipe.model.name_or_path,
                                         show_progress=True)}
