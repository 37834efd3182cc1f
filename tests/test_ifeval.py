"""IFEval (`rlkit eval --ifeval`): lm-eval's checkers offline on real prompts with replies whose verdicts are known,
NLTK's Punkt model from the package index (never downloaded), the four numbers with their intervals, the base ->
trained comparison and its tolerance flag (CLI, report.md), and one-line errors for bad input."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.errors import UserError
from rlkit.evaluate.ifeval import compare, metrics
from rlkit.evaluate.ifeval_checks import checkers, load_prompts, score
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.stats import wilson
from tests.test_bad_input import run_main

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT.parent / "shared" / "data" / "ifeval" / "input_data.jsonl"
needs_prompts = pytest.mark.skipif(not PROMPTS.is_file(), reason=f"{PROMPTS} is not on this machine")

# (IFEval key, reply, strict verdict per instruction, loose verdict per instruction)
CASES = [
    (1001, "Good morning. We sail to Kyoto at dawn.", [True], [True]),  # no commas
    (1001, "Good morning, friends.", [False], [False]),
    (1128, "The sentiment is negative.\nIs there anything else I can help with?", [True], [True]),  # end phrase
    # ends on another line: only loose (which also tries the reply without its last line) forgives it
    (1128, "The sentiment is negative. Is there anything else I can help with?\nGoodbye.", [False], [True]),
    (1051, "dear friend, please go and vote on tuesday. your voice matters to all of us.", [True], [True]),
    (1051, "Dear friend, please go and vote on Tuesday.", [False], [False]),  # not all lowercase
    # a <<title>> and fewer than 5 sentences: Punkt's English model knows Dr., Mr. and p.m. are no sentence ends
    (1262, "<<Axles and roads>>\nDr. Smith met Mr. Jones at 3 p.m. to talk. Heavier axles press harder on the road. "
           "The surface cracks sooner. Repairs then cost more.", [True, True], [True, True]),
    (1262, "<<Axles and roads>>\nSmith met Jones at three. They talked. Heavier axles press harder on the road. "
           "The surface cracks sooner. Repairs then cost more.", [True, False], [True, True]),
    # fewer than 10 all-capital words, at least 1, wrapped in double quotes (word_tokenize: Punkt again)
    (1040, '"Matthias Algiers: SKILLED in LEADERSHIP and planning."', [True, True, True], [True, True, True]),
    (1040, '**"Matthias Algiers: SKILLED in LEADERSHIP and planning."**', [True, True, False], [True, True, True]),
    (1040, 'Here is the resume:\n"Matthias Algiers: SKILLED in LEADERSHIP and planning."', [True, True, False],
     [True, True, True]),
    (1000, "", [False, False, False], [False, False, False]),  # an empty reply follows nothing
]


def row(key=1, prompt="Answer without commas.", ids=("punctuation:no_comma",), kwargs=({},)):
    return {"key": key, "prompt": prompt, "instruction_id_list": list(ids), "kwargs": list(kwargs)}


@needs_prompts
def test_checkers_give_the_known_verdicts_on_real_prompts():
    rows = {r["key"]: r for r in load_prompts(PROMPTS)}
    assert len(rows) == 541 and sum(len(r["instruction_id_list"]) for r in rows.values()) == 834
    examples = []
    for key, reply, strict, loose in CASES:
        verdict = score(rows[key], reply)
        assert (verdict["strict"], verdict["loose"]) == (strict, loose), (key, reply)
        assert verdict["prompt_strict"] == all(strict) and verdict["prompt_loose"] == all(loose)
        examples.append({"key": key, **verdict})
    m = metrics(examples)
    assert (m["prompt_strict"]["followed"], m["prompt_strict"]["n"]) == (5, 12)
    assert (m["prompt_loose"]["followed"], m["prompt_loose"]["n"]) == (9, 12)
    assert (m["inst_strict"]["followed"], m["inst_strict"]["n"]) == (13, 22)
    assert (m["inst_loose"]["followed"], m["inst_loose"]["n"]) == (17, 22)
    assert m["prompt_strict"]["accuracy"] == pytest.approx(5 / 12)
    assert m["prompt_strict"]["interval"] == pytest.approx(list(wilson(5, 12)))
    assert m["prompt_strict"]["interval"] == pytest.approx([0.193, 0.680], abs=1e-3)
    low, high = m["inst_strict"]["interval"]  # a bootstrap over the 12 prompts, not 22 independent instructions
    assert low < 13 / 22 < high and high - low > wilson(13, 22)[1] - wilson(13, 22)[0]


def test_verdicts_do_not_depend_on_chance():
    """IFEval asks two prompts for a count of `#` and `!`, which lm-eval's letter checker replaces with a random
    letter from Python's global RNG: rlkit seeds it per reply (and gives the caller its RNG back untouched)."""
    import random

    from langdetect import DetectorFactory

    bang = row(1129, "p", ["keywords:letter_frequency"], [{"let_relation": "at least", "letter": "!", "let_frequency": 6}])
    reply = " ".join(["abcdefghijklm"] * 6)  # half the letters 6 times, the other half never: a coin per draw
    checkers()  # importing lm-eval's modules (and what they import) draws from the RNG itself
    verdicts = []
    for seed in range(20):
        random.seed(seed)
        before = random.getstate()
        verdicts.append(score(bang, reply)["strict"])
        assert random.getstate() == before and DetectorFactory.seed is None
    assert len({tuple(v) for v in verdicts}) == 1


