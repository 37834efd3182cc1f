"""The oracle teacher: its episodes go through the engine, success filter, --sft-out and analyze as an endpoint's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.recipe.catalogue import recipes_dir
from tests.scripted_server import ScriptedServer

MULTIHOP = recipes_dir() / "multihop_rag_grpo.yaml"


def _endpoint_like(gold):
    """A scripted OpenAI server that makes the oracle's moves, so both teachers can be compared row by row."""

    def reply(request):
        messages = request["messages"]
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        g = gold[messages[last_user]["content"]]
        done = sum(1 for m in messages[last_user:] if m["role"] == "assistant" and m.get("tool_calls"))
        if done < len(g["searches"]):
            return {"tool_calls": [{"name": "search", "arguments": {"query": g["searches"][done]}}]}
        return {"content": f"<answer>{g['answer']}</answer>"}

    return reply


def test_oracle_teacher_passes_the_same_success_filter_as_an_endpoint(tmp_path, monkeypatch, capsys):
    from rlkit.agents.oracle import oracle_gold
    from rlkit.agents.rollout import rollout
    from rlkit.analyze import main as analyze_main
    from rlkit.recipe import load_recipe
    from rlkit.rewards.qa import qa_correct

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    overrides = ["data.eval.synthetic=16"]
    gold = oracle_gold(load_recipe(MULTIHOP, overrides, smoke=True), "eval", None)
    assert len(gold) == 16
    oracle = rollout(MULTIHOP, oracle=True, smoke=True, out=tmp_path / "oracle.jsonl",
                     sft_out=tmp_path / "oracle_sft.jsonl", show_progress=False, overrides=overrides)
    with ScriptedServer(_endpoint_like(gold)) as server:
        endpoint = rollout(MULTIHOP, endpoint=server.url, smoke=True, out=tmp_path / "endpoint.jsonl",
                           sft_out=tmp_path / "endpoint_sft.jsonl", show_progress=False, overrides=overrides)
    assert len(server.requests) > 16  # every episode asked the server at least twice (search, answer)
    records = {name: _read(result["path"]) for name, result in (("oracle", oracle), ("endpoint", endpoint))}
    for o, e in zip(records["oracle"], records["endpoint"], strict=True):
        assert o["id"] == e["id"] and o["success"] == e["success"]
        assert o["metrics"] == e["metrics"] and o["reward"] == e["reward"]
        assert [c["arguments"] for c in o["tool_calls"]] == [c["arguments"] for c in e["tool_calls"]]
    # Two hops for every typed question, one look for a null one; most hops find their evidence.
    for r in records["oracle"]:
        assert r["metrics"]["searches"] == (1 if r["question_type"] == "null_query" else 2)
    # What the teacher shows is what the search recipe's RL reward pays (at least one search, then the answer):
    # a success scores its own F1, none scores 0 for a missing search.
    search_reward = {"scale": 1.0, "metric": "f1", "min_tool_calls": 1}
    assert search_reward in [r.args for r in load_recipe(recipes_dir() / "smol_search_grpo.yaml").rewards]
    for r in records["oracle"]:
        last_user = max(i for i, m in enumerate(r["messages"]) if m["role"] == "user")
        paid = qa_correct([r["messages"][last_user + 1:]], [r["answer"]], **search_reward)
        assert paid == [pytest.approx(r["metrics"]["f1"])] and (paid[0] == 1.0 or not r["success"])
    assert oracle["successes"] == endpoint["successes"] and 8 <= oracle["successes"] <= 16
    assert oracle["sft_rows"] == endpoint["sft_rows"] == oracle["successes"]
    sft = {name: _read(tmp_path / f"{name}_sft.jsonl") for name in records}
    assert _strip(sft["oracle"]) == _strip(sft["endpoint"])
    analyze_main(oracle["path"], markdown=True)
    markdown = capsys.readouterr().out
    assert "| comparison_query |" in markdown and "| null_query |" in markdown


