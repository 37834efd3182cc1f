import inspect
import json
import os
import pickle
import subprocess
import sys
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.envs.retrieval import RetrievalEnv, factory_kwargs
from rlkit.errors import UserError
from rlkit.recipe import RetrievalSpec
from rlkit.retrieval import Passage, build_retriever, evaluate, reciprocal_rank_fusion
from rlkit.retrieval.chunking import chunk_documents, load_tokenizer, token_windows
from rlkit.retrieval.corpus import load_documents
from rlkit.retrieval.synthetic import NULL_ANSWER, QUESTION_TYPES, articles, queries

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa_closed"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="module")
def synthetic_spec(tiny_model_dir, index_dir):
    return RetrievalSpec(synthetic=60, seed=0, tokenizer=str(tiny_model_dir), cache_dir=str(index_dir))


@pytest.fixture(scope="module")
def retriever(synthetic_spec):
    return build_retriever(synthetic_spec, show_progress=False)


def fact_queries(n_articles, n, seed=0):
    """Synthetic questions as `evaluate` takes them: query + gold facts (null queries have none)."""
    return [{"query": q["query"], "facts": [e["fact"] for e in q["evidence_list"]]}
            for q in queries(articles(n_articles, seed=seed), n, seed=seed)]


# --- synthetic corpus and questions ---------------------------------------------------------------

def test_synthetic_articles_are_multihop_rag_records_and_deterministic():
    corpus = articles(30, seed=3)
    assert corpus == articles(30, seed=3) and corpus != articles(30, seed=4)
    assert len(corpus) == 30 and len({a["title"] for a in corpus}) >= 25
    dates = [datetime.fromisoformat(a["published_at"]) for a in articles(300)]
    assert min(d.date() for d in dates).isoformat() == "2023-09-26"
    assert max(d.date() for d in dates) <= datetime(2023, 12, 26).date()
    for a in corpus:
        assert set(a) == {"title", "author", "source", "published_at", "category", "url", "body"}
        assert datetime.fromisoformat(a["published_at"]).utcoffset() is not None
        assert a["body"].count(". ") >= 4 and any(ch.isdigit() for ch in a["body"])


def test_synthetic_queries_cite_verbatim_facts():
    corpus = articles(30, seed=1)
    qs = queries(corpus, 40, seed=1)
    assert [q["question_type"] for q in qs[:4]] == list(QUESTION_TYPES)
    by_url = {a["url"]: a for a in corpus}
    for q in qs:
        if q["question_type"] == "null_query":
            assert q["evidence_list"] == [] and q["answer"] == NULL_ANSWER
            continue
        assert len(q["evidence_list"]) >= 2
        for e in q["evidence_list"]:
            article = by_url[e["url"]]
            assert e["fact"] in article["body"] and e["title"] == article["title"]
            assert e["source"] in q["query"] and e["published_at"] == article["published_at"]
        if q["question_type"] == "inference_query":
            assert q["answer"] in q["evidence_list"][0]["fact"] + q["evidence_list"][1]["fact"]
        else:
            assert q["answer"] in ("Yes", "No")
    temporal = [q for q in qs if q["question_type"] == "temporal_query"]
    for q in temporal:
        first, second = (datetime.fromisoformat(e["published_at"]) for e in q["evidence_list"])
        assert q["answer"] == ("Yes" if first < second else "No")



def test_the_second_wording_asks_the_same_questions_in_shapes_the_first_never_uses():
    corpus = articles(40)
    classic, other = queries(corpus, 40, seed=5), queries(corpus, 40, seed=5, wording="other")
    strip = [{k: v for k, v in q.items() if k != "query"} for q in classic]
    assert [{k: v for k, v in q.items() if k != "query"} for q in other] == strip  # same answers and evidence
    classic_shapes = ("Which company", "according to", "report higher", "published before", "What price did",
                      "plans to hire", "will sell the", "has a chief executive", "reported quarterly")
    for q in other:
        assert not any(shape in q["query"] for shape in classic_shapes), q["query"]
        assert all(e["source"] in q["query"] for e in q["evidence_list"])  # still names its outlets
    assert all(any(shape in q["query"] for shape in classic_shapes) for q in classic)
    with pytest.raises(ValueError, match="wording must be"):
        queries(corpus, 4, wording="casual")


