"""Retrieval: rlkit's BM25 index (bm25s) against `rank_bm25`, the common pure-Python BM25, on one corpus.

Corpus: HotpotQA's closed corpus (994 Wikipedia paragraphs, 100 questions with gold supporting titles)
from ../shared/data when present, otherwise rlkit's generated news corpus and its questions. Both
retrievers index the same chunks (rlkit's 200-token chunks, counted with the tiny model's tokenizer)
with the same tokenisation (bm25s' English stopwords + Snowball stemmer), so they differ only in the
BM25 implementation: bm25s' Lucene variant with sparse precomputed scores vs `rank_bm25.BM25Okapi`.

- build: rlkit's `build_retriever(..., rebuild=True)` into a temporary cache directory (load, chunk,
  tokenise, index, save: the whole thing, so the cache never hides the work); `rank_bm25`: tokenise the
  chunks and build `BM25Okapi` (loading and chunking excluded, which flatters it).
- queries/s: all questions in one `search_batch` call (how `rlkit index eval` searches), one `search`
  call per question (how the `search` tool is called inside an episode), and `rank_bm25` one
  `get_scores` per question; query tokenisation and top-k selection included everywhere.
- recall@k: share of a question's gold titles among the top-k chunks' titles, with rlkit's own
  `rlkit.retrieval.evaluate` for both retrievers.

    .venv/bin/python bench/retrieval.py
"""

from __future__ import annotations

import json
import tempfile

from common import ROOT, figure, median, table, times, write

HOTPOTQA = ROOT.parent / "shared" / "data" / "hotpotqa_closed"
SYNTHETIC_ARTICLES = 600
SYNTHETIC_QUERIES = 400
KS = (2, 5, 10)
BUILDS = 3
PASSES = 20  # timed passes of rlkit over all questions (a batch pass takes milliseconds); the median is reported
BASELINE_PASSES = 2  # rank_bm25 takes about a second per pass
TARGET_SPEEDUP = 20


def corpus_and_questions(tokenizer: str, cache_dir: str):
    """(RetrievalSpec, questions with gold titles, description)."""
    from rlkit.recipe import RetrievalSpec

    if HOTPOTQA.is_dir():
        spec = RetrievalSpec(corpus=str(HOTPOTQA / "hotpotqa_train_corpus.json"), tokenizer=tokenizer,
                             cache_dir=cache_dir)
        rows = json.loads((HOTPOTQA / "hotpotqa_train.json").read_text())
        questions = [{"query": r["question"], "titles": sorted({t for t, _ in r["supporting_facts"]})} for r in rows]
        return spec, questions, "HotpotQA closed corpus (../shared/data/hotpotqa_closed): 100 train questions"
    from rlkit.retrieval.synthetic import articles, queries

    spec = RetrievalSpec(synthetic=SYNTHETIC_ARTICLES, seed=0, tokenizer=tokenizer, cache_dir=cache_dir)
    generated = queries(articles(SYNTHETIC_ARTICLES, seed=0), SYNTHETIC_QUERIES, seed=0)
    questions = [{"query": q["query"], "titles": sorted({e["title"] for e in q["evidence_list"]})}
                 for q in generated if q["evidence_list"]]
    return spec, questions, f"generated news corpus ({SYNTHETIC_ARTICLES} articles; ../shared/data absent)"


class RankBM25:
    """`rank_bm25.BM25Okapi` over rlkit's chunks, shaped like rlkit's `Retriever` so `evaluate` scores it."""

    def __init__(self, chunks: list) -> None:
        from rank_bm25 import BM25Okapi

        from rlkit.retrieval.index import _indexed_text  # the exact text rlkit indexes: title, byline, body

        self.chunks = chunks
        self.bm25 = BM25Okapi(tokens([_indexed_text(c) for c in chunks]))

    def search_batch(self, queries: list[str], k: int) -> list[list]:
        import numpy as np

        from rlkit.retrieval import Passage

        out = []
        for query in queries:
            scores = self.bm25.get_scores(tokens([query])[0])
            top = np.argsort(-scores, kind="stable")[:k]
            out.append([Passage(id=self.chunks[i].id, title=self.chunks[i].title, text=self.chunks[i].text,
                                source=None, published_at=None, url=None, score=float(scores[i]))
                        for i in top if scores[i] > 0])  # like rlkit: passages sharing no term are not results
        return out


def tokens(texts: list[str]) -> list[list[str]]:
    """rlkit's BM25 tokenisation (bm25s, English stopwords, Snowball stemmer) as lists of strings."""
    from rlkit.retrieval.index import _bm25_tokens

    return _bm25_tokens(texts, ids=False)