def test_punkt_comes_from_the_wheel_into_rlkits_cache():
    from rlkit.cache import cache_dir

    checkers()
    import nltk
    from lm_eval.tasks.ifeval import instructions_util

    found = Path(nltk.data.find("tokenizers/punkt_tab/english/"))
    assert found.parents[2] == cache_dir() / "nltk_data" / "punkt-2.2.1"
    assert sorted(p.name for p in found.iterdir()) == ["abbrev_types.txt", "collocations.tab", "ortho_context.tab",
                                                       "sent_starters.txt"]
    assert "dr" in (found / "abbrev_types.txt").read_text().split()
    text = "Dr. Smith met Mr. Jones at 3 p.m. to talk. Axles press. Roads crack. Repairs cost."
    assert instructions_util.count_sentences(text) == 4


_BLOCK = """
import socket, sys
def refuse(*a, **k):
    raise OSError("network blocked by the test")
socket.socket.connect = refuse
socket.create_connection = refuse
"""

_OFFLINE = _BLOCK + """
from rlkit.evaluate.ifeval_checks import score
print(score({"key": 1, "prompt": "p", "instruction_id_list": ["length_constraints:number_sentences"],
             "kwargs": [{"relation": "less than", "num_sentences": 2}]}, "Dr. Smith left at 3 p.m. on Friday.")["strict"])
"""

_NO_DATA = _BLOCK + """
import nltk
from rlkit.evaluate import ifeval_checks
nltk.data.path[:] = []
ifeval_checks.punkt_data = lambda: __import__("pathlib").Path(sys.argv[1])
try:
    ifeval_checks.checkers()
except ifeval_checks.DownloadRefused as e:
    print("refused:", e)
"""