# --- chunking ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "size", "overlap", "expected"), [
    (0, 4, 0, []),
    (3, 4, 0, [(0, 3)]),
    (8, 4, 0, [(0, 4), (4, 8)]),
    (9, 4, 0, [(0, 4), (4, 8), (8, 9)]),
    (10, 4, 1, [(0, 4), (3, 7), (6, 10)]),
    (11, 4, 2, [(0, 4), (2, 6), (4, 8), (6, 10), (8, 11)]),
])
def test_token_windows(n, size, overlap, expected):
    windows = token_windows(n, size, overlap)
    assert [(w.start, w.stop) for w in windows] == expected
    assert all(len(w) <= size for w in windows)
    assert all(len(set(a) & set(b)) == overlap for a, b in pairwise(windows))
    assert set().union(*windows) == set(range(n))


def test_chunks_are_exact_substrings_with_exact_sizes_and_overlap(tokenizer):
    docs = load_documents(RetrievalSpec(synthetic=12))

    def count(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    plain = chunk_documents(docs, tokenizer, size=50, overlap=0, show_progress=False)
    for d, doc in enumerate(docs):
        pieces = [c for c in plain if c.id.split(":")[0] == str(d)]
        assert [c.id for c in pieces] == [f"{d}:{i}" for i in range(len(pieces))]
        assert len(pieces) == -(-count(doc.text) // 50)
        assert "".join(c.text for c in pieces) == doc.text  # offsets cover every character, in order
        assert all((c.title, c.source, c.published_at, c.url, c.author, c.category)
                   == (doc.title, doc.source, doc.published_at, doc.url, doc.author, doc.category) for c in pieces)

    overlapping = chunk_documents(docs, tokenizer, size=50, overlap=10, show_progress=False)
    assert len(overlapping) > len(plain)
    for c in overlapping:
        assert c.text in docs[int(c.id.split(":")[0])].text
        assert count(c.text) <= 50
    for a, b in pairwise(overlapping):
        if a.id.split(":")[0] == b.id.split(":")[0]:
            shared = max(n for n in range(len(b.text) + 1) if a.text.endswith(b.text[:n]))
            assert count(b.text[:shared]) == 10


def test_facts_survive_chunking(tokenizer):
    """A fact copied verbatim from a body lies whole inside some chunk when chunks are long enough."""
    corpus = articles(12)
    chunks = chunk_documents(load_documents(RetrievalSpec(synthetic=12)), tokenizer, 200, 60, show_progress=False)
    facts = [e["fact"] for q in queries(corpus, 20) for e in q["evidence_list"]]
    assert facts and all(any(f in c.text for c in chunks) for f in facts)


# --- corpus loaders ------------------------------------------------------------------------------

def test_loaders_read_each_format(tmp_path):
    corpus = articles(5)
    (tmp_path / "corpus.json").write_text(json.dumps(corpus))
    docs = load_documents(RetrievalSpec(corpus=str(tmp_path / "corpus.json")))
    assert [(d.title, d.text, d.source, d.published_at, d.url, d.author, d.category) for d in docs] == [
        (a["title"], a["body"], a["source"], a["published_at"], a["url"], a["author"], a["category"]) for a in corpus]

    (tmp_path / "docs.jsonl").write_text('{"title": "A", "text": "alpha", "source": "Wiki"}\n\n{"text": "beta"}\n')
    docs = load_documents(RetrievalSpec(corpus=str(tmp_path / "docs.jsonl")))
    assert [(d.title, d.text, d.source) for d in docs] == [("A", "alpha", "Wiki"), ("", "beta", None)]

    (tmp_path / "hotpot.json").write_text(json.dumps({"Paris": ["Paris is a city.", " It is in France."]}))
    docs = load_documents(RetrievalSpec(corpus=str(tmp_path / "hotpot.json")))
    assert [(d.title, d.text) for d in docs] == [("Paris", "Paris is a city. It is in France.")]


@pytest.mark.parametrize(("name", "content", "fmt", "message"), [
    ("bad.jsonl", '{"text": "ok"}\n{"text": \n', "auto", r"bad\.jsonl: line 2 is not valid JSON"),
    ("notext.jsonl", '{"title": "x"}\n', "jsonl", r"notext\.jsonl: line 1 needs a string `text`"),
    ("empty.json", "[]", "multihop_rag", r"empty\.json: the corpus is empty"),
    ("nobody.json", '[{"title": "t", "text": "x"}]', "multihop_rag", r"article 0 needs string `title` and `body`"),
    ("odd.json", '[1, 2]', "auto", r"odd\.json: cannot tell the corpus format"),
    ("notext.json", '[{"title": "t", "body2": "x"}]', "json", r"item 0 needs a string `text`.*its keys: title, body2"),
    ("dup.jsonl", '{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', "auto", r"documents 0 and 1 share the id '1'"),
    ("shape.json", '{"T": 3}', "hotpotqa", r"'T' must map to a list of sentences, a text or an object"),
    ("broken.json", "{", "auto", r"broken\.json: not valid JSON \(line 1"),
])
def test_loader_errors_are_one_line_user_errors(tmp_path, name, content, fmt, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(UserError, match=message) as e:
        load_documents(RetrievalSpec(corpus=str(tmp_path / name), format=fmt))
    assert "\n" not in str(e.value)


def test_missing_file_and_unreachable_hub_are_user_errors(tmp_path):
    with pytest.raises(UserError, match=r"file not found: .*nope\.json$"):
        load_documents(RetrievalSpec(corpus=str(tmp_path / "nope.json")))
    with pytest.raises(UserError, match=r"is not a file; give the corpus file itself"):
        load_documents(RetrievalSpec(corpus=str(tmp_path)))
    with pytest.raises(UserError, match=r"retrieval.tokenizer: give a tokenizer"):
        build_retriever(RetrievalSpec(synthetic=4, cache_dir=str(tmp_path)), model_name=None)
    with pytest.raises(UserError, match=r"format 'hotpotqa' reads a local file"):
        load_documents(RetrievalSpec(corpus="someone/corpus", format="hotpotqa"))
    with pytest.raises(UserError, match=r"cannot load 'yixuantt/MultiHopRAG' \(config `corpus`\) from the Hub"):
        load_documents(RetrievalSpec(corpus="yixuantt/MultiHopRAG"))  # tests run with HF_DATASETS_OFFLINE=1


# --- BM25 index, cache -----------------------------------------------------------------------------

def test_bm25_finds_the_evidence_on_synthetic_questions(retriever):
    metrics = evaluate(retriever, fact_queries(60, 200), ks=(4, 10))
    print(f"\nsynthetic BM25: {metrics}")
    assert metrics["n"] == 150  # the 50 null queries have no facts and are not scored, as upstream
    assert metrics["hits@4"] >= 0.9 and metrics["hits@10"] >= 0.95
    assert 0.7 <= metrics["mrr@10"] <= 1 and 0.45 <= metrics["map@10"] <= 1


def test_search_by_words_of_a_fact_returns_its_article(retriever):
    corpus = articles(60)
    for article in corpus[:20]:
        fact = next(s for s in article["body"].split(". ") if any(ch.isdigit() for ch in s))
        top = retriever.search(f"{article['source']} {fact}", k=4)
        assert article["title"] in [p.title for p in top]
    passages = retriever.search(corpus[0]["title"])
    assert len(passages) == 3  # spec.top_k
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)
    assert set(passages[0].to_dict()) == {"id", "title", "text", "source", "published_at", "url", "score", "doc_id",
                                          "metadata"}
    assert retriever.search("   ") == [] and retriever.search("zzyzx qwertyuiop") == []
    assert retriever.search_batch(["", corpus[1]["title"], "the of and"]) == [[], retriever.search(corpus[1]["title"]), []]


def test_second_build_loads_from_the_cache(synthetic_spec, retriever, index_dir):
    assert retriever.built is True and retriever.path == index_dir / retriever.key
    assert sorted(p.name for p in index_dir.iterdir()) == [retriever.key]  # no temporary directories left
    meta = json.loads((retriever.path / "meta.json").read_text())
    assert meta["chunks"] == len(retriever) and meta["documents"] == 60

    started = time.perf_counter()
    again = build_retriever(synthetic_spec, show_progress=False)
    assert again.built is False and time.perf_counter() - started < 3.0  # a load, not a rebuild
    assert (again.key, len(again)) == (retriever.key, len(retriever))
    q = "Which company plans to hire engineers in Lisbon, according to TechCrunch?"
    assert again.search(q, k=5) == retriever.search(q, k=5)

    assert pickle.loads(pickle.dumps(again)).search(q, k=5) == retriever.search(q, k=5)  # TRL may pickle the factory

    rebuilt = build_retriever(synthetic_spec, show_progress=False, rebuild=True)
    assert rebuilt.built is True and rebuilt.key == retriever.key
    assert sorted(p.name for p in index_dir.iterdir()) == [retriever.key]


def test_cache_key_follows_every_index_setting(synthetic_spec, retriever, tmp_path, monkeypatch):
    changed = {
        "chunk_tokens": synthetic_spec.model_copy(update={"chunk_tokens": 120}),
        "seed": synthetic_spec.model_copy(update={"seed": 1}),
    }
    for name, spec in changed.items():
        other = build_retriever(spec, show_progress=False)
        assert other.built is True and other.key != retriever.key, name
    # Search-time settings do not change the index.
    same = synthetic_spec.model_copy(update={"top_k": 5, "rrf_k": 10})
    assert build_retriever(same, show_progress=False).key == retriever.key

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    default_place = build_retriever(synthetic_spec.model_copy(update={"cache_dir": None}), show_progress=False)
    assert default_place.path == tmp_path / "indexes" / retriever.key


def test_local_corpus_key_is_its_content_hash(tmp_path, tiny_model_dir):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(articles(4)))
    spec = RetrievalSpec(corpus=str(path), tokenizer=str(tiny_model_dir), cache_dir=str(tmp_path / "idx"))
    first = build_retriever(spec, show_progress=False)
    path.write_text(json.dumps(articles(4, seed=1)))
    assert build_retriever(spec, show_progress=False).key != first.key


def test_reciprocal_rank_fusion_on_known_rankings():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]], k=60)
    assert [item for item, _ in fused] == ["a", "c", "b", "d"]
    assert dict(fused) == pytest.approx({"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 63})
    assert reciprocal_rank_fusion([[1, 2], [2, 1]], k=1) == [(1, 0.5 + 1 / 3), (2, 1 / 3 + 0.5)]  # tie: first seen
    assert reciprocal_rank_fusion([]) == []


def test_dense_and_hybrid_plumbing(tiny_model_dir, tmp_path):
    """A random tiny encoder: only the plumbing can be checked (shapes, scores, fusion, cache), not quality."""
    from sentence_transformers import SentenceTransformer, models

    encoder = models.Transformer(str(tiny_model_dir), max_seq_length=128)
    pooling = models.Pooling(encoder.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[encoder, pooling], device="cpu").save(str(tmp_path / "encoder"))

    base = RetrievalSpec(synthetic=8, tokenizer=str(tiny_model_dir), cache_dir=str(tmp_path / "idx"),
                         dense_model=str(tmp_path / "encoder"), chunk_tokens=100)
    keys = set()
    for method in ("dense", "hybrid"):
        spec = base.model_copy(update={"method": method})
        built = build_retriever(spec, show_progress=False)
        keys.add(built.key)
        hits = built.search("Which company plans to hire engineers?", k=5)
        assert len(hits) == 5 and len({p.id for p in hits}) == 5
        scores = [p.score for p in hits]
        assert scores == sorted(scores, reverse=True)
        if method == "dense":
            assert all(-1.0001 <= s <= 1.0001 for s in scores)  # cosine of normalized embeddings
        else:
            assert all(0 < s <= 2 / (spec.rrf_k + 1) for s in scores)
        loaded = build_retriever(spec, show_progress=False)
        assert loaded.built is False and len(loaded) == len(built)
        assert [p.id for p in loaded.search("Which company plans to hire engineers?", k=5)] == [p.id for p in hits]
        unpickled = pickle.loads(pickle.dumps(built))  # without its encoder, which reloads on first use
        assert [p.id for p in unpickled.search("Which company plans to hire engineers?", k=5)] == [p.id for p in hits]
    assert len(keys) == 2


def test_evaluate_follows_multihop_rag_definitions():
    class Fixed:
        def __init__(self, results):
            self.results = results

        def search_batch(self, queries, k=None):
            return [[Passage(str(i), "t", text, None, None, None, 1.0) for i, text in enumerate(self.results[q][:k])]
                    for q in queries]

    results = {
        # fact "x y" found at rank 2 (spaces ignored), fact "z" at rank 5
        "q1": ["nothing", "has xy\nhere", "no", "no", "then z"],
        "q2": ["no"] * 10,
        "q3": ["a b c"],  # both facts in one chunk at rank 1
    }
    queries = [{"query": "q1", "facts": ["x y", "z"]}, {"query": "q2", "facts": ["gone"]},
               {"query": "q3", "facts": ["a", "c"]}, {"query": "null", "facts": []}]
    m = evaluate(Fixed(results), queries, ks=(4, 10))
    assert m["n"] == 3
    assert m["hits@4"] == pytest.approx(2 / 3) and m["hits@10"] == pytest.approx(2 / 3)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 0 + 1) / 3)
    # upstream AP: Σ (facts first found at rank r) / r, over min(#facts, 10)
    assert m["map@10"] == pytest.approx(((1 / 2 + 1 / 5) / 2 + 0 + (2 / 1) / 2) / 3)
    assert m["queries_per_second"] > 0

    titles = {"h": ["A", "B", "A", "C"]}

    class Titled(Fixed):
        def search_batch(self, queries, k=None):
            return [[Passage(str(i), t, "", None, None, None, 1.0) for i, t in enumerate(titles[q][:k])]
                    for q in queries]

    m = evaluate(Titled(titles), [{"query": "h", "titles": ["A", "C", "D"]}], ks=(1, 2, 4))
    assert (m["recall@1"], m["recall@2"], m["recall@4"]) == pytest.approx((1 / 3, 1 / 3, 2 / 3))
    with pytest.raises(ValueError, match="no query has gold"):
        evaluate(Titled(titles), [{"query": "h", "titles": []}])


