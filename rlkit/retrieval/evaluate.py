"""Retrieval metrics: MultiHop-RAG's (gold facts inside retrieved chunks) and HotpotQA's (gold titles).

Each query is `{"query": str, "facts": [str, ...]}` or `{"query": str, "titles": [str, ...]}`; queries
with neither (MultiHop-RAG's null queries have no evidence) are not scored, as upstream.

MultiHop-RAG, computed as upstream's `retrieval_evaluate.py` does (K = max(ks), 10 by default):
- a chunk is relevant when it contains a gold fact, after removing spaces and newlines from both;
- `hits@k`: share of queries with at least one relevant chunk in the top k (per query, not per fact);
- `mrr@K`: mean of 1/rank of the first relevant chunk in the top K (0 when there is none);
- `map@K`: for each query, Σ over ranks r ≤ K of (gold facts first found at rank r) / r, divided by
  min(number of facts, K), then averaged. Upstream's "precision at r" counts facts newly found at r,
  not relevant chunks up to r, so this is not textbook MAP; it is kept for comparable numbers.

HotpotQA: `recall@k` = share of a query's gold titles among the titles of its top-k chunks, averaged.
All queries are searched with one `search_batch` call; `seconds` and `queries_per_second` time it.
"""

from __future__ import annotations

import time
from typing import Any


def evaluate(retriever: Any, queries: list[dict[str, Any]], ks: tuple[int, ...] = (4, 10)) -> dict[str, float]:
    with_facts = [q for q in queries if q.get("facts")]
    with_titles = [q for q in queries if q.get("titles")]
    scored = with_facts + with_titles
    if not scored:
        raise ValueError("no query has gold `facts` or `titles` to score against")
    depth = max(ks)
    started = time.perf_counter()
    results = retriever.search_batch([q["query"] for q in scored], k=depth)
    seconds = time.perf_counter() - started
    metrics: dict[str, float] = {"n": len(scored)}
    if with_facts:
        metrics |= _fact_metrics([q["facts"] for q in with_facts], results[:len(with_facts)], ks)
    if with_titles:
        metrics |= _title_metrics([q["titles"] for q in with_titles], results[len(with_facts):], ks)
    return metrics | {"seconds": seconds, "queries_per_second": len(scored) / seconds}


def _squash(text: str) -> str:
    return text.replace(" ", "").replace("\n", "")


def _fact_metrics(facts: list[list[str]], results: list[list[Any]], ks: tuple[int, ...]) -> dict[str, float]:
    depth = max(ks)
    hits = dict.fromkeys(ks, 0)
    reciprocal_ranks, average_precisions = [], []
    for gold_facts, passages in zip(facts, results, strict=True):
        gold = [_squash(f) for f in gold_facts]
        found: set[str] = set()
        first, precision_sum = None, 0.0
        for rank, passage in enumerate(passages[:depth], start=1):
            text = _squash(passage.text)
            matched = {g for g in gold if g in text}
            if matched and first is None:
                first = rank
            precision_sum += len(matched - found) / rank
            found |= matched
        for k in ks:
            hits[k] += first is not None and first <= k
        reciprocal_ranks.append(1 / first if first else 0.0)
        average_precisions.append(precision_sum / min(len(gold), depth))
    n = len(facts)
    return ({f"hits@{k}": hits[k] / n for k in ks}
            | {f"mrr@{depth}": sum(reciprocal_ranks) / n, f"map@{depth}": sum(average_precisions) / n})


def _title_metrics(titles: list[list[str]], results: list[list[Any]], ks: tuple[int, ...]) -> dict[str, float]:
    recalls = {k: 0.0 for k in ks}
    for gold_titles, passages in zip(titles, results, strict=True):
        gold = set(gold_titles)
        for k in ks:
            recalls[k] += len(gold & {p.title for p in passages[:k]}) / len(gold)
    return {f"recall@{k}": total / len(titles) for k, total in recalls.items()}
