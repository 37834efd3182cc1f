"""Retrieval for search tools: corpus loading, token chunking, BM25/dense/hybrid indexes, evaluation.

`build_retriever(recipe.retrieval, model_name=recipe.model.name_or_path)` returns a cached `Retriever`;
`evaluate(retriever, queries)` scores it with MultiHop-RAG's or HotpotQA's retrieval metrics. The
modules import bm25s, transformers and sentence-transformers only when they build or search.
"""

from rlkit.retrieval.chunking import Chunk, chunk_documents
from rlkit.retrieval.corpus import Document, load_documents
from rlkit.retrieval.evaluate import evaluate
from rlkit.retrieval.index import Passage, Retriever, build_retriever, reciprocal_rank_fusion

__all__ = ["Chunk", "Document", "Passage", "Retriever", "build_retriever", "chunk_documents", "evaluate",
           "load_documents", "reciprocal_rank_fusion"]
