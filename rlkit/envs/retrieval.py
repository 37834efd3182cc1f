"""A `search` tool over a document collection (the recipe's `retrieval:` section), for tool-using agents.

`factory_kwargs(recipe)` builds the index once (or loads it from the cache) and every `RetrievalEnv`
of the run shares that retriever; TRL resets an instance with `reset(**row)` before each episode and
offers `search` to the model as its one tool. The episode records what the model searched for
(`queries`, the passage ids each search returned in `retrieved`) and counts it in `metrics`:
`searches`, `empty_results` (searches that found nothing) and `repeated_queries` (the same query,
ignoring case and spacing, searched again in the episode), which the trainer logs.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlkit.envs.arguments import validated
from rlkit.errors import UserError
from rlkit.retrieval.corpus import byline

if TYPE_CHECKING:
    from rlkit.recipe.schema import Recipe


class RetrievalEnv:
    """One search tool per rollout; `top_k` passages per search (default: `retrieval.top_k`).

    `description` is what the model reads about the tool (its schema's description): say what the
    collection holds and how to search it. The default describes a generic document collection.
    """

    def __init__(self, retriever: Any, top_k: int | None = None, description: str | None = None) -> None:
        self.retriever = retriever
        self.top_k = top_k or retriever.spec.top_k
        if description:
            # TRL and rlkit read a tool's schema from its method's docstring: this instance gets its own.
            self.search = types.MethodType(search_function(description), self)
        self.reset()

    def reset(self, **row) -> None:
        self.queries: list[str] = []
        self.retrieved: list[list[str]] = []
        # Every search and what it returned, ids included: what trajectories record and evidence recall reads.
        self.searches: list[dict[str, Any]] = []
        self.metrics: dict[str, float] = {"searches": 0.0, "empty_results": 0.0, "repeated_queries": 0.0}

    @validated
    def search(self, query: str) -> str:
        """Search the document collection for passages relevant to a query.

        Each search returns the best-matching passages, each with its title and text. Search again with
        other words when the results do not hold what you need.

        Args:
            query: Keywords or a question naming what you are looking for.

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
        self.searches.append({"query": query, "results": [
            {"id": p.id, "doc_id": p.doc_id, "title": p.title, "score": round(float(p.score), 4)} for p in passages]})
        self.metrics["searches"] += 1
        if not passages:
            self.metrics["empty_results"] += 1
            return "No results."
        return "\n\n".join(format_passage(i, p) for i, p in enumerate(passages, start=1))


def search_function(description: str | None = None) -> Callable[..., str]:
    """`RetrievalEnv.search` with `description` as the tool's description (its query argument stays documented)."""
    base = RetrievalEnv.search
    if not description:
        return base

    @functools.wraps(base)  # the same signature and checks; only the docstring differs
    def func(self: RetrievalEnv, *args: Any, **kwargs: Any) -> str:
        return base(self, *args, **kwargs)

    _, sep, args = base.__doc__.partition("Args:")
    func.__doc__ = description.strip() + "\n\n        " + sep + args
    return func


def format_passage(number: int, passage: Any) -> str:
    """A passage as the `search` tool shows it: `[n] Title (Source, October 5, 2023)`, then the text."""
    by = byline(passage.source, passage.published_at)
    extra = "; ".join(f"{k}: {v}" for k, v in (getattr(passage, "metadata", None) or {}).items())
    by = "; ".join(part for part in (by, extra) if part)
    header = f"[{number}] {passage.title}" + (f" ({by})" if by else "")
    return f"{header}\n{passage.text.strip()}"


def factory_kwargs(recipe: Recipe) -> dict[str, Any]:
    """The shared retriever for `RetrievalEnv`, from `recipe.retrieval` (built once, then cached on disk)."""
    if recipe.retrieval is None:
        raise UserError("env retrieval needs a `retrieval:` section (`corpus:` a file or Hub id, or `synthetic:` "
                        "an article count) in the recipe")
    from rlkit.retrieval import build_retriever

    return {"retriever": build_retriever(recipe.retrieval, model_name=recipe.model.name_or_path, show_progress=True)}