# --- the environment -------------------------------------------------------------------------------

def test_env_search_formats_passages_and_counts(retriever):
    env = RetrievalEnv(retriever)
    corpus = articles(60)
    out = env.search(corpus[0]["title"])
    blocks = out.split("\n\n")
    assert len(blocks) == 3 and [b[:4] for b in blocks] == ["[1] ", "[2] ", "[3] "]
    first = retriever.search(corpus[0]["title"])[0]
    date = datetime.fromisoformat(first.published_at)
    assert blocks[0].splitlines()[0] == f"[1] {first.title} ({first.source}, {date:%B} {date.day}, {date.year})"
    assert first.text.strip() in blocks[0]

    assert env.search("zzyzx qwertyuiop") == "No results."
    env.search("  " + corpus[0]["title"].upper() + " ")  # same query, other case and spacing
    with pytest.raises(ValueError, match="empty query"):
        env.search("   ")
    assert env.metrics == {"searches": 3.0, "empty_results": 1.0, "repeated_queries": 1.0}
    assert len(env.queries) == 3 and [len(ids) for ids in env.retrieved] == [3, 0, 3]
    assert env.retrieved[0] == [p.id for p in retriever.search(corpus[0]["title"])]

    assert env.reset(question="q", answer="a") is None
    assert (env.queries, env.retrieved) == ([], [])
    assert env.metrics == {"searches": 0.0, "empty_results": 0.0, "repeated_queries": 0.0}
    assert len(RetrievalEnv(retriever, top_k=1).search(corpus[0]["title"]).split("\n\n")) == 1


