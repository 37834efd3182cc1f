"""Read a dataset from a local file or the Hugging Face Hub, with plain errors for the usual mistakes; and find the
public sets the demos report on (GSM8K, IFEval, HotpotQA's closed set) in a data folder or upstream."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.errors import UserError
from rlkit.jsonl import numbered_records

log = logging.getLogger("rlkit")
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_source(source: Any, required: tuple[str, ...] = ()):
    """Load ``source.path`` (local ``.jsonl``/``.json``/``.parquet``/``.csv`` or a Hub id) as a Dataset."""
    import datasets

    path = str(source.path)
    local = Path(path).expanduser()
    if local.suffix in _FORMATS or local.exists() or path.startswith((".", "/", "~")):
        if not local.exists():
            raise UserError(f"{path}: no such data file")
        if local.is_dir():
            raise UserError(f"{path}: is a directory; point `path:` at a .jsonl, .json, .parquet or .csv file")
        if local.suffix not in _FORMATS:
            raise UserError(f"{path}: unsupported file type {local.suffix!r}; use one of {', '.join(_FORMATS)}")
        if local.stat().st_size == 0:
            raise UserError(f"{path}: the dataset is empty")
        if local.suffix == ".jsonl":
            for _ in numbered_records(local):  # names the first bad line, which datasets' own error does not
                pass
        quiet = logging.getLogger("datasets")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # its error log would repeat ours, less clearly
        try:
            ds = datasets.load_dataset(_FORMATS[local.suffix], data_files=str(local), split="train")
        except Exception as e:  # the datasets library raises many types for a malformed file
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"{path}: could not read {local.suffix} file: {reason}") from None
        finally:
            quiet.setLevel(level)
    else:
        ds = _load_hub(path, source.name, source.split)
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(ds.column_names)}")
    return ds


def _load_hub(path: str, name: str | None, split: str):
    import datasets
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        return datasets.load_dataset(path, name, split=split)
    except (ConnectionError, OfflineModeIsEnabled) as e:
        raise UserError(f"{path}: cannot reach the Hugging Face Hub ({type(e).__name__}); "
                        "download the dataset while online, or point `path:` at a local file") from None
    except datasets.exceptions.DatasetNotFoundError:
        raise UserError(f"{path}: no such dataset on the Hub (or no local file of that name)") from None
    except ValueError as e:
        if "split" in str(e).lower() or "config" in str(e).lower():
            raise UserError(f"{path}: {str(e).splitlines()[0]}") from None
        raise


# --- the public sets the demos report on ---------------------------------------------------------------------
# Where each comes from, first found wins: a data folder (``--data-dir`` or $RLKIT_DATA_DIR) in the layout below;
# then upstream through ``datasets`` (the Hub at a pinned revision, or a pinned file checked by its sha256), which
# caches it and, offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), reads only that cache; else the row that needs it
# is skipped with one line saying what is missing and how to get it.

DATA_DIR_ENV = "RLKIT_DATA_DIR"
FETCH_COMMAND = "rlkit demo --fetch-data"
# HippoRAG's repository, branch `legacy`: its HotpotQA closed set (100 train questions, 994 titles) is on no Hub
# dataset; these are the files and sha256 sums ../shared/data/hotpotqa_closed/README.md records.
HIPPORAG_COMMIT = "b144c46df14cabe5f5822d8caded4bec5f709461"
HIPPORAG = f"https://raw.githubusercontent.com/OSU-NLP-Group/HippoRAG/{HIPPORAG_COMMIT}/data/"


@dataclass(frozen=True)
class PublicSet:
    """A public data set: its files in a data folder (``folder/files``) and where upstream keeps it: a Hub dataset
    (``hub``: id, config, split) at ``revision``, or ``urls`` ((url, sha256) per file)."""

    what: str
    folder: str
    files: tuple[str, ...]
    hub: tuple[str, str | None, str] | None = None
    revision: str | None = None
    urls: tuple[tuple[str, str], ...] = ()
    origin: str = ""  # how the line names ``urls``

    def upstream(self) -> str:
        return f"{self.hub[0]}@{self.revision[:7]}" if self.hub and self.revision else self.origin


# Revisions: the Hub commits inspect_evals pins for these sets (GSM8K: its 0.20 gsm8k task; IFEval: its ifeval task),
# read from code that quotes them, not checked against the Hub from here.
PUBLIC_SETS = {
    "gsm8k": PublicSet("GSM8K test (1319 problems)", "gsm8k", ("test.jsonl",), ("openai/gsm8k", "main", "test"),
                       "cc7b047b6e5bb11b4f1af84efc572db110a51b3c"),
    "ifeval": PublicSet("IFEval prompts (541)", "ifeval", ("input_data.jsonl",), ("google/IFEval", None, "train"),
                        "966cd89545d6b6acfd7638bc708b98261ca58e84"),
    "hotpotqa": PublicSet(
        "HotpotQA's closed set (100 questions, 994 titles)", "hotpotqa_closed",
        ("hotpotqa_train.json", "hotpotqa_train_corpus.json"),
        urls=((HIPPORAG + "hotpotqa_train.json", "6c0e2689d03c94b3bb4d5f94ed806ea4f4eb4f46c12132f8e91df774ad5c5a22"),
              (HIPPORAG + "hotpotqa_train_corpus.json",
               "2671af600095eabc5b3f3bc3728861682f14fcced84ef1386509a8ae92647f88")),
        origin=f"github.com/OSU-NLP-Group/HippoRAG@{HIPPORAG_COMMIT[:7]}"),
}


def data_dir(flag: Path | None = None) -> Path | None:
    """The data folder: ``flag`` (``--data-dir``), else $RLKIT_DATA_DIR, else None; one that is not a folder is a
    one-line error."""
    where, name = (flag, "--data-dir") if flag is not None else (os.environ.get(DATA_DIR_ENV) or None, DATA_DIR_ENV)
    if where is None:
        return None
    path = Path(where).expanduser()
    if not path.is_dir():
        raise UserError(f"{name} {where}: no such folder; give a folder holding gsm8k/test.jsonl, "
                        f"ifeval/input_data.jsonl or hotpotqa_closed/ (`{FETCH_COMMAND} --data-dir DIR` writes one)")
    return path


def public_sets(needs: dict[str, str], folder: Path | None, copies: Path) -> dict[str, Path | None]:
    """Each set in ``needs`` (key of :data:`PUBLIC_SETS` -> what needs it, for the line when it is missing) as a
    folder in the data folder's layout, or None. A set not in ``folder`` (default: $RLKIT_DATA_DIR) comes from
    upstream and is written to ``copies/<its folder>``. One log line per set: where it came from (info), or what is
    skipped, why and how to get it (a warning)."""
    folder = data_dir(folder)
    found: dict[str, Path | None] = {}
    for key, use in needs.items():
        spec = PUBLIC_SETS[key]
        if folder is not None and all((folder / spec.folder / name).is_file() for name in spec.files):
            found[key] = folder / spec.folder
            log.info("%s: %s", spec.what, found[key])
            continue
        try:
            found[key] = fetch(spec, copies / spec.folder)
            log.info("%s: %s -> %s", spec.what, spec.upstream(), found[key])
        except ConnectionError as e:
            found[key] = None
            absent = (f"{folder} has no {spec.folder}/{spec.files[0]}" if folder is not None
                      else f"no data folder (--data-dir or {DATA_DIR_ENV})")
            log.warning("%s: %s, and %s: %s is skipped; get it with `%s` where %s can be reached", spec.what, absent, e,
                        use, FETCH_COMMAND, "the Hub" if spec.hub else "github.com")
    return found


def fetch(spec: PublicSet, out: Path) -> Path:
    """``spec``'s files from upstream into ``out`` (through ``datasets``, cached); ConnectionError with the reason
    when upstream cannot be reached and nothing is cached."""
    import datasets

    offline = "offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE) and not in datasets' cache"
    quiet = logging.getLogger("datasets")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # offline, datasets warns that it reads its cache: the line we print says so
    try:
        if spec.hub:
            repo, config, split = spec.hub
            try:
                rows = datasets.load_dataset(repo, config, split=split, revision=spec.revision)
            except ConnectionError as e:
                raise ConnectionError(offline if datasets.config.HF_HUB_OFFLINE else str(e)) from None
            texts = [_jsonl(rows)]
        else:
            manager = datasets.DownloadManager(download_config=datasets.DownloadConfig(use_etag=False))
            try:
                paths = manager.download([url for url, _ in spec.urls])
            except OSError as e:  # ConnectionError offline or unreachable, FileNotFoundError for a 404
                raise ConnectionError(offline if datasets.config.HF_HUB_OFFLINE else
                                      f"{spec.upstream()} cannot be reached ({type(e).__name__})") from None
            texts = [Path(path).read_bytes() for path in paths]
            for (url, sha), data in zip(spec.urls, texts, strict=True):
                if hashlib.sha256(data).hexdigest() != sha:
                    raise UserError(f"{url}: its sha256 is not the pinned {sha[:12]}…; upstream changed it")
    finally:
        quiet.setLevel(level)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in zip(spec.files, texts, strict=True):
        (out / name).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return out


def _jsonl(rows: Any) -> str:
    """Hub rows as the upstream JSONL: a field of a nested mapping that the Hub's table schema filled with null
    (IFEval's ``kwargs``: every instruction's keys on every row) is dropped again."""
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if v is not None}
        return [plain(v) for v in value] if isinstance(value, list) else value

    return "".join(json.dumps(plain(row), ensure_ascii=False) + "\n" for row in rows)
