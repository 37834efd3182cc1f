"""Bring your own data: a user's QA file, corpus and prompt through every agent command, from YAML alone."""

import json
import re
import subprocess
import sys

import pytest

from rlkit.data import load_rows, task_rows
from rlkit.errors import UserError
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.retrieval.evaluate import evaluate
from rlkit.retrieval.index import Passage
from rlkit.rewards.qa import qa_correct
from tests.conftest import ROOT, SHARED_DATA
from tests.scripted_server import ScriptedServer
from tests.test_cli import rlkit

HOTPOTQA = SHARED_DATA / "hotpotqa_closed"
EXAMPLE = recipes_dir() / "hotpotqa_byod_grpo.yaml"
QUESTIONS = [
    {"qid": "q1", "q": "Which county is Newland in?", "gold": "Avery County", "alts": ["Avery"], "kind": "bridge",
     "pages": ["p-1"]},
    {"qid": "q2", "q": "Where was Ada Lovelace born?", "gold": "United Kingdom", "alts": ["UK", "England"],
     "kind": "bridge", "pages": ["p-2", "p-3"]},
]
CORPUS = [{"pid": "p-1", "name": "Newland", "body": "Newland is the county seat of Avery County."},
          {"pid": "p-2", "name": "Ada Lovelace", "body": "Ada Lovelace was born in London."},
          {"pid": "p-3", "name": "London", "body": "London is the capital of the United Kingdom."},
          {"pid": "p-4", "name": "Spruce Pine", "body": "Spruce Pine is a town in Mitchell County."}]
COLUMNS = "{question: q, answer: gold, aliases: alts, id: qid, type: kind, supporting_ids: pages}"


@pytest.fixture
def user_recipe(tmp_path):
    """A qa recipe over a QA JSONL with the user's own column names and a JSON-array corpus."""
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "name: mine\nalgorithm: grpo\nmodel: {name_or_path: TINY}\n"
        f"data:\n  task: qa\n  columns: {COLUMNS}\n  train: {{path: {tmp_path / 'qa.jsonl'}}}\n"
        f"  eval: {{path: {tmp_path / 'qa.jsonl'}}}\n"
        "rewards: [{name: qa_correct}]\n"
        "env: {name: retrieval, args: {description: Search my lab notebook for passages relevant to a query.}}\n"
        f"retrieval: {{corpus: {tmp_path / 'corpus.json'}, fields: {{id: pid, title: name, text: body}}, "
        f"tokenizer: words, top_k: 2, cache_dir: {tmp_path / 'ix'}}}\n")
    return path


def test_a_qa_file_with_its_own_column_names_loads_through_data_columns(user_recipe, tmp_path):
    recipe = load_recipe(user_recipe)
    rows = task_rows(recipe, "eval", load_rows("qa", recipe.data.eval)).to_list()
    assert [(r["id"], r["answer"], r["aliases"], r["question_type"], r["supporting_ids"]) for r in rows] == [
        ("q1", "Avery County", ["Avery"], "bridge", ["p-1"]), ("q2", "United Kingdom", ["UK", "England"], "bridge",
                                                              ["p-2", "p-3"])]
    assert rows[0]["prompt"][1] == {"role": "user", "content": "Which county is Newland in?"}
    assert "news" not in rows[0]["prompt"][0]["content"]

    # Per-split columns (`data.eval.columns`) are accepted too; mistakes are one line naming the fix.
    (tmp_path / "other.jsonl").write_text('{"prompt_text": "Q?", "ans": "A"}\n')
    split = load_recipe(user_recipe, [f"data.eval={{path: {tmp_path / 'other.jsonl'}, columns: "
                                      "{question: prompt_text, answer: ans}}"])
    assert load_rows("qa", split.data.eval)["question"] == ["Q?"]
    cases = [
        (["data.columns.questoin=q"], "data.columns.questoin: not a column of task 'qa' (did you mean 'question'?)"),
        (["data.columns={question: nope, answer: gold}"], "data.columns.question: no column `nope`; found qid, q,"),
        (["data.columns={}"], "no question column `question` (map yours with data.columns.question); found qid"),
    ]
    for overrides, expected in cases:
        with pytest.raises(UserError) as e:
            recipe = load_recipe(user_recipe, overrides)
            load_rows("qa", recipe.data.eval)
        assert expected in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="data.columns.question: task 'gsm8k' maps no columns"):
        load_recipe(recipes_dir() / "gsm8k_grpo.yaml", ["data.columns={question: q}"])