def main() -> None:
    from rlkit.retrieval import build_retriever, evaluate
    from rlkit.retrieval.chunking import chunk_documents, load_tokenizer
    from rlkit.retrieval.corpus import load_documents
    from rlkit.tiny import tiny_model_path

    tokenizer = str(tiny_model_path("tiny"))
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-index-") as cache:
        spec, questions, described = corpus_and_questions(tokenizer, cache)
        build_retriever(spec, show_progress=False)  # warm-up: imports bm25s, loads the tokenizer
        builds = [build_retriever(spec, show_progress=False, rebuild=True) for _ in range(BUILDS)]
        rlkit = builds[-1]
        rlkit_build = median([b.build_seconds for b in builds])
        if build_retriever(spec, show_progress=False).built:
            raise SystemExit("bench/retrieval.py: the index was rebuilt instead of loaded from the cache")

    docs = load_documents(spec)
    chunk_seconds = median(times(lambda: chunk_documents(docs, load_tokenizer(tokenizer), spec.chunk_tokens,
                                                         spec.chunk_overlap, show_progress=False), BUILDS))
    baseline_build = median(times(lambda: RankBM25(rlkit.chunks), BUILDS))
    baseline = RankBM25(rlkit.chunks)

    texts = [q["query"] for q in questions]
    depth = max(KS)
    n = len(texts)
    batch_qps = n / median(times(lambda: rlkit.search_batch(texts, k=depth), PASSES))
    single_qps = n / median(times(lambda: [rlkit.search(t, k=depth) for t in texts], PASSES))
    baseline_qps = n / median(times(lambda: baseline.search_batch(texts, k=depth), BASELINE_PASSES))

    recall = {"rlkit": evaluate(rlkit, questions, ks=KS), "rank_bm25": evaluate(baseline, questions, ks=KS)}
    speedup_batch, speedup_single = batch_qps / baseline_qps, single_qps / baseline_qps
    equal_recall = all(abs(recall["rlkit"][f"recall@{k}"] - recall["rank_bm25"][f"recall@{k}"]) <= 0.02 for k in KS)
    recall_cells = [[recall[name][f"recall@{k}"] for k in KS] for name in ("rlkit", "rank_bm25")]
    rows = [
        ["rlkit (bm25s), search_batch", rlkit_build, batch_qps, *recall_cells[0]],
        ["rlkit (bm25s), search one at a time", rlkit_build, single_qps, *recall_cells[0]],
        ["rank_bm25 BM25Okapi, one at a time", baseline_build, baseline_qps, *recall_cells[1]],
    ]
    note_recall = "recall within 0.02 at every k" if equal_recall else "recall differs by more than 0.02"
    figures = [
        figure("rlkit / rank_bm25 queries/s (rlkit search_batch)", speedup_batch, "x", at_least=TARGET_SPEEDUP,
               digits=1, note=note_recall),
        figure("rlkit / rank_bm25 queries/s (rlkit one query per call)", speedup_single, "x",
               at_least=TARGET_SPEEDUP, digits=1, note="how the search tool calls it during an episode"),
        figure("rlkit queries/s (search_batch)", batch_qps, "queries/s", digits=0),
        figure("rlkit index build", rlkit_build, "s", digits=3, note="load + chunk + index + save"),
        figure("rank_bm25 index build", baseline_build, "s", digits=3, note="index only, same chunks"),
        *(figure(f"recall@{k} rlkit / rank_bm25", recall["rlkit"][f"recall@{k}"], "", digits=3,
                 note=f"rank_bm25 {recall['rank_bm25'][f'recall@{k}']:.3f}") for k in KS),
    ]
    write("retrieval", "Retrieval: rlkit (bm25s) vs rank_bm25", figures,
          [table(f"{described}; {len(rlkit)} chunks, {n} questions",
                 ["retriever", "build s", "queries/s", *(f"recall@{k}" for k in KS)], rows),
           table("Build time breakdown (seconds, median)", ["step", "seconds"],
                 [["rlkit build_retriever, rebuild=True (load, chunk, index, save)", rlkit_build],
                  ["of which loading the tokenizer and chunking (200 tokens)", chunk_seconds],
                  ["rank_bm25: tokenise + BM25Okapi on the same chunks", baseline_build]])],
          what="Index build time, queries/s and recall@k of rlkit's BM25 retrieval (bm25s) and of `rank_bm25` on "
               "the same chunks with the same tokenisation.",
          details={"corpus": described, "chunks": len(rlkit), "questions": n, "recall": recall,
                   "queries_per_second": {"rlkit_batch": batch_qps, "rlkit_single": single_qps,
                                          "rank_bm25": baseline_qps},
                   "build_seconds": {"rlkit": [b.build_seconds for b in builds], "rank_bm25": baseline_build,
                                     "chunking": chunk_seconds}},
          notes=["Same chunks and the same tokens for both; the BM25 variants differ (bm25s: Lucene idf; "
                 "rank_bm25: Okapi idf with an epsilon floor), hence the small recall differences.",
                 "rlkit's build includes loading the corpus, chunking and writing the index to disk; "
                 "rank_bm25's excludes all three."])


if __name__ == "__main__":
    main()
