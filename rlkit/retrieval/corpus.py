"""Documents for the search tool, from the corpus formats people have, or generated.

A corpus is a list of `Document`s. `RetrievalSpec.corpus` names a local file or a Hub dataset id;
`format: auto` decides from the file:

- `.jsonl`: one object per line; `.parquet` / `.csv`: one row per document;
- a `.json` array of objects (MultiHop-RAG's `corpus.json` is one whose text field is `body`);
- a `.json` object keyed by title, each value a list of sentences (HotpotQA's closed corpus, joined
  as they are), a string, or an object;
- a Hub dataset id: `yixuantt/MultiHopRAG` reads its `corpus` config; any other id reads
  `retrieval.corpus_config` / `retrieval.corpus_split`.

`retrieval.fields` names the columns: `text` (default `text`, or `body` when there is no `text`),
`title`, `id` (default the first of `id`, `doc_id`, `_id` a row has; a dict keyed by title uses the
title) and `metadata` (more columns kept with each passage and shown with it). The id is the user's
own: it survives chunking, is recorded with every search result, and is what `rlkit index eval` and
evidence recall match supporting ids against. `corpus_identity` is what the index cache key records.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.errors import BadValue, UserError
from rlkit.retrieval.dates import readable_date
from rlkit.retrieval.synthetic import VERSION, articles

MULTIHOP_RAG_HUB = "yixuantt/MultiHopRAG"
METADATA = ("source", "published_at", "url", "author", "category")
ID_COLUMNS = ("id", "doc_id", "_id")
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_TABLES = {".parquet": "parquet", ".csv": "csv"}


@dataclass(frozen=True)
class Document:
    title: str
    text: str
    source: str | None = None
    published_at: str | None = None
    url: str | None = None
    author: str | None = None
    category: str | None = None
    doc_id: str | None = None  # the user's id for the document (None when the corpus has none)
    metadata: dict[str, str] = field(default_factory=dict)  # `retrieval.fields.metadata` columns


def load_documents(spec: Any) -> list[Document]:
    """The documents a `RetrievalSpec` names; a `UserError` for missing files, wrong shapes or no documents."""
    if spec.synthetic is not None:
        try:
            generated = articles(spec.synthetic, seed=spec.seed)
        except BadValue as e:
            raise UserError(f"retrieval.synthetic: {e}") from None
        return _from_rows(generated, "synthetic corpus", spec, "article")
    path = _local_file(spec.corpus)
    if path is None:
        docs = _load_hub(spec)
    else:
        fmt = resolve_format(path, spec.format)
        if fmt == "multihop_rag":
            docs = _load_multihop_rag(path, spec)
        elif fmt == "jsonl":
            docs = _load_jsonl(path, spec)
        elif fmt == "hotpotqa":
            docs = _load_titled(path, spec)
        elif fmt == "json":
            docs = _load_array(path, spec)
        else:
            docs = _load_table(path, fmt, spec)
    if not docs:
        raise UserError(f"{spec.corpus}: the corpus is empty")
    _check_unique_ids(docs, spec.corpus)
    return docs


def resolve_format(path: Path, fmt: str) -> str:
    """`auto` -> the format the file's extension and top-level JSON shape say."""
    if fmt != "auto":
        return fmt
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix in _TABLES:
        return _TABLES[path.suffix]
    data = _read_json(path)
    if isinstance(data, dict):
        return "hotpotqa"
    if isinstance(data, list) and data and all(isinstance(row, dict) for row in data[:100]):
        return "multihop_rag" if "body" in data[0] and "text" not in data[0] else "json"
    raise UserError(f"{path}: cannot tell the corpus format (expected a JSON array of objects, a JSON object "
                    "title -> text, or a .jsonl/.parquet/.csv file); set retrieval.format")


def corpus_identity(spec: Any) -> dict[str, Any]:
    """What the index cache key records about the corpus: file content hash, Hub id, or generator settings."""
    fields = spec.fields.model_dump() if hasattr(spec, "fields") else {}
    if spec.synthetic is not None:
        return {"synthetic": spec.synthetic, "seed": spec.seed, "generator": VERSION, "format": "multihop_rag"}
    path = _local_file(spec.corpus)
    if path is None:
        return {"hub": spec.corpus, "config": spec.corpus_config, "split": spec.corpus_split, "fields": fields}
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "format": resolve_format(path, spec.format),
            "fields": fields}


def byline(source: str | None, published_at: str | None) -> str:
    """"BBC News, October 5, 2023": the outlet and date the way questions name them (either may be missing)."""
    return ", ".join(part for part in (source, readable_date(published_at)) if part)


def _local_file(corpus: str) -> Path | None:
    """The corpus file, or None for a Hub dataset id (`owner/name` that is not a local path)."""
    path = Path(corpus).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise UserError(f"retrieval.corpus: {corpus} is not a file; give the corpus file itself")
    if _HUB_ID.match(corpus) and not corpus.endswith((".json", ".jsonl", ".parquet", ".csv")):
        return None
    raise UserError(f"retrieval.corpus: file not found: {corpus}")


