"""The public sets the demos report on (rlkit.data.sources.public_sets): a data folder first, then upstream through
datasets (here: its cache, offline, or a loader standing in for the Hub), else one line per skipped row."""

import hashlib
import json
import logging

import pytest

from rlkit.data.sources import PUBLIC_SETS, PublicSet, data_dir, fetch, public_sets
from rlkit.errors import UserError

from .conftest import SHARED_DATA

GSM8K_ROWS = [{"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
              for i in range(5)]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Offline, no data folder, and datasets' caches empty folders of this test's own."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.setattr(datasets.config, "DOWNLOADED_DATASETS_PATH", tmp_path / "datasets-cache" / "downloads")
    monkeypatch.delenv("RLKIT_DATA_DIR", raising=False)
    return tmp_path / "datasets-cache"


def _cache_gsm8k(cache, rows):
    """What `datasets.load_dataset("openai/gsm8k", "main", split="test", revision=...)` leaves in datasets' cache."""
    import datasets
    from datasets.arrow_writer import ArrowWriter

    where = cache / "openai___gsm8k" / "main" / "0.0.0" / PUBLIC_SETS["gsm8k"].revision
    where.mkdir(parents=True)
    table = datasets.Dataset.from_list(rows)
    with ArrowWriter(path=str(where / "gsm8k-test.arrow")) as writer:
        writer.write_table(table.data.table)
        writer.finalize()
    datasets.DatasetInfo(features=table.features, config_name="main", dataset_name="gsm8k",
                         splits=[{"name": "test", "num_examples": len(rows), "dataset_name": "gsm8k"}],
                         ).write_to_directory(str(where))


def _folder(root, name, files):
    (root / name).mkdir(parents=True, exist_ok=True)
    for file, text in files.items():
        (root / name / file).write_text(text)
    return root


def test_a_data_folder_comes_first_and_upstream_is_never_asked(tmp_path, offline, monkeypatch, caplog):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("asked the Hub"))
    folder = _folder(tmp_path / "data", "gsm8k", {"test.jsonl": "".join(json.dumps(r) + "\n" for r in GSM8K_ROWS)})
    caplog.set_level(logging.INFO, "rlkit")
    assert public_sets({"gsm8k": "the GSM8K row"}, folder, tmp_path / "copies", ) == {
        "gsm8k": folder / "gsm8k"}
    assert caplog.messages == [f"GSM8K test (1319 problems): {folder / 'gsm8k'}"]
    monkeypatch.setenv("RLKIT_DATA_DIR", str(folder))  # the same folder from the environment
    assert public_sets({"gsm8k": "the GSM8K row"}, None, tmp_path / "copies", )["gsm8k"] == folder / "gsm8k"
    assert not (tmp_path / "copies").exists()


def test_gsm8k_from_datasets_cache_offline_when_the_folder_lacks_it(tmp_path, offline, caplog):
    """A user who fetched GSM8K once (`rlkit demo --fetch-data`) and runs offline: datasets reads its cache, the
    demo gets the rows in GSM8K's own JSONL, and the easiest-items row reads them."""
    from rlkit.data import gsm8k
    from rlkit.recipe import DataSource

    _cache_gsm8k(offline, GSM8K_ROWS)
    folder = _folder(tmp_path / "data", "ifeval", {"input_data.jsonl": "{}\n"})  # a folder without GSM8K
    caplog.set_level(logging.INFO, "rlkit")
    found = public_sets({"gsm8k": "the GSM8K row"}, folder, tmp_path / "copies", )
    assert found == {"gsm8k": tmp_path / "copies" / "gsm8k"}
    assert caplog.messages == [f"GSM8K test (1319 problems): openai/gsm8k@cc7b047 -> {tmp_path / 'copies' / 'gsm8k'}"]
    written = [json.loads(line) for line in (found["gsm8k"] / "test.jsonl").read_text().splitlines()]
    assert written == GSM8K_ROWS
    assert gsm8k.easiest(gsm8k.load(DataSource(path=str(found["gsm8k"] / "test.jsonl"))), 2)["question"] == [
        r["question"] for r in GSM8K_ROWS[:2]]


