"""Retrieval metrics at several depths k: passage recall, Hits, MRR and MAP.

Each query is `{"query": str}` plus its gold evidence, one of:
- `ids`: supporting document ids (the `qa` task's `supporting_ids`); a passage matches when its document's
  id (`retrieval.fields.id`) is one of them, or, for a corpus without ids, its title. Ids are exact:
  titles repeat in real corpora, and matching by title then overstates recall.
- `facts`: gold fact strings (MultiHop-RAG); a passage matches a fact that it contains, after removing
  spaces and newlines from both, as upstream's `retrieval_evaluate.py` does.
- `titles`: gold titles (HotpotQA's supporting facts).
Queries with no gold (MultiHop-RAG's null queries) are not scored, as upstream.

For each k, averaged over the scored queries:
- `recall@k` (passage recall): share of the query's gold items found in its top k passages;
- `hits@k`: share of queries with at least one matching passage in the top k;
- `mrr@k`: mean of 1/rank of the first matching passage within the top k (0 when there is none);
- `map@k`: Σ over ranks r ≤ k of (gold items first found at rank r) / r, divided by min(number of gold
  items, k). This is MultiHop-RAG's definition (its "precision at r" counts items newly found at r), kept
  for comparable numbers; with one passage per gold item it is textbook average precision.
All queries are searched with one `search_batch` call; `seconds` and `queries_per_second` time it.
"""

from __future__ import annotations

import time
from typing import Any

KINDS = ("ids", "facts", "titles")


def evaluate(retriever: Any, queries: list[dict[str, Any]], ks: tuple[int, ...] = (1, 2, 5, 10)) -> dict[str, Any]:
    scored = [q for q in queries if any(q.get(kind) for kind in KINDS)]
    if not scored:
        raise ValueError("no query has gold `ids`, `facts` or `titles` to score against")
    ks = tuple(sorted(set(ks)))
    started = time.perf_counter()
    results = retriever.search_batch([q["query"] for q in scored], k=max(ks))
    seconds = time.perf_counter() - started
    by_id = any(getattr(c, "doc_id", None) is not None for c in getattr(retriever, "chunks", ()))
    totals = {f"{name}@{k}": 0.0 for k in ks for name in ("recall", "hits", "mrr", "map")}
    for query, passages in zip(scored, results, strict=True):
        kind = next(kind for kind in KINDS if query.get(kind))
        gold = list(dict.fromkeys(query[kind]))
        found_at = _first_found(kind, gold, passages, by_id)
        for k in ks:
            ranks = [rank for rank in found_at.values() if rank <= k]
            totals[f"recall@{k}"] += len(ranks) / len(gold)
            totals[f"hits@{k}"] += bool(ranks)
            totals[f"mrr@{k}"] += 1 / min(ranks) if ranks else 0.0
            totals[f"map@{k}"] += sum(1 / rank for rank in ranks) / min(len(gold), k)
    n = len(scored)
    kinds = sorted({next(kind for kind in KINDS if q.get(kind)) for q in scored})
    matched_by = ", ".join("id" if kind == "ids" and by_id else "title" if kind == "ids" else kind.rstrip("s")
                           for kind in kinds)
    return ({"n": n, "matched_by": matched_by} | {key: total / n for key, total in totals.items()}
            | {"seconds": seconds, "queries_per_second": n / seconds})


def _squash(text: str) -> str:
    return text.replace(" ", "").replace("\n", "")


def _first_found(kind: str, gold: list[str], passages: list[Any], by_id: bool) -> dict[str, int]:
    """Gold item -> the rank (from 1) of the first passage that matches it."""
    wanted = [_squash(g) for g in gold] if kind == "facts" else gold
    found: dict[str, int] = {}
    for rank, passage in enumerate(passages, start=1):
        if kind == "facts":
            text = _squash(passage.text)
            matched = {g for g in wanted if g in text}
        elif kind == "titles":
            matched = {passage.title} & set(wanted)
        else:
            doc_id = getattr(passage, "doc_id", None)
            matched = {doc_id if by_id and doc_id is not None else passage.title} & set(wanted)
        for item in matched:
            found.setdefault(item, rank)
    return found