def test_nothing_is_downloaded(tmp_path):
    """A fresh cache and no network: the model is written from the wheel and the checkers score. With the data
    withheld, lm-eval's import asks NLTK to download it, and that raises instead of reaching the network."""
    env = {**os.environ, "RLKIT_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path), "NLTK_DATA": ""}
    done = subprocess.run([sys.executable, "-c", _OFFLINE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True]"  # one sentence: Punkt knows Dr. and p.m.
    assert (tmp_path / "cache" / "nltk_data" / "punkt-2.2.1" / "tokenizers" / "punkt_tab" / "english").is_dir()
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-c", _NO_DATA, str(tmp_path / "empty")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: NLTK was asked to download 'punkt_tab'"), done.stdout + done.stderr


def _results(path, strict):
    examples = [{"key": i, "prompt_strict": s, "prompt_loose": s, "strict": [s], "loose": [s]}
                for i, s in enumerate(strict)]
    return {"path": str(path), "examples": examples, "metrics": metrics(examples)}


@pytest.mark.parametrize(("base", "trained", "tolerance", "flagged"), [
    (3, 2, 0.2, True),  # 0.75 -> 0.50 out of 4: a drop of 0.25
    (3, 2, 0.25, False),  # exactly the tolerance is not more than it
    (3, 2, 0.3, False),
    (8, 7, 0.1, False),  # 0.8 - 0.7 is 0.10000000000000009 in floating point: still not more than 0.1
    (2, 3, 0.0, False),  # a gain is never flagged
])
def test_tolerance_flags_a_drop_larger_than_it(tmp_path, base, trained, tolerance, flagged):
    n = 4 if base < 4 and trained < 4 else 10
    before = _results(tmp_path / "b", [True] * base + [False] * (n - base))
    after = _results(tmp_path / "t", [True] * trained + [False] * (n - trained))
    c = compare(before, after, tolerance)
    assert c["drop"] == pytest.approx((base - trained) / n) and c["flagged"] is flagged
    assert c["prompt_strict"]["diff"] == pytest.approx((trained - base) / n)
    assert c["prompt_strict"]["p"] == 1.0 and c["prompt_strict"]["test"] == "mcnemar"  # one prompt changed
    with pytest.raises(UserError, match="not the same IFEval prompts"):
        compare(before, _results(tmp_path / "x", [True] * (n + 1)), tolerance)


def test_report_flags_the_regression(tmp_path, sft_run):
    from rlkit.report import write_report

    run = shutil.copytree(sft_run, tmp_path / "run")
    (run / "eval" / "ifeval").mkdir(parents=True)
    base, trained = _results(tmp_path / "b", [True] * 6 + [False] * 4), _results(tmp_path / "t", [True] * 5 + [False] * 5)
    rows = [{"role": role, "model": role, "n": 10, "metrics": r["metrics"]} for role, r in (("base", base),
                                                                                            ("trained", trained))]
    for tolerance, line in ((0.05, "**⚠ IFEval regression: trained's prompt-strict accuracy is 0.100 below base's, "
                                   "more than the tolerance 0.050.**"),
                            (0.1, "IFEval: trained is within tolerance (prompt strict -0.100 against base, tolerance "
                                  "0.100).")):
        summary = {"benchmark": "ifeval", "prompts": "p.jsonl", "max_new_tokens": 256, "tolerance": tolerance,
                   "rows": rows, "comparisons": [{"role": "trained", "against": "base",
                                                  **compare(base, trained, tolerance)}]}
        (run / "eval" / "ifeval" / "ifeval.json").write_text(json.dumps(summary))
        write_report(run)
        report = (run / "report.md").read_text()
        assert "## General ability: IFEval" in report and line in report
        assert "| base: `base` | 0.600 [0.313, 0.832] |" in report  # Wilson(6, 10)


def _prompts_file(tmp_path):
    path = tmp_path / "input_data.jsonl"
    rows = [row(1, "Say hello without commas."), row(2, "Write one sentence.", ["length_constraints:number_sentences"],
                                                    [{"relation": "less than", "num_sentences": 2}]),
            row(3, "Answer in lowercase.", ["change_case:english_lowercase"], [{}])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_evaluates_base_and_trained_run(tmp_path, capsys, sft_run):
    """`rlkit eval RUN --ifeval FILE` on the tiny model: base and adapter on the same prompts, each reply scored by
    the checkers, the four numbers from those verdicts, the comparison against the run's tolerance."""
    prompts, out = _prompts_file(tmp_path), tmp_path / "out"
    code, captured = run_main(capsys, "eval", sft_run, "--ifeval", prompts, "--limit", "2", "--out", out,
                             "--set", "eval.ifeval.max_new_tokens=8", "--set", "eval.ifeval.tolerance=0.25")
    assert code == 0, captured.err
    summary = json.loads((out / "ifeval.json").read_text())
    assert [r["role"] for r in summary["rows"]] == ["base", "trained"]
    assert summary["rows"][0]["model"] == "rlkit/tiny-qwen3" and summary["rows"][1]["model"].endswith("adapter")
    assert summary["tolerance"] == 0.25 and summary["max_new_tokens"] == 8
    for role in ("base", "trained"):
        res = json.loads((out / f"{role}.json").read_text())
        assert [e["key"] for e in res["examples"]] == [1, 2] and res["instructions"] == 2
        for e, source in zip(res["examples"], load_prompts(prompts, 2), strict=True):
            assert {k: e[k] for k in ("prompt_strict", "prompt_loose", "strict", "loose")} == score(source, e["response"])
        assert res["metrics"] == metrics(res["examples"])
    c = summary["comparisons"][0]
    base_ps, trained_ps = (r["metrics"]["prompt_strict"]["accuracy"] for r in summary["rows"])
    assert c["drop"] == pytest.approx(base_ps - trained_ps) and c["flagged"] == (base_ps - trained_ps > 0.25)
    assert "trained - base" in captured.out and "IFEval (2 prompts, up to 8 new tokens" in captured.out


def test_cli_smoke_recipe_alone(tmp_path, capsys):
    prompts, out = _prompts_file(tmp_path), tmp_path / "out"
    code, captured = run_main(capsys, "eval", recipes_dir() / "gsm8k_sft.yaml", "--ifeval", prompts, "--smoke",
                             "--out", out)
    assert code == 0, captured.err
    summary = json.loads((out / "ifeval.json").read_text())
    assert [r["role"] for r in summary["rows"]] == ["base"] and summary["comparisons"] == []
    assert summary["rows"][0]["n"] == 3 and summary["max_new_tokens"] == 24  # --smoke: up to 8 prompts, 24 tokens


def test_cli_model_alone_and_beside_a_base(tmp_path, capsys, tiny_model_dir):
    """A model as TARGET (a Hub id, a merged directory, a pseudo id) is evaluated with default settings; --base puts
    another beside it."""
    prompts = _prompts_file(tmp_path)
    code, captured = run_main(capsys, "eval", "rlkit/tiny-qwen3", "--ifeval", prompts, "--limit", "2", "--out",
                             tmp_path / "alone", "--set", "eval.ifeval.max_new_tokens=4")
    assert code == 0, captured.err
    alone = json.loads((tmp_path / "alone" / "ifeval.json").read_text())
    assert [(r["role"], r["model"], r["n"]) for r in alone["rows"]] == [("model", "rlkit/tiny-qwen3", 2)]
    code, captured = run_main(capsys, "eval", tiny_model_dir, "--ifeval", prompts, "--base", "rlkit/tiny-qwen3",
                             "--limit", "2", "--out", tmp_path / "pair", "--set", "eval.ifeval.max_new_tokens=4")
    assert code == 0, captured.err
    pair = json.loads((tmp_path / "pair" / "ifeval.json").read_text())
    assert [r["role"] for r in pair["rows"]] == ["base", "model"]
    # the same weights under two names: the same replies, so no difference and no flag
    assert pair["comparisons"][0]["drop"] == 0 and pair["comparisons"][0]["flagged"] is False


@pytest.mark.parametrize(("lines", "args", "message"), [
    (None, [], "no IFEval prompts file"),
    (['{"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"]}'], [], "line 1 has no kwargs"),
    (['{"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_commas"], "kwargs": [{}]}'], [],
     "line 1: unknown instruction 'punctuation:no_commas'"),
    (['{"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": []}'], [],
     "line 1: `prompt` must be text and `kwargs` a list of one mapping per entry"),
    ([json.dumps(row())], ["--suite", "arith"], "--ifeval is an eval of its own"),
    ([json.dumps(row())], ["--set", "eval.ifeval.limt=3"], "eval.ifeval.limt"),
    ([json.dumps(row())], ["--set", "eval.ifeval.tolerance=2"], "eval.ifeval.tolerance"),
])
def test_bad_input_is_one_line(tmp_path, capsys, lines, args, message):
    path = tmp_path / "input_data.jsonl"
    if lines is not None:
        path.write_text("\n".join(lines) + "\n")
    code, captured = run_main(capsys, "eval", recipes_dir() / "gsm8k_sft.yaml", "--ifeval", path, "--smoke", *args)
    assert code == 2 and message in captured.err, captured.err
    assert captured.err.count("\n") == 1 and captured.err.startswith("rlkit: error: ")


def test_recipe_section_is_strict():
    recipe = load_recipe(recipes_dir() / "gsm8k_sft.yaml", ["eval.ifeval={limit: 50, tolerance: 0.1}"])
    assert (recipe.eval.ifeval.limit, recipe.eval.ifeval.tolerance, recipe.eval.ifeval.max_new_tokens) == (50, 0.1, 1280)
    assert load_recipe(recipes_dir() / "gsm8k_sft.yaml", smoke=True).eval.ifeval.limit == 8


def test_punkt_race_removes_only_its_own_staging_folder(tmp_path, monkeypatch):
    """Another process renames its copy into place first: rlkit deletes the staging folder it made itself and
    nothing else beside it; with no copy there after all, the error is raised, not swallowed."""
    import nltk

    from rlkit.evaluate import ifeval_checks

    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))  # the fake copy must not stay on NLTK's path
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    parent = tmp_path / "cache" / "nltk_data" / "punkt-2.2.1" / "tokenizers" / "punkt_tab"
    parent.mkdir(parents=True)
    (parent / "users-notes.txt").write_text("keep")
    seen = []

    def other_process_first(src, dst):
        seen.append(Path(src).name)
        Path(dst).mkdir()
        (Path(dst) / "theirs.txt").write_text("theirs")
        raise OSError("Directory not empty")

    monkeypatch.setattr(ifeval_checks.os, "rename", other_process_first)
    assert ifeval_checks.punkt_data() == tmp_path / "cache" / "nltk_data" / "punkt-2.2.1"
    assert seen[0].startswith(".english-")
    assert sorted(p.name for p in parent.iterdir()) == ["english", "users-notes.txt"]
    assert (parent / "english" / "theirs.txt").read_text() == "theirs"

    shutil.rmtree(parent / "english")
    monkeypatch.setattr(ifeval_checks.os, "rename", lambda src, dst: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        ifeval_checks.punkt_data()
    assert sorted(p.name for p in parent.iterdir()) == ["users-notes.txt"]
