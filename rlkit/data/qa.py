"""Short-answer QA over any file or Hub dataset, answered with a search tool (or closed-book).

The user's columns map onto rlkit's with ``data.columns`` (rlkit name -> the user's column):

    question        the question (required)
    answer          the gold answer (required); numbers are read as text
    aliases         other accepted answers: a list of strings, or one string
    id              the question's id (default: its row number)
    type            a label to report quality by (``rlkit analyze`` per type), e.g. bridge / comparison
    supporting_ids  the corpus ids (``retrieval.fields.id``; titles when the corpus has no ids) that hold
                    the evidence: a list of ids, or of ``[id, ...]`` pairs such as HotpotQA's
                    ``supporting_facts``. With them, ``rlkit index eval`` scores retrieval and every
                    episode records its evidence recall.

A column named like rlkit's is used without a mapping. ``data.prompt`` is a shipped name (``default``
for a search agent, ``thinking``, ``closed_book``), a file holding the system prompt, or the text itself.

Metrics (:mod:`rlkit.rewards.qa`) take the best over the answer and its aliases. An episode succeeds,
unless ``data.success`` says otherwise, when its answer exactly matches one of them (EM): a wrong
answer that shares a word with the gold does not pass.
"""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError

COLUMNS = ("question", "answer", "aliases", "id", "type", "supporting_ids")
_REQUIRED = ("question", "answer")
_SEARCH = (
    "Use the `search` tool to find the passages that hold the facts you need; a question may need several "
    "searches, one per fact. Search again with other words if the results do not answer the question. "
    "Then answer briefly (a name, a short phrase, a number, or yes/no) inside <answer></answer>, for example "
    "<answer>Paris</answer>."
)
PROMPTS = {
    "default": "You answer questions with the help of a document collection. " + _SEARCH,
    "thinking": "You answer questions with the help of a document collection. " + _SEARCH
    + " Think briefly before each search and before answering: a few sentences at most.",
    "closed_book": "Answer the question briefly (a name, a short phrase, a number, or yes/no) inside "
    "<answer></answer>, for example <answer>Paris</answer>.",
}
CUSTOM_PROMPTS = True  # `data.prompt` may be text or a file, not only a name in PROMPTS


def load(source: Any):
    """Questions from a file or the Hub with the user's columns renamed to rlkit's, or SFT trajectories."""
    from rlkit.data.sources import load_source

    ds = load_source(source)
    if "messages" in ds.column_names:  # trajectories from `rlkit rollout --sft-out` (teacher -> SFT)
        return ds
    return canonical(ds, source.columns or {}, where=str(source.path))


def canonical(ds, columns: dict[str, str], where: str):
    """``ds`` with rlkit's columns (``COLUMNS``) and values normalised; the user's other columns dropped."""
    mapping = {name: columns.get(name, name) for name in COLUMNS}
    for name, column in columns.items():
        if column not in ds.column_names:
            raise UserError(f"{where}: data.columns.{name}: no column `{column}`; found {', '.join(ds.column_names)}")
    for name in _REQUIRED:
        if mapping[name] not in ds.column_names:
            raise UserError(f"{where}: no {name} column `{name}` (map yours with data.columns.{name}); "
                            f"found {', '.join(ds.column_names)}")
    present = {name: column for name, column in mapping.items() if column in ds.column_names}

    def row(example: dict[str, Any], index: int) -> dict[str, Any]:
        get = {name: example[column] for name, column in present.items()}
        return {"question": str(get["question"]).strip(), "answer": _text(get["answer"]),
                "aliases": _strings(get.get("aliases")), "id": str(get.get("id", index)),
                "type": None if get.get("type") is None else str(get["type"]),
                "supporting_ids": _ids(get.get("supporting_ids"))}

    return ds.map(row, with_indices=True, remove_columns=ds.column_names)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value if v is not None]


def _ids(value: Any) -> list[str]:
    """Supporting ids in first-seen order, each once; ``[id, ...]`` items (HotpotQA's facts) give their id, and
    ``{"id" | "title": ...}`` items (MultiHop-RAG's evidence) their id, else their title."""
    ids: list[str] = []
    for item in _listed(value):
        if isinstance(item, dict):
            item = item.get("id", item.get("title"))
            if item is None:
                continue
        key = str(item[0] if isinstance(item, list | tuple) and item else item)
        if key not in ids:
            ids.append(key)
    return ids


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, str | int) else list(value)


def generate(n: int, seed: int = 0, articles: int = 40, corpus_seed: int = 0):
    """``n`` questions in rlkit's columns over the synthetic news corpus (smoke runs of a Hub-based recipe)."""
    import datasets

    from rlkit.retrieval import synthetic

    corpus = synthetic.articles(articles, seed=corpus_seed)
    rows = [{"question": q["query"], "answer": q["answer"], "aliases": [], "id": str(i), "type": q["question_type"],
             "supporting_ids": []} for i, q in enumerate(synthetic.queries(corpus, n, seed=seed))]
    return datasets.Dataset.from_list(rows)


def chat_prompt(question: str, system: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question.strip()}]


def grpo_rows(ds, prompt: str = "default"):
    """Prompts plus the gold columns rewards, the environment and the rollout engine read."""
    if "question" not in ds.column_names:
        raise UserError("this split holds SFT trajectories (`messages`), not questions; use a split of questions "
                        "(e.g. --split eval)")
    system = PROMPTS.get(prompt, prompt)
    return ds.map(lambda row: {"prompt": chat_prompt(row["question"], system), "answer": row["answer"],
                               "aliases": row["aliases"], "question_type": row["type"], "id": row["id"],
                               "supporting_ids": row["supporting_ids"]},
                  remove_columns=ds.column_names)


eval_rows = grpo_rows


def sft_rows(ds, prompt: str = "default"):
    """SFT rows are a teacher's successful trajectories (``rlkit rollout --sft-out``): ``messages`` + ``tools``."""
    if "messages" not in ds.column_names:
        raise UserError("qa SFT trains on trajectories (`messages`, `tools`); make them with `rlkit rollout "
                        "RECIPE --endpoint URL --sft-out FILE` and point data.train at that file")
    return ds


def retrieval_queries(ds) -> list[dict[str, Any]]:
    """Questions with supporting ids for ``rlkit index eval``; questions without any are left out."""
    if "question" not in ds.column_names:
        raise UserError("this split holds SFT trajectories (`messages`), not questions")
    return [{"query": row["question"], "ids": row["supporting_ids"]} for row in ds if row["supporting_ids"]]


def score(completions: list, rows) -> list[float]:
    """Closed-book ``rlkit eval``: EM of each reply's final answer against the answer and its aliases."""
    from rlkit.rewards.qa import qa_scores

    return [qa_scores(c, a, al)["em"] for c, a, al in zip(completions, rows["answer"], rows["aliases"], strict=True)]


def episode_metrics(completion: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, float]:
    """EM, F1 and accuracy of an episode's final answer against the best of the gold answer and its aliases."""
    from rlkit.rewards.qa import qa_scores
    from rlkit.rewards.text import completion_text

    return qa_scores(completion_text(completion), row["answer"], row.get("aliases") or ())


def success(metrics: dict[str, float]) -> bool:
    """Exact match with the answer or an alias (``data.success`` picks another rule)."""
    return metrics.get("em", 0.0) == 1.0