def _load_hub(spec: Any) -> list[Document]:
    if spec.format not in ("auto", "multihop_rag", "hub"):
        raise UserError(f"retrieval.corpus: format {spec.format!r} reads a local file, and there is none named "
                        f"{spec.corpus}; use format auto for a Hub dataset")
    import datasets

    config = spec.corpus_config or ("corpus" if spec.corpus == MULTIHOP_RAG_HUB else None)
    try:
        rows = datasets.load_dataset(spec.corpus, config, split=spec.corpus_split)
    except (OSError, ValueError) as e:  # offline, unknown id, unknown config or split
        what = f" (config `{config}`)" if config else ""
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"retrieval.corpus: cannot load {spec.corpus!r}{what} from the Hub: {reason}") from None
    return _from_rows(rows, spec.corpus, spec)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


def _load_multihop_rag(path: Path, spec: Any) -> list[Document]:
    data = _read_json(path)
    if not isinstance(data, list):
        raise UserError(f"{path}: a MultiHop-RAG corpus is a JSON array of articles, got {type(data).__name__}")
    for i, article in enumerate(data):
        if not (isinstance(article, dict) and isinstance(article.get("title"), str)
                and isinstance(article.get("body"), str)):
            raise UserError(f"{path}: article {i} needs string `title` and `body` (MultiHop-RAG corpus format)")
    return _from_rows(data, str(path), spec, "article")


def _load_array(path: Path, spec: Any) -> list[Document]:
    data = _read_json(path)
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON array of documents, got a JSON {type(data).__name__}")
    return _from_rows(data, str(path), spec, "item")


def _load_jsonl(path: Path, spec: Any) -> list[Document]:
    from rlkit.jsonl import numbered_records

    numbered = list(numbered_records(path))
    return _from_rows([row for _, row in numbered], str(path), spec, "line", [n for n, _ in numbered])


def _load_titled(path: Path, spec: Any) -> list[Document]:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: a corpus keyed by title is a JSON object title -> [sentence, ...]")
    rows = []
    for title, value in data.items():
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            value = "".join(value)  # HotpotQA's sentences keep their leading spaces
        if isinstance(value, str):
            value = {spec.fields.text: value}
        if not isinstance(value, dict):
            raise UserError(f"{path}: {title!r} must map to a list of sentences, a text or an object")
        # The key is the title, and the id unless the object carries one.
        rows.append({spec.fields.title: title, **value, "__key__": title})
    return _from_rows(rows, str(path), spec, "entry")


def _load_table(path: Path, fmt: str, spec: Any) -> list[Document]:
    if fmt not in ("parquet", "csv"):
        raise UserError(f"{path}: unknown corpus format {fmt!r}")
    import datasets

    try:
        rows = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as e:  # the datasets library raises many types for a malformed file
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: could not read {fmt} file: {reason}") from None
    return _from_rows(rows, str(path), spec, "row", [i + 2 for i in range(len(rows))] if fmt == "csv" else None)


def _from_rows(rows: Iterable[dict[str, Any]], where: str, spec: Any, what: str = "row",
               numbers: list[int] | None = None) -> list[Document]:
    """Documents from row objects through `spec.fields`; a UserError naming the first row that does not fit."""
    fields = spec.fields
    docs = []
    for i, row in enumerate(rows):
        number = numbers[i] if numbers else i
        if not isinstance(row, dict):
            raise UserError(f"{where}: {what} {number} is a {type(row).__name__}, not an object")
        text_key = fields.text if fields.text in row or "body" not in row or fields.text != "text" else "body"
        text = row.get(text_key)
        if not isinstance(text, str):
            keys = ", ".join(k for k in row if k != "__key__")
            raise UserError(f"{where}: {what} {number} needs a string `{fields.text}` (and `{fields.title}`); "
                            f"its keys: {keys or 'none'}; map yours with retrieval.fields")
        title = row.get(fields.title)
        docs.append(Document(title="" if title is None else str(title), text=text, doc_id=_doc_id(row, fields),
                             metadata={key: str(row[key]) for key in fields.metadata if row.get(key) is not None},
                             **{key: None if row.get(key) is None else str(row[key]) for key in METADATA}))
    return docs


def _doc_id(row: dict[str, Any], fields: Any) -> str | None:
    if fields.id is not None:
        if row.get(fields.id) is None:
            raise UserError(f"retrieval.fields.id: a document has no `{fields.id}`; its keys: "
                            f"{', '.join(k for k in row if k != '__key__')}")
        return str(row[fields.id])
    for key in ID_COLUMNS:
        if row.get(key) is not None:
            return str(row[key])
    return row.get("__key__")


def _check_unique_ids(docs: list[Document], where: str | None) -> None:
    seen: dict[str, int] = {}
    for i, doc in enumerate(docs):
        if doc.doc_id is None:
            continue
        if doc.doc_id in seen:
            raise UserError(f"{where}: documents {seen[doc.doc_id]} and {i} share the id {doc.doc_id!r}; "
                            "ids must be unique (or map another column with retrieval.fields.id)")
        seen[doc.doc_id] = i