def test_hop_query_keeps_the_question_words_found_in_the_evidence():
    from rlkit.agents.oracle import hop_query, look_query

    evidence = {"fact": "Norvia Systems reported quarterly revenue of $120 million, up 12% from a year earlier.",
                "title": "Norvia Systems unveils the Pulse", "source": "TechCrunch"}
    question = "Did TechCrunch report higher revenue growth for Norvia Systems than Wired reported for Lumenion Labs?"
    assert hop_query(question, evidence) == "TechCrunch revenue Norvia Systems"
    assert hop_query("Who is it?", {"fact": "Nothing shared here."}) == "Nothing shared here."
    assert look_query("What price did Fortune give for the Echo 4 made by Tavish Games?") == \
        "price Fortune give Echo 4 made Tavish Games"
    assert look_query("Who is it?") == "Who is it?"  # nothing but stop words: the question itself


def test_cite_quotes_each_hop_evidence_as_the_search_showed_it_then_answers_and_scores_the_same(smollm2_dir,
                                                                                                 tmp_path):
    """--cite on the search agent's recipe: the answer turn first copies each hop's evidence line ("Outlet, date:
    fact") from what the search returned, then answers; rewards, success and SFT rows are the plain oracle's."""
    from rlkit.agents.rollout import rollout
    from rlkit.errors import UserError

    search = recipes_dir() / "smol_search_grpo.yaml"
    overrides = ["data.eval.synthetic=8"]
    runs = {cite: rollout(search, oracle=True, cite=cite, out=tmp_path / f"{cite}.jsonl",
                          sft_out=tmp_path / f"{cite}_sft.jsonl", show_progress=False, overrides=overrides)
            for cite in (False, True)}
    plain, cited = (_read(runs[cite]["path"]) for cite in (False, True))
    assert runs[True]["sft_rows"] == runs[False]["sft_rows"] == 8
    for p, c in zip(plain, cited, strict=True):
        assert (c["reward"], c["success"], c["metrics"]) == (p["reward"], p["success"], p["metrics"])
        *notes, answer = c["messages"][-1]["content"].split("\n")
        assert answer == p["messages"][-1]["content"] == f"<answer>{c['answer']}</answer>"
        assert len(notes) == (0 if c["question_type"] == "null_query" else 2)
        results = "\n".join(m["content"] for m in c["messages"] if m["role"] == "tool")
        for note in notes:  # "TechCrunch, December 16, 2023: The Atlas 8 will sell for $1199 ..."
            byline, fact = note.split(": ", 1)
            assert f"({byline})" in results and fact in results
    with pytest.raises(UserError, match="--cite is how the oracle teacher answers"):
        rollout(search, cite=True, show_progress=False, overrides=overrides)


def test_cite_never_quotes_a_fact_the_searches_did_not_return(tmp_path, monkeypatch):
    """The smoke corpus cuts articles into short chunks, so a search can find an evidence article without the
    sentence holding its fact: that fact is left out of the answer turn, the others are quoted."""
    from rlkit.agents.oracle import oracle_gold
    from rlkit.agents.rollout import rollout
    from rlkit.recipe import load_recipe

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    overrides = ["data.eval.synthetic=16", "retrieval.top_k=2"]
    gold = oracle_gold(load_recipe(MULTIHOP, overrides, smoke=True), "eval", None, cite=True)
    result = rollout(MULTIHOP, oracle=True, cite=True, smoke=True, out=tmp_path / "cited.jsonl",
                     show_progress=False, overrides=overrides)
    quoted = dropped = 0
    for r in _read(result["path"]):
        last_user = max(i for i, m in enumerate(r["messages"]) if m["role"] == "user")
        shown = "\n".join(m["content"] for m in r["messages"] if m["role"] == "tool")
        lines = r["messages"][-1]["content"].split("\n")[:-1]
        expected = [line for fact, line in gold[r["messages"][last_user]["content"]]["notes"] if fact in shown]
        assert lines == expected
        quoted += len(lines)
        dropped += len(gold[r["messages"][last_user]["content"]]["notes"]) - len(lines)
    assert quoted > 0 and dropped > 0  # both cases occur in these 16 episodes


def _read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _strip(rows):
    """SFT messages without call ids (an endpoint's and the engine's differ), tool calls as name + arguments."""
    def message(m):
        out = {k: v for k, v in m.items() if k not in ("tool_call_id", "tool_calls")}
        return out | ({"tool_calls": [c["function"] for c in m["tool_calls"]]} if m.get("tool_calls") else {})
    return [[message(m) for m in row["messages"]] for row in rows]