def test_ifeval_from_the_hub_loads_the_pinned_revision_and_drops_the_hub_s_null_arguments(tmp_path, offline,
                                                                                         monkeypatch):
    """The Hub's IFEval stores every instruction's argument names on every row (parquet's one schema), null where
    unused; the file written is upstream's input_data.jsonl shape, which the checkers read."""
    import datasets

    hub_rows = [{"key": 1000, "prompt": "Write a haiku without commas.", "instruction_id_list": [
        "punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [{"num_words": None, "relation": None}, {"num_words": 12, "relation": "less than"}]},
        {"key": 1001, "prompt": "Answer in lowercase.", "instruction_id_list": ["change_case:english_lowercase"],
         "kwargs": [{"num_words": None, "relation": None}]}]
    calls = []

    def hub(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_list(hub_rows)  # nulls in its struct column, as the Hub's parquet has

    monkeypatch.setattr(datasets, "load_dataset", hub)
    found = public_sets({"ifeval": "the IFEval check"}, None, tmp_path / "copies", )
    assert calls == [(("google/IFEval", None), {"split": "train", "revision": PUBLIC_SETS["ifeval"].revision})]
    rows = [json.loads(line) for line in (found["ifeval"] / "input_data.jsonl").read_text().splitlines()]
    assert [r["kwargs"] for r in rows] == [[{}, {"num_words": 12, "relation": "less than"}], [{}]]
    assert [r["key"] for r in rows] == [1000, 1001] and rows[0]["instruction_id_list"][0] == "punctuation:no_comma"


def test_files_from_a_pinned_url_are_checked_against_their_sha256(tmp_path, offline):
    """HotpotQA's closed set is on no Hub dataset: its two files come from a pinned commit through datasets'
    download manager (a file:// URL stands in for GitHub here), each checked against its sha256."""
    upstream = _folder(tmp_path / "upstream", "x", {"a.json": '["a"]', "b.json": '{"b": 1}'}) / "x"
    digest = {name: hashlib.sha256((upstream / name).read_bytes()).hexdigest() for name in ("a.json", "b.json")}
    spec = PublicSet("two files", "pair", ("a.json", "b.json"),
                     urls=tuple((f"file://{upstream / name}", digest[name]) for name in ("a.json", "b.json")))
    out = fetch(spec, tmp_path / "copies" / "pair")
    assert (out / "a.json").read_text() == '["a"]' and (out / "b.json").read_text() == '{"b": 1}'
    changed = PublicSet("two files", "pair", ("a.json",), urls=((f"file://{upstream / 'a.json'}", "0" * 64),))
    with pytest.raises(UserError, match=r"a\.json: its sha256 is not the pinned 000000000000…; upstream changed it"):
        fetch(changed, tmp_path / "again")


@pytest.mark.skipif(not (SHARED_DATA / "hotpotqa_closed").is_dir(), reason="shared/data/hotpotqa_closed is absent")
def test_the_pinned_hotpotqa_sums_are_those_of_the_files_upstream_has():
    spec = PUBLIC_SETS["hotpotqa"]
    for name, (url, sha) in zip(spec.files, spec.urls, strict=True):
        assert url.endswith(f"/{name}") and "/b144c46df14cabe5f5822d8caded4bec5f709461/" in url
        assert hashlib.sha256((SHARED_DATA / "hotpotqa_closed" / name).read_bytes()).hexdigest() == sha


def test_offline_without_a_folder_or_cache_each_row_is_skipped_in_one_line(tmp_path, offline, caplog):
    caplog.set_level(logging.INFO, "rlkit")
    found = public_sets({"gsm8k": "the gsm8k-easiest100 row", "ifeval": "the IFEval check",
                         "hotpotqa": "the HotpotQA row"}, None, tmp_path / "copies", )
    assert found == {"gsm8k": None, "ifeval": None, "hotpotqa": None}
    reason = "no data folder (--data-dir or RLKIT_DATA_DIR), and offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE) " \
             "and not in datasets' cache"
    assert caplog.messages == [
        f"GSM8K test (1319 problems): {reason}: the gsm8k-easiest100 row is skipped; get it with "
        "`rlkit demo --fetch-data` where the Hub can be reached",
        f"IFEval prompts (541): {reason}: the IFEval check is skipped; get it with `rlkit demo --fetch-data` where "
        "the Hub can be reached",
        f"HotpotQA's closed set (100 questions, 994 titles): {reason}: the HotpotQA row is skipped; get it with "
        "`rlkit demo --fetch-data` where github.com can be reached"]
    folder = _folder(tmp_path / "data", "gsm8k", {})  # a folder that lacks the file: the line names it
    caplog.clear()
    assert public_sets({"gsm8k": "the GSM8K row"}, folder, tmp_path / "copies", ) == {"gsm8k": None}
    assert caplog.messages[0].startswith(f"GSM8K test (1319 problems): {folder} has no gsm8k/test.jsonl, and offline ")


def test_a_data_folder_that_is_not_there_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RLKIT_DATA_DIR", raising=False)
    assert data_dir(None) is None and data_dir(tmp_path) == tmp_path
    with pytest.raises(UserError, match=rf"^--data-dir {tmp_path / 'nope'}: no such folder; give a folder holding "
                                        r"gsm8k/test\.jsonl"):
        data_dir(tmp_path / "nope")
    monkeypatch.setenv("RLKIT_DATA_DIR", str(tmp_path / "gone"))
    with pytest.raises(UserError, match=rf"^RLKIT_DATA_DIR {tmp_path / 'gone'}: no such folder"):
        data_dir(None)