def test_data_prompt_takes_a_name_a_file_or_the_text(user_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))

    def system(value):
        recipe = load_recipe(user_recipe, [f"data.prompt={value}"])
        return task_rows(recipe, "grpo", load_rows("qa", recipe.data.train))[0]["prompt"][0]["content"]

    assert system("closed_book").startswith("Answer the question briefly")
    (tmp_path / "system.txt").write_text("You are a lab assistant. Cite the notebook page.\n")
    assert system(str(tmp_path / "system.txt")) == "You are a lab assistant. Cite the notebook page."
    assert system("'Answer in one word, inside <answer></answer>.'") == "Answer in one word, inside <answer></answer>."
    for value, expected in [("thinkng", "task 'qa' has no prompt 'thinkng' (did you mean 'thinking'?)"),
                            (str(tmp_path / "none.txt"), "data.prompt: no such prompt file")]:
        with pytest.raises(UserError) as e:
            load_recipe(user_recipe, [f"data.prompt={value}"])
        assert expected in str(e.value) and "\n" not in str(e.value)
    # MultiHop-RAG, now a preset of qa, keeps its news prompt and also takes text.
    multihop = load_recipe(recipes_dir() / "multihop_rag_grpo.yaml", ["data.prompt='Be brief, use search.'"],
                           smoke=True)
    assert task_rows(multihop, "grpo", load_rows("multihop_rag", multihop.data.train))[0]["prompt"][0][
        "content"] == "Be brief, use search."
    from rlkit.data import env_factory
    from rlkit.data.multihop_rag import search_tool_schemas

    assert "news articles" in search_tool_schemas()[0]["function"]["description"]  # the preset's description
    assert env_factory(multihop).keywords["description"].startswith("Search the news articles")
    told = load_recipe(recipes_dir() / "multihop_rag_grpo.yaml", ["env.args.description='Search my notes.'"],
                       smoke=True)
    assert env_factory(told).keywords["description"] == "Search my notes."  # env.args wins over the preset


def test_aliases_and_a_success_rule_a_wrong_answer_cannot_pass():
    from rlkit.data import qa, success_rule

    row = {"answer": "United Kingdom", "aliases": ["UK"]}
    reply = [{"role": "assistant", "content": "<answer>UK</answer>"}]
    assert qa.episode_metrics(reply, row) == {"em": 1.0, "f1": 1.0, "accuracy": 1.0}
    assert qa_correct([reply, reply], answer=["United Kingdom"] * 2, aliases=[["UK"], []]) == [2.0, 0.0]

    wrong = qa.episode_metrics([{"role": "assistant", "content": "<answer>Mitchell County</answer>"}],
                               {"answer": "Avery County"})
    assert wrong == {"em": 0.0, "f1": 0.5, "accuracy": 1.0}  # MultiHop-RAG's shared-word accuracy passes it

    class Recipe:
        class data:  # noqa: N801 - a stand-in for recipe.data
            task, success = "qa", None

    verdicts = {}
    for rule in (None, "em", "f1>=0.8", "f1>=0.5", "accuracy"):
        Recipe.data.success = rule
        verdicts[rule] = success_rule(Recipe)(wrong)
    assert verdicts == {None: False, "em": False, "f1>=0.8": False, "f1>=0.5": True, "accuracy": True}
    Recipe.data.task, Recipe.data.success = "multihop_rag", None
    assert success_rule(Recipe)(wrong) is False  # the preset no longer counts a shared word as a success
    with pytest.raises(UserError, match=r"data.success: String should match pattern"):
        load_recipe(EXAMPLE, ["data.success=f1>0.8"])


def test_index_eval_matches_by_id_where_titles_repeat():
    class Fixed:
        chunks = [Passage("0:0", "Paris", "", None, None, None, 1.0, doc_id="paris-texas")]

        def search_batch(self, queries, k=None):
            return [[Passage("0:0", "Paris", "Paris, Texas.", None, None, None, 2.0, doc_id="paris-texas"),
                     Passage("1:0", "Paris", "Paris, France.", None, None, None, 1.0, doc_id="paris-france")]]

    m = evaluate(Fixed(), [{"query": "capital of France", "ids": ["paris-france"]}], ks=(1, 2))
    assert m["matched_by"] == "id"
    assert (m["recall@1"], m["hits@1"], m["recall@2"], m["mrr@2"], m["map@2"]) == (0.0, 0.0, 1.0, 0.5, 0.5)
    titled = evaluate(Fixed(), [{"query": "capital of France", "titles": ["Paris"]}], ks=(1,))
    assert titled["recall@1"] == 1.0  # what title matching would have claimed


def _reader(gold_by_question):
    """A scripted teacher: searches the question once, answers the gold when every supporting page came back."""

    def reply(request):
        messages = request["messages"]
        question = next(m["content"] for m in messages if m["role"] == "user")
        results = "\n".join(m["content"] for m in messages if m["role"] == "tool")
        if not results:
            return {"tool_calls": [{"name": "search", "arguments": {"query": question}}]}
        gold, titles = gold_by_question[question]
        shown = set(re.findall(r"^\[\d+\] (.*)$", results, re.MULTILINE))
        return {"content": f"<answer>{gold if titles <= shown else 'unknown'}</answer>"}

    return reply


