"""Corpora in the formats people have, with their own ids, chunked offline without the policy's tokenizer."""

import json

import pytest

from rlkit.envs.retrieval import RetrievalEnv
from rlkit.errors import UserError
from rlkit.recipe import RetrievalSpec
from rlkit.retrieval import build_retriever
from rlkit.retrieval.corpus import load_documents
from tests.test_cli import rlkit

ROWS = [{"pid": "d-7", "name": "Avery County", "content": "Avery County is a county in North Carolina.", "year": 1911},
        {"pid": "d-9", "name": "Mitchell County", "content": "Mitchell County lies west of Avery County.", "year": 1861}]
MAPPED = {"id": "pid", "title": "name", "text": "content", "metadata": ["year"]}


def _facts(docs):
    return [(d.doc_id, d.title, d.text, d.metadata) for d in docs]


def test_every_format_reads_the_same_documents_through_the_field_mapping(tmp_path):
    import datasets

    expected = [(r["pid"], r["name"], r["content"], {"year": str(r["year"])}) for r in ROWS]
    (tmp_path / "c.json").write_text(json.dumps(ROWS))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "c.parquet"))
    datasets.Dataset.from_list(ROWS).to_csv(str(tmp_path / "c.csv"), index=False)
    for name in ("c.json", "c.jsonl", "c.parquet", "c.csv"):
        docs = load_documents(RetrievalSpec(corpus=str(tmp_path / name), fields=MAPPED))
        assert _facts(docs) == expected, name

    # A JSON array of {title, text} with the user's ids under `doc_id` or `id`: read as is, ids kept.
    (tmp_path / "plain.json").write_text(json.dumps([{"doc_id": "a1", "title": "A", "text": "alpha"},
                                                     {"id": 5, "title": "B", "text": "beta"}]))
    assert _facts(load_documents(RetrievalSpec(corpus=str(tmp_path / "plain.json")))) == [
        ("a1", "A", "alpha", {}), ("5", "B", "beta", {})]

    # A dict keyed by title: sentence lists, plain text, or objects; the title is the id.
    (tmp_path / "titled.json").write_text(json.dumps({"Paris": ["Paris is a city.", " In France."], "Lyon": "A city.",
                                                      "Nice": {"text": "On the coast.", "id": "n-1"}}))
    assert _facts(load_documents(RetrievalSpec(corpus=str(tmp_path / "titled.json")))) == [
        ("Paris", "Paris", "Paris is a city. In France.", {}), ("Lyon", "Lyon", "A city.", {}),
        ("n-1", "Nice", "On the coast.", {})]

    with pytest.raises(UserError, match=r"c\.json: item 0 needs a string `body`.*its keys: pid, name, content, year"):
        load_documents(RetrievalSpec(corpus=str(tmp_path / "c.json"), fields={"text": "body"}))
    with pytest.raises(UserError, match=r"retrieval.fields.id: a document has no `uid`"):
        load_documents(RetrievalSpec(corpus=str(tmp_path / "c.json"), fields={"id": "uid", "text": "content"}))


def test_ids_survive_chunking_and_every_search_result_carries_them(tmp_path):
    long = [{"pid": f"p{i}", "name": f"Doc {i}", "content": " ".join(f"w{i}x{j}" for j in range(25))}
            for i in range(3)]
    (tmp_path / "c.json").write_text(json.dumps(long))
    # `words` needs no tokenizer: the model named here does not exist anywhere, and is never loaded.
    spec = RetrievalSpec(corpus=str(tmp_path / "c.json"), fields={"id": "pid", "title": "name", "text": "content"},
                         tokenizer="words", chunk_tokens=10, chunk_overlap=2, top_k=2, cache_dir=str(tmp_path / "ix"))
    retriever = build_retriever(spec, model_name="no-such/model", show_progress=False)
    assert len(retriever) == 9  # 25 words in windows of 10 sharing 2: 0-9, 8-17, 16-24
    assert [c.doc_id for c in retriever.chunks] == ["p0"] * 3 + ["p1"] * 3 + ["p2"] * 3
    assert retriever.chunks[1].text.split()[:2] == ["w0x8", "w0x9"]
    reloaded = build_retriever(spec, show_progress=False)
    assert not reloaded.built and [c.doc_id for c in reloaded.chunks] == [c.doc_id for c in retriever.chunks]

    env = RetrievalEnv(retriever)
    env.reset()
    env.search("w1x3 w1x20")
    (search,) = env.searches
    assert search["query"] == "w1x3 w1x20"
    assert sorted((r["doc_id"], r["id"]) for r in search["results"]) == [("p1", "1:0"), ("p1", "1:2")]


def test_chars_window_and_an_unavailable_tokenizer_is_one_line(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "abcdefghij"}\n')
    spec = RetrievalSpec(corpus=str(tmp_path / "c.jsonl"), tokenizer="chars", chunk_tokens=4,
                         cache_dir=str(tmp_path / "ix"))
    assert [c.text for c in build_retriever(spec, show_progress=False).chunks] == ["abcd", "efgh", "ij"]

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: r\nalgorithm: grpo\nmodel: {name_or_path: Qwen/Qwen3-4B-Instruct-2507}\n"
        f"data: {{task: qa, train: {{path: {tmp_path / 'q.jsonl'}}}}}\nrewards: [{{name: qa_correct}}]\n"
        f"env: {{name: retrieval}}\nretrieval: {{corpus: {tmp_path / 'c.jsonl'}, cache_dir: {tmp_path / 'ix2'}}}\n")
    res = rlkit("index", "build", recipe, env={"HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "retrieval.tokenizer: cannot load the tokenizer 'Qwen/Qwen3-4B-Instruct-2507'" in res.stderr
    assert "`retrieval.tokenizer: words`" in res.stderr
    (tmp_path / "q.jsonl").write_text('{"question": "Q?", "answer": "A"}\n')
    rolled = rlkit("rollout", recipe, "--split", "train", "--endpoint", "http://127.0.0.1:9/v1", "--served-model", "m",
                   env={"HF_HUB_OFFLINE": "1"})  # the index is built before any request: the same one line
    assert rolled.returncode == 2 and rolled.stderr.strip().splitlines() == res.stderr.strip().splitlines()
    ok = rlkit("index", "build", recipe, "--set", "retrieval.tokenizer=words", env={"HF_HUB_OFFLINE": "1"})
    assert ok.returncode == 0 and "1 chunks, built" in ok.stdout, ok.stderr


def test_a_hub_corpus_goes_through_the_same_fields_and_fails_in_one_line_offline():
    spec = RetrievalSpec(corpus="someone/wiki-paragraphs", corpus_config="en", fields={"text": "paragraph"})
    with pytest.raises(UserError) as e:
        load_documents(spec)  # tests run with HF_DATASETS_OFFLINE=1
    assert str(e.value).startswith("retrieval.corpus: cannot load 'someone/wiki-paragraphs' (config `en`) from the Hub")
    assert "\n" not in str(e.value)
