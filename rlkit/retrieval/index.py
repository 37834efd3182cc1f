"""Search over chunks: BM25 (bm25s), dense (sentence-transformers) or both fused, built once and cached.

What is indexed is each chunk's title, outlet, date and text: MultiHop-RAG questions name outlets and
dates ("as reported by The Verge on October 5, 2023"), so the metadata has to be searchable.

- `bm25`: bm25s with English stopwords and the Snowball stemmer (PyStemmer). Passages that share no
  term with the query score 0 and are not returned.
- `dense`: `spec.dense_model` with the e5 convention (`"query: "` / `"passage: "` prefixes), normalized
  embeddings, cosine similarity as a numpy dot product. The model is loaded on the first query.
- `hybrid`: both, fused by reciprocal rank fusion over each method's top `max(k, 100)`.

The index lives in `spec.cache_dir` (default `$RLKIT_CACHE/indexes`) in a directory named by a hash of
everything that changes it: the corpus (file sha256, Hub id, or generator settings), format, chunking,
tokenizer, method, dense model and `INDEX_VERSION`. It is written to a temporary sibling and renamed into
place, so concurrent builders never leave a half-written index; the next build with the same settings loads it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Hashable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlkit.errors import UserError
from rlkit.jsonl import read_records
from rlkit.retrieval.chunking import Chunk, chunk_documents, load_tokenizer
from rlkit.retrieval.corpus import byline, corpus_identity, load_documents

INDEX_VERSION = "rlkit-index-v2"  # bump when the files or the indexed text change
FUSION_DEPTH = 100  # hybrid: candidates taken from each ranking before fusion
_EMBED_BATCH = 64


@dataclass
class Passage:
    """One search result: a chunk and its score (BM25, cosine, or fused RRF, depending on the method)."""

    id: str
    title: str
    text: str
    source: str | None
    published_at: str | None
    url: str | None
    score: float
    doc_id: str | None = None  # the user's document id (`retrieval.fields.id`), shared by its chunks
    metadata: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Retriever:
    """A built or loaded index. `built` is False when it came from the cache; `build_seconds` is what this
    `build_retriever` call took (building, or only loading)."""

    def __init__(self, spec: Any, path: Path, chunks: list[Chunk], bm25=None, embeddings=None, encoder=None,
                 built: bool = False, build_seconds: float = 0.0):
        self.spec, self.path, self.key = spec, path, path.name
        self.chunks = chunks
        self.built, self.build_seconds = built, build_seconds
        self._bm25, self._embeddings, self._encoder = bm25, embeddings, encoder

    def __len__(self) -> int:
        return len(self.chunks)

    def __getstate__(self) -> dict[str, Any]:
        # A pickled retriever (e.g. inside TRL's environment factory) reloads its encoder on first use
        # instead of carrying a torch model that may live on a GPU.
        return {**self.__dict__, "_encoder": None}

    def search(self, query: str, k: int | None = None) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: list[str], k: int | None = None) -> list[list[Passage]]:
        """The top `k` (default `spec.top_k`) passages for each query, best first; [] for blank queries."""
        k = min(k or self.spec.top_k, len(self.chunks))
        live = [i for i, query in enumerate(queries) if query.strip()]
        texts = [queries[i] for i in live]
        if not texts:
            ranked = []
        elif self.spec.method == "bm25":
            ranked = self._bm25_rank(texts, k)
        elif self.spec.method == "dense":
            ranked = self._dense_rank(texts, k)
        else:
            depth = min(max(k, FUSION_DEPTH), len(self.chunks))
            pairs = zip(self._bm25_rank(texts, depth), self._dense_rank(texts, depth), strict=True)
            ranked = [reciprocal_rank_fusion([[i for i, _ in b], [i for i, _ in d]], self.spec.rrf_k)[:k]
                      for b, d in pairs]
        results: list[list[Passage]] = [[] for _ in queries]
        for i, hits in zip(live, ranked, strict=True):
            results[i] = [self._passage(index, score) for index, score in hits]
        return results

    def _passage(self, index: int, score: float) -> Passage:
        c = self.chunks[index]
        return Passage(id=c.id, title=c.title, text=c.text, source=c.source, published_at=c.published_at,
                       url=c.url, score=score, doc_id=c.doc_id, metadata=c.metadata or None)

    def _bm25_rank(self, texts: list[str], k: int) -> list[list[tuple[int, float]]]:
        docs, scores = self._bm25.retrieve(_bm25_tokens(texts, ids=False), k=k, show_progress=False)
        return [[(int(d), float(s)) for d, s in zip(row_d, row_s, strict=True) if s > 0]
                for row_d, row_s in zip(docs, scores, strict=True)]

    def _dense_rank(self, texts: list[str], k: int) -> list[list[tuple[int, float]]]:
        import numpy as np

        if self._encoder is None:
            self._encoder = _load_encoder(self.spec.dense_model)
        queries = self._encoder.encode([f"query: {t}" for t in texts], batch_size=_EMBED_BATCH,
                                       normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        scores = queries @ self._embeddings.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [[(int(i), float(row[i])) for i in idx] for row, idx in zip(scores, top, strict=True)]


def reciprocal_rank_fusion(rankings: list[list[Hashable]], k: int = 60) -> list[tuple[Hashable, float]]:
    """Items of several rankings (best first) by Σ 1/(k + rank), rank counted from 1; ties keep first-seen order.

    >>> reciprocal_rank_fusion([[7, 3], [3, 9]], k=1)
    [(3, 0.8333333333333333), (7, 0.5), (9, 0.3333333333333333)]
    """
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda pair: -pair[1])


def build_retriever(spec: Any, model_name: str | None = None, show_progress: bool = True,
                    rebuild: bool = False) -> Retriever:
    """Load the index for `spec` from the cache, or build and cache it. `model_name` (the recipe's model)
    is the tokenizer that counts chunk tokens unless `spec.tokenizer` names one."""
    started = time.perf_counter()
    tokenizer_name = spec.tokenizer or model_name
    if tokenizer_name is None:
        raise UserError("retrieval.tokenizer: give a tokenizer (or a model) to count chunk tokens with")
    settings = {"version": INDEX_VERSION, "corpus": corpus_identity(spec), "chunk_tokens": spec.chunk_tokens,
                "chunk_overlap": spec.chunk_overlap, "tokenizer": tokenizer_name, "method": spec.method,
                "dense_model": None if spec.method == "bm25" else spec.dense_model}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(spec.cache_dir).expanduser() if spec.cache_dir else _default_cache_root()
    path = root / key
    if path.is_dir() and not rebuild:
        return _load(spec, path, started)

    docs = load_documents(spec)
    chunks = chunk_documents(docs, load_tokenizer(tokenizer_name), spec.chunk_tokens, spec.chunk_overlap,
                             show_progress)
    if not chunks:
        raise UserError(f"retrieval.corpus: the {len(docs)} documents of {spec.corpus or 'synthetic'} have no text")
    bm25 = embeddings = encoder = None
    if spec.method != "dense":
        bm25s = _bm25s()

        bm25 = bm25s.BM25()
        bm25.index(_bm25_tokens([_indexed_text(c) for c in chunks], ids=True), show_progress=False)
    if spec.method != "bm25":
        encoder = _load_encoder(spec.dense_model)
        embeddings = _embed(encoder, chunks, show_progress)

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-building-", dir=root))
    try:
        with (tmp / "chunks.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(asdict(c), ensure_ascii=False) + "\n" for c in chunks)
        if bm25 is not None:
            bm25.save(tmp / "bm25", show_progress=False)
        if embeddings is not None:
            import numpy as np

            np.save(tmp / "dense.npy", embeddings)
        seconds = time.perf_counter() - started
        meta = {"settings": settings, "documents": len(docs), "chunks": len(chunks), "build_seconds": seconds}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        _publish(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Retriever(spec, path, chunks, bm25, embeddings, encoder, built=True,
                     build_seconds=time.perf_counter() - started)


def _default_cache_root() -> Path:
    from rlkit.cache import cache_dir

    return cache_dir() / "indexes"


def _load(spec: Any, path: Path, started: float) -> Retriever:
    chunks = [Chunk(**record) for record in read_records(path / "chunks.jsonl")]
    bm25 = embeddings = None
    if spec.method != "dense":
        bm25s = _bm25s()

        bm25 = bm25s.BM25.load(path / "bm25", show_progress=False)
    if spec.method != "bm25":
        import numpy as np

        embeddings = np.load(path / "dense.npy")
    return Retriever(spec, path, chunks, bm25, embeddings, built=False, build_seconds=time.perf_counter() - started)


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished build into place, so readers only ever see complete index directories."""
    if final.is_dir():  # rebuild: a rename onto a non-empty directory fails, so move the old index aside
        trash = Path(tempfile.mkdtemp(prefix=f".{final.name}-old-", dir=final.parent))
        os.replace(final, trash / final.name)
        shutil.rmtree(trash)
    try:
        os.replace(tmp, final)
    except OSError:
        if not final.is_dir():  # not a concurrent builder that won the race with the same index
            raise


def _indexed_text(chunk: Chunk) -> str:
    metadata = " ".join(chunk.metadata.values()) if chunk.metadata else ""
    return "\n".join(part for part in (chunk.title, byline(chunk.source, chunk.published_at), metadata, chunk.text)
                     if part)


def _bm25_tokens(texts: list[str], ids: bool):
    return _bm25s().tokenize(texts, stopwords="en", stemmer=_stemmer(), return_ids=ids, show_progress=False)


def _bm25s():
    import logging
    import os

    # bm25s runs a JAX op on import when JAX is installed: on a CUDA machine that starts JAX on the GPU, which
    # takes 75% of its memory before any model loads (seen on an H200: the trainer then ran out of memory).
    # BM25 ranks on the CPU. The variable is set for that import only (a value the user set is kept); JAX keeps the
    # backend it started then, so a JAX first started here stays on the CPU in this process, and one started
    # earlier is not changed.
    chosen = os.environ.get("JAX_PLATFORMS")
    os.environ["JAX_PLATFORMS"] = chosen or "cpu"
    try:
        import bm25s
    finally:
        if chosen is None:
            del os.environ["JAX_PLATFORMS"]

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG on import
    return bm25s


@functools.cache
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


def _load_encoder(name: str):
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise UserError("retrieval.method dense/hybrid needs sentence-transformers: "
                        "pip install 'rlkit[dense]'") from None
    try:
        return SentenceTransformer(name)
    except OSError as e:  # not cached offline, unknown id, missing files
        raise UserError(f"retrieval.dense_model: cannot load {name!r}: {e}") from None


def _embed(encoder, chunks: list[Chunk], show_progress: bool):
    import numpy as np
    from rich.console import Console
    from rich.progress import track

    texts = [f"passage: {_indexed_text(c)}" for c in chunks]
    batches = [texts[i:i + _EMBED_BATCH] for i in range(0, len(texts), _EMBED_BATCH)]
    return np.concatenate([
        encoder.encode(batch, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        for batch in track(batches, description="Embedding", disable=not show_progress, transient=True,
                           console=Console(stderr=True))
    ]).astype(np.float32)
