"""Documents for the search tool: loaded from MultiHop-RAG, HotpotQA or JSONL files, or generated.

A corpus is a list of `Document`s. `RetrievalSpec.corpus` names a local file or a Hub dataset id;
`format: auto` decides from the file: `.jsonl` is one `{title, text, ...}` per line, a JSON array of
articles with a `body` is MultiHop-RAG's `corpus.json`, a JSON object `title -> [sentence, ...]` is
HotpotQA's closed corpus. `corpus_identity` is what the index cache key records about the corpus.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

MULTIHOP_RAG_HUB = "yixuantt/MultiHopRAG"
METADATA = ("source", "published_at", "url", "author", "category")
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass(frozen=True)
class Document:
    title: str
    text: str
    source: str | None = None
    published_at: str | None = None
    url: str | None = None
    author: str | None = None
    category: str | None = None


def load_documents(spec: Any) -> list[Document]:
    """The documents a `RetrievalSpec` names; a `UserError` for missing files, wrong shapes or no documents."""
    if spec.synthetic is not None:
        from rlkit.retrieval.synthetic import articles

        return _from_articles(articles(spec.synthetic, seed=spec.seed), "synthetic corpus")
    path = _local_file(spec.corpus)
    if path is None:
        docs = _load_hub(spec.corpus, spec.format)
    else:
        fmt = resolve_format(path, spec.format)
        docs = {"multihop_rag": _load_multihop_rag, "jsonl": _load_jsonl, "hotpotqa": _load_hotpotqa}[fmt](path)
    if not docs:
        raise UserError(f"{spec.corpus}: the corpus is empty")
    return docs


def resolve_format(path: Path, fmt: str) -> str:
    """`auto` -> the format the file's extension and top-level JSON shape say."""
    if fmt != "auto":
        return fmt
    if path.suffix == ".jsonl":
        return "jsonl"
    data = _read_json(path)
    if isinstance(data, dict):
        return "hotpotqa"
    if isinstance(data, list) and data and isinstance(data[0], dict) and "body" in data[0]:
        return "multihop_rag"
    raise UserError(f"{path}: cannot tell the corpus format (expected a JSON array of articles with `body`, "
                    "a JSON object title -> sentences, or a .jsonl file); set retrieval.format")


def corpus_identity(spec: Any) -> dict[str, Any]:
    """What the index cache key records about the corpus: file content hash, Hub id, or generator settings."""
    if spec.synthetic is not None:
        from rlkit.retrieval.synthetic import VERSION

        return {"synthetic": spec.synthetic, "seed": spec.seed, "generator": VERSION, "format": "multihop_rag"}
    path = _local_file(spec.corpus)
    if path is None:
        return {"hub": spec.corpus, "format": "multihop_rag"}
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "format": resolve_format(path, spec.format)}


def byline(source: str | None, published_at: str | None) -> str:
    """"BBC News, October 5, 2023": the outlet and date the way questions name them (either may be missing)."""
    return ", ".join(part for part in (source, readable_date(published_at)) if part)


def readable_date(value: str | None) -> str | None:
    """An ISO 8601 timestamp written the way questions write dates ("October 5, 2023"); other text as given."""
    if not value:
        return value
    try:
        date = datetime.fromisoformat(value)
    except ValueError:
        return value
    return f"{date:%B} {date.day}, {date.year}"


def _local_file(corpus: str) -> Path | None:
    """The corpus file, or None for a Hub dataset id (`owner/name` that is not a local path)."""
    path = Path(corpus).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise UserError(f"retrieval.corpus: {corpus} is not a file; give the corpus file itself")
    if _HUB_ID.match(corpus) and not corpus.endswith((".json", ".jsonl")):
        return None
    raise UserError(f"retrieval.corpus: file not found: {corpus}")


def _load_hub(dataset_id: str, fmt: str) -> list[Document]:
    if fmt not in ("auto", "multihop_rag"):
        raise UserError(f"retrieval.corpus: only MultiHop-RAG corpora load from the Hub; for format {fmt!r} "
                        f"give a local file (not found: {dataset_id})")
    import datasets

    try:
        rows = datasets.load_dataset(dataset_id, "corpus", split="train")
    except OSError as e:  # offline, unknown id, no `corpus` config: all reach the user as OSError subclasses
        raise UserError(f"retrieval.corpus: cannot load {dataset_id!r} (config `corpus`) from the Hub: {e}") from None
    return _from_articles(list(rows), dataset_id)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


def _load_multihop_rag(path: Path) -> list[Document]:
    data = _read_json(path)
    if not isinstance(data, list):
        raise UserError(f"{path}: a MultiHop-RAG corpus is a JSON array of articles, got {type(data).__name__}")
    return _from_articles(data, str(path))


def _from_articles(articles: list[Any], where: str) -> list[Document]:
    docs = []
    for i, article in enumerate(articles):
        if not (isinstance(article, dict) and isinstance(article.get("title"), str)
                and isinstance(article.get("body"), str)):
            raise UserError(f"{where}: article {i} needs string `title` and `body` (MultiHop-RAG corpus format)")
        docs.append(Document(title=article["title"], text=article["body"], **_metadata(article)))
    return docs


def _load_jsonl(path: Path) -> list[Document]:
    from rlkit.data.sources import json_objects

    docs = []
    for lineno, row in json_objects(path):
        if not isinstance(row.get("text"), str):
            raise UserError(f"{path}: line {lineno} needs a string `text` (and `title`)")
        docs.append(Document(title=str(row.get("title") or ""), text=row["text"], **_metadata(row)))
    return docs


def _load_hotpotqa(path: Path) -> list[Document]:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: a HotpotQA corpus is a JSON object title -> [sentence, ...]")
    docs = []
    for title, sentences in data.items():
        if not (isinstance(sentences, list) and all(isinstance(s, str) for s in sentences)):
            raise UserError(f"{path}: {title!r} must map to a list of sentences")
        docs.append(Document(title=title, text="".join(sentences)))  # sentences keep their leading spaces
    return docs


def _metadata(row: dict[str, Any]) -> dict[str, str | None]:
    return {key: None if row.get(key) is None else str(row[key]) for key in METADATA}