@pytest.mark.slow
@pytest.mark.skipif(not HOTPOTQA.is_dir(), reason="shared/data/hotpotqa_closed is absent")
def test_the_hotpotqa_example_runs_through_every_command_without_conversion(tmp_path):
    """The README example: user-shaped files in, index eval, endpoint rollout, analyze and a smoke GRPO out."""
    made = subprocess.run([sys.executable, ROOT / "examples" / "hotpotqa_byod.py", HOTPOTQA, "data/hotpotqa_byod"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    data = tmp_path / "data" / "hotpotqa_byod"
    corpus = json.loads((data / "corpus.json").read_text())
    questions = [json.loads(line) for line in (data / "eval.jsonl").read_text().splitlines()]
    assert isinstance(corpus, list) and set(corpus[0]) == {"page_id", "page", "body_text"} and len(questions) == 20
    assert set(questions[0]) == {"qid", "q", "gold", "alt_answers", "hop_type", "evidence_pages"}
    env = {"RLKIT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}

    scored = rlkit("index", "eval", EXAMPLE, "--k", "1,2,5,10", cwd=tmp_path, env=env)
    assert scored.returncode == 0, scored.stderr
    assert "20 queries, matched by id" in scored.stdout
    table = {line.split()[1]: line.split()[3] for line in scored.stdout.splitlines() if line.startswith("│")}
    assert list(table) == ["1", "2", "5", "10"] and float(table["10"]) >= 0.85  # measured 0.900 recall@10

    titles = {p["page_id"]: p["page"] for p in corpus}
    gold = {q["q"].strip(): (q["gold"], {titles[i] for i in q["evidence_pages"]}) for q in questions}
    out = tmp_path / "trajectories.jsonl"
    with ScriptedServer(_reader(gold), model="reader") as server:
        res = rlkit("rollout", EXAMPLE, "--endpoint", server.url, "--out", out, "--sft-out", tmp_path / "sft.jsonl",
                    cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    # The tool told the model about Wikipedia paragraphs, as the recipe says, not about news articles.
    description = server.requests[0]["tools"][0]["function"]["description"]
    assert description.startswith("Search a collection of Wikipedia paragraphs") and "news" not in description
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 20
    for record, question in zip(records, questions, strict=True):
        assert record["id"] == question["qid"] and record["question_type"] == question["hop_type"]
        returned = {r["doc_id"] for s in record["searches"] for r in s["results"]}
        assert returned <= set(titles) and len(record["searches"][0]["results"]) == 3
        recall = len(returned & set(question["evidence_pages"])) / len(question["evidence_pages"])
        assert record["metrics"]["evidence_recall"] == pytest.approx(recall)
        assert record["success"] == (record["metrics"]["em"] == 1.0) == (recall == 1.0)
    successes = sum(r["success"] for r in records)
    assert 0 < successes < 20
    assert len((tmp_path / "sft.jsonl").read_text().splitlines()) == successes

    report = rlkit("analyze", out, "--markdown", env=env)
    assert report.returncode == 0, report.stderr
    assert "| question type | n | EM | F1 | accuracy | evidence recall | reward | success rate |" in report.stdout
    mean_recall = sum(r["metrics"]["evidence_recall"] for r in records) / 20
    all_row = next(line for line in report.stdout.splitlines() if line.startswith("| all |"))
    assert all_row.split("|")[6].strip() == f"{mean_recall:.3f}"

    trained = rlkit("train", EXAMPLE, "--smoke", "--output-dir", tmp_path / "run", "--set", "trainer.max_steps=1",
                    "--set", "trainer.num_generations=2", "--set", "trainer.per_device_train_batch_size=2",
                    "--set", "trainer.max_completion_length=24", cwd=tmp_path, env=env)
    assert trained.returncode == 0, trained.stderr
    resolved = (tmp_path / "run" / "recipe.resolved.yaml").read_text()
    assert "data/hotpotqa_byod/train.jsonl" in resolved and "limit: 32" in resolved and "page_id" in resolved
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").is_file()


def test_sft_out_keeps_only_successes_whose_every_tool_call_succeeded():
    from rlkit.agents.scoring import sft_records

    call = {"name": "search", "arguments": {}, "content": "ok", "error": None}
    malformed = {**call, "error": "tool arguments are not valid JSON: Expecting value"}
    records = [{"messages": [{"role": "user", "content": str(i)}], "success": success, "tool_calls": calls}
               for i, (success, calls) in enumerate([(True, [call]), (True, [call, malformed]), (False, [call]),
                                                     (True, [])])]
    rows = sft_records(records, tools=[{"type": "function", "function": {"name": "search"}}])
    assert [row["messages"][0]["content"] for row in rows] == ["0", "3"]
    assert json.loads(rows[0]["tools"])[0]["function"]["name"] == "search"