def test_env_exposes_one_tool_with_a_schema(retriever):
    from transformers.utils import get_json_schema

    env = RetrievalEnv(retriever)
    # TRL's rule: every public method except reset/get_reward is a tool.
    tools = [name for name, _ in inspect.getmembers(env, inspect.ismethod)
             if not name.startswith("_") and name not in ("reset", "get_reward")]
    assert tools == ["search"]
    schema = get_json_schema(env.search)["function"]
    assert schema["name"] == "search"
    assert schema["parameters"]["required"] == ["query"]
    assert schema["parameters"]["properties"]["query"]["type"] == "string"
    assert schema["parameters"]["properties"]["query"]["description"]


def test_factory_kwargs(synthetic_spec, retriever, tiny_model_dir):
    recipe = SimpleNamespace(retrieval=synthetic_spec.model_copy(update={"tokenizer": None}),
                             model=SimpleNamespace(name_or_path=str(tiny_model_dir)))
    kwargs = factory_kwargs(recipe)
    assert list(kwargs) == ["retriever"] and kwargs["retriever"].key == retriever.key  # the same cached index
    with pytest.raises(UserError, match=r"env retrieval needs a `retrieval:` section"):
        factory_kwargs(SimpleNamespace(retrieval=None, model=recipe.model))


# --- real data: HotpotQA's closed corpus -------------------------------------------------------------

