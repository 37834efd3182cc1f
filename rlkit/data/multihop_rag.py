"""MultiHop-RAG (Tang & Yang, 2024): multi-hop questions over 609 news articles, answered with a search tool.

Rows are MultiHop-RAG queries: ``query``, ``answer``, ``question_type`` (inference, comparison,
temporal, null) and ``evidence_list`` (the facts that answer it). They load from the Hub
(``yixuantt/MultiHopRAG``, config ``MultiHopRAG``) or a local ``MultiHopRAG.json``; the articles are
the retrieval corpus (``retrieval: {corpus: yixuantt/MultiHopRAG}``). ``generate`` builds queries
in the same format over the synthetic news corpus of :mod:`rlkit.retrieval.synthetic`, for smoke runs.

The agent searches, then answers briefly inside ``<answer></answer>``; null queries (no evidence in
the corpus) are answered "Insufficient information.". Metrics: EM, F1 and accuracy
(:mod:`rlkit.rewards.qa`), overall and per ``question_type``. This task is a preset of the generic
``qa`` task (:mod:`rlkit.data.qa`): its columns mapped, a news prompt and a news search description;
an episode succeeds on exact match.
"""

from __future__ import annotations

import json
from typing import Any

from rlkit.errors import UserError
from rlkit.retrieval.synthetic import NULL_ANSWER  # MultiHop-RAG's answer to a null query

HUB_ID = "yixuantt/MultiHopRAG"
_INSTRUCTIONS = (
    "You answer questions about news articles. Use the `search` tool to find the articles that hold the facts "
    "you need; search again with other words if the results do not answer the question. Then answer briefly "
    "(a name, a short phrase, or Yes/No) inside <answer></answer>, for example <answer>Yes</answer>. If the "
    f"articles do not contain the answer, reply <answer>{NULL_ANSWER}</answer>."
)
# Prompt variants (`data.prompt`): thinking models are asked to keep each turn's reasoning short.
PROMPTS = {
    "default": _INSTRUCTIONS,
    "thinking": _INSTRUCTIONS + " Think briefly before each search and before answering: a few sentences at most.",
}
# What the `search` tool says about this corpus (the generic retrieval env describes no corpus in particular).
SEARCH_DESCRIPTION = (
    "Search the news articles for passages relevant to a query. Name the entities, outlets and dates you are "
    "looking for (e.g. \"TechCrunch OpenAI board October 2023\"); each search returns the best-matching passages, "
    "each with its title, source, publication date and text."
)
# What this task presets in the environments it runs with (`env.args` wins): the search tool describes the news.
ENV_ARGS = {"retrieval": {"description": SEARCH_DESCRIPTION}}
CUSTOM_PROMPTS = True  # `data.prompt` may also be a file or the text itself
_REQUIRED = ("query", "answer", "question_type", "evidence_list")
# The default synthetic corpus; `retrieval: {synthetic: ...}` in a smoke run uses the same numbers.
SYNTHETIC_ARTICLES = 40
SYNTHETIC_CORPUS_SEED = 0


def load(source: Any):
    """Queries from a local ``MultiHopRAG.json`` (or .jsonl) or the Hub, or SFT trajectories (``messages``)."""
    from rlkit.data.sources import load_source

    if source.path == HUB_ID and source.name is None:
        source = source.model_copy(update={"name": "MultiHopRAG"})
    ds = load_source(source)
    if "messages" in ds.column_names:  # trajectories from `rlkit rollout --sft-out` (teacher -> SFT)
        return ds
    missing = [c for c in _REQUIRED if c not in ds.column_names]
    if missing:
        raise UserError(f"{source.path}: not MultiHop-RAG queries (missing {', '.join(missing)}) nor SFT "
                        f"trajectories (`messages`); found {', '.join(ds.column_names)}")
    return ds