def test_multihop_rows_carry_their_evidence_articles_and_episodes_score_evidence_recall(tmp_path, monkeypatch):
    """MultiHop-RAG's evidence_list names the articles that answer a question: they are its supporting ids
    (matched by title, the corpus has no ids), so an episode's evidence recall is measured. The oracle's
    searches find every evidence article at top_k 2; a search that finds nothing scores 0."""
    from rlkit.agents.rollout import episode_rows, rollout
    from rlkit.data import multihop_rag
    from rlkit.recipe import load_recipe

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    overrides = ["data.eval.synthetic=8", "retrieval.top_k=2"]
    recipe = load_recipe(MULTIHOP, overrides, smoke=True)
    queries = multihop_rag.generate(8, seed=recipe.data.eval.seed)
    rows = episode_rows(recipe, "eval", None)
    assert [r["question_type"] for r in rows] == [q["question_type"] for q in queries]
    assert [r["supporting_ids"] for r in rows] == [[e["title"] for e in q["evidence_list"]] for q in queries]
    assert [len(r["supporting_ids"]) for r in rows] == [2, 2, 2, 0] * 2  # a null query has no evidence
    rollout(MULTIHOP, oracle=True, smoke=True, out=tmp_path / "oracle.jsonl", show_progress=False,
            overrides=overrides)
    recalls = [json.loads(line)["metrics"].get("evidence_recall") for line in (tmp_path / "oracle.jsonl").open()]
    assert recalls == [None if not r["supporting_ids"] else 1.0 for r in rows]


def test_rollout_warns_when_successful_teacher_episodes_earn_nothing_from_the_rl_reward(smollm2_dir, tmp_path,
                                                                                       capsys):
    """A teacher that says "Insufficient information." without searching is right (a success, an SFT row), but
    smol_search_grpo's qa_correct (min_tool_calls: 1) pays it 0: the rollout names the reward and the count."""
    from rlkit.agents.oracle import oracle_gold
    from rlkit.agents.rollout import print_summary, rollout
    from rlkit.recipe import load_recipe

    search = recipes_dir() / "smol_search_grpo.yaml"
    overrides = ["data.eval.synthetic=8"]
    gold = oracle_gold(load_recipe(search, overrides), "eval", None)
    no_look = {q: g | {"searches": []} if g["answer"] == "Insufficient information." else g for q, g in gold.items()}
    assert sum(not g["searches"] for g in no_look.values()) == 2
    results = {}
    for name, moves in (("oracle", gold), ("no_look", no_look)):
        with ScriptedServer(_endpoint_like(moves)) as server:
            results[name] = rollout(search, endpoint=server.url, out=tmp_path / f"{name}.jsonl",
                                    sft_out=tmp_path / f"{name}_sft.jsonl", show_progress=False, overrides=overrides)
    assert results["oracle"]["unpaid"] == {} and results["no_look"]["unpaid"] == {"qa_correct": 2}
    assert results["no_look"]["sft_rows"] == results["no_look"]["successes"] >= 6  # the filter keeps them
    capsys.readouterr()
    assert print_summary(results["no_look"])
    err = capsys.readouterr().err
    assert "warning: 2 of" in err and "reward qa_correct" in err and "min_tool_calls" in err
    print_summary(results["oracle"])
    assert "warning" not in capsys.readouterr().err


def test_unpaid_successes_counts_only_rewards_that_pay_other_successes():
    from rlkit.agents.scoring import unpaid_successes
    from rlkit.recipe import load_recipe

    recipe = load_recipe(recipes_dir() / "smol_search_grpo.yaml")
    records = [{"success": True, "rewards": {"qa_correct": 0.0, "answer_format": 0.5}},
               {"success": True, "rewards": {"qa_correct": 1.0, "answer_format": 0.5}},
               {"success": False, "rewards": {"qa_correct": 0.0, "answer_format": 0.0}}]
    assert unpaid_successes(records, recipe) == {"qa_correct": 1}

    def weighted(weight):
        specs = [s.model_copy(update={"weight": weight}) if s.name == "qa_correct" else s for s in recipe.rewards]
        return recipe.model_copy(update={"rewards": specs})

    assert unpaid_successes(records, weighted(0.0)) == {}  # logged only: it pays nobody
    assert unpaid_successes(records, weighted(-1.0)) == {}  # a penalty: 0 is its best score
    assert unpaid_successes(records[1:], recipe) == {}  # every success paid