@pytest.mark.skipif(not HOTPOTQA.is_dir(), reason="shared/data/hotpotqa_closed is absent")
def test_bm25_recall_on_hotpotqa(tiny_model_dir, tmp_path):
    spec = RetrievalSpec(corpus=str(HOTPOTQA / "hotpotqa_train_corpus.json"), tokenizer=str(tiny_model_dir),
                         cache_dir=str(tmp_path))
    built = build_retriever(spec, show_progress=False)
    questions = json.loads((HOTPOTQA / "hotpotqa_train.json").read_text())
    gold = [{"query": q["question"], "titles": sorted({t for t, _ in q["supporting_facts"]})} for q in questions]
    m = evaluate(built, gold, ks=(2, 5, 10))
    print(f"\nHotpotQA BM25 ({len(built)} chunks, built in {built.build_seconds:.2f}s): recall@2 {m['recall@2']:.3f} "
          f"@5 {m['recall@5']:.3f} @10 {m['recall@10']:.3f}, {m['queries_per_second']:.0f} queries/s")
    assert m["n"] == 100
    # measured: 0.550 / 0.750 / 0.865
    assert m["recall@2"] >= 0.5 and m["recall@5"] >= 0.7 and m["recall@10"] >= 0.82


@pytest.mark.parametrize("chosen", [None, "cuda"])
def test_bm25s_import_keeps_jax_off_the_gpu_unless_the_user_chose(tmp_path, chosen):
    """bm25s calls JAX when imported, if JAX is installed; on a CUDA machine JAX then takes 75% of the GPU. A stand-in
    `jax` on the path records the JAX_PLATFORMS it was imported under: the CPU, or what the user set."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text(
        f"import os\nopen({str(tmp_path / 'seen')!r}, 'w').write(os.environ.get('JAX_PLATFORMS', 'unset'))\n")
    (tmp_path / "jax" / "lax.py").write_text("def top_k(x, k):\n    return x[:k], list(range(k))\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | ({"JAX_PLATFORMS": chosen} if chosen else {})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[1])])
    after = subprocess.run([sys.executable, "-c", "import os; from rlkit.retrieval.index import _bm25s; _bm25s(); "
                            "print(os.environ.get('JAX_PLATFORMS'))"], env=env, check=True, capture_output=True, text=True)
    assert (tmp_path / "seen").read_text() == (chosen or "cpu")
    assert after.stdout.strip() == str(chosen)  # set for the import only: not passed on to later processes