def generate(n: int, seed: int = 0, articles: int = SYNTHETIC_ARTICLES, corpus_seed: int = SYNTHETIC_CORPUS_SEED,
             wording: str = "classic"):
    """``n`` MultiHop-RAG-format queries over the synthetic corpus ``articles(articles, corpus_seed)``;
    ``wording: other`` asks them in shapes the classic family never uses."""
    import datasets

    from rlkit.retrieval import synthetic

    corpus = synthetic.articles(articles, seed=corpus_seed)
    return datasets.Dataset.from_list(synthetic.queries(corpus, n, seed=seed, wording=wording))


def chat_prompt(query: str, variant: str = "default") -> list[dict[str, str]]:
    return [{"role": "system", "content": PROMPTS.get(variant, variant)}, {"role": "user", "content": query.strip()}]


# MultiHop-RAG as a preset of the generic `qa` task: its columns mapped, its prompts, its search description.
# The evidence's articles are the supporting documents, matched by title (the corpus has no ids): evidence recall.
COLUMNS_PRESET = {"question": "query", "answer": "answer", "type": "question_type", "supporting_ids": "evidence_list"}


def grpo_rows(ds, prompt: str = "default"):
    """Prompts plus ``answer`` and ``question_type`` (TRL passes both to the rewards and the environment)."""
    from rlkit.data import qa

    _require_queries(ds)
    return qa.grpo_rows(qa.canonical(ds, COLUMNS_PRESET, where="MultiHop-RAG queries"), PROMPTS.get(prompt, prompt))


eval_rows = grpo_rows


def sft_rows(ds, prompt: str = "default"):
    """SFT rows: trajectories as they are (``messages`` + ``tools``), or oracle trajectories for queries.

    Real SFT data are a teacher's successful trajectories (``rlkit rollout --sft-out``). For generated
    queries (smoke runs) each row becomes one search for the query, a tool result holding the gold
    evidence facts, and the gold answer — the shape of a good episode, so the pipeline runs end to end.
    """
    if "messages" in ds.column_names:
        return ds
    from rlkit.envs.retrieval import format_passage
    from rlkit.retrieval import Passage

    tools = json.dumps(search_tool_schemas())

    def oracle(row: dict[str, Any]) -> dict[str, Any]:
        passages = [Passage(id=str(i), title=e["title"], text=e["fact"], source=e["source"],
                            published_at=e["published_at"], url=e.get("url"), score=1.0)
                    for i, e in enumerate(row["evidence_list"])]
        facts = "\n\n".join(format_passage(i, p) for i, p in enumerate(passages, 1)) or "No results."
        call = {"type": "function", "function": {"name": "search", "arguments": {"query": row["query"]}}}
        messages = [*chat_prompt(row["query"], prompt),
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "search", "content": facts},
                    {"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}]
        return {"messages": messages, "tools": tools}

    return ds.map(oracle, remove_columns=ds.column_names)


def search_tool_schemas() -> list[dict[str, Any]]:
    from transformers.utils import get_json_schema

    from rlkit.envs.retrieval import search_function

    return [get_json_schema(search_function(SEARCH_DESCRIPTION))]


def retrieval_queries(ds) -> list[dict[str, Any]]:
    """Queries with gold facts for ``rlkit index eval``: null queries have none and are left out."""
    _require_queries(ds)
    return [{"query": row["query"], "facts": [e["fact"] for e in row["evidence_list"]]}
            for row in ds if row["evidence_list"]]


def _require_queries(ds) -> None:
    if "query" not in ds.column_names:
        raise UserError("this split holds SFT trajectories (`messages`), not MultiHop-RAG queries; use a split of "
                        "queries (e.g. --split eval)")


def episode_metrics(completion: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, float]:
    """EM, F1 and accuracy (MultiHop-RAG's shared-word rule, reported for comparison with the paper)."""
    from rlkit.data import qa

    return qa.episode_metrics(completion, row)


def success(metrics: dict[str, float]) -> bool:
    """Exact match, as for any QA task: MultiHop-RAG's accuracy passes a wrong answer that shares a word with
    the gold ("Mitchell County" for "Avery County"); `data.success: accuracy` asks for it anyway."""
    return metrics.get("em", 0.0) == 1.0
