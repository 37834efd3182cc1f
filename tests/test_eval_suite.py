"""`rlkit eval --suite`: the arithmetic generator's knobs and prompt forms, suite files, and the table (tiny model
for the plumbing, the real SmolLM2 once to check the table against a plain `rlkit eval`)."""

import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlkit.cli import app
from rlkit.data import calc, gsm8k, load_rows, task_rows
from rlkit.errors import UserError
from rlkit.evaluate.suite import load_suite, run_suite
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.rewards.math import gsm8k_correct

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"


def _operands(row):
    a, op, b, _, total = row["answer"].splitlines()[0].split()
    return int(a), op, int(b), int(total)


def test_demo_held_out_problems_did_not_move():
    """The defaults draw the rows earlier rlkit drew, seed for seed (the demo's numbers stay comparable)."""
    questions = gsm8k.generate(100, seed=12345, max_value=20, max_steps=1)["question"]
    assert questions[0] == "Ken has 10 apples. Then Ken is given 9 more. How many apples does Ken have now?"
    assert hashlib.sha256("\n".join(questions).encode()).hexdigest()[:12] == "735171b808d4"


def test_generator_knobs_move_one_axis_each():
    two = gsm8k.generate(200, seed=1, min_value=10, max_value=99, max_steps=1)
    for row in two:
        a, op, b, total = _operands(row)
        assert op in "+-" and 10 <= a <= 99 and total == (a + b if op == "+" else a - b)
        assert 10 <= b <= 99 if op == "+" else 1 <= b < a
    prods = gsm8k.generate(200, seed=2, ops="*", max_factor=12, max_steps=1)
    for row in prods:
        a, op, b, total = _operands(row)
        assert op == "*" and 2 <= a <= 12 and 2 <= b <= 12 and total == a * b
        assert re.findall(r"\d+", row["question"]) == [str(a), str(b)]
    for wording in ("classic", "other"):
        mixed = gsm8k.generate(300, seed=3, ops="+-*", max_value=50, max_steps=1, wording=wording)
        ops = [_operands(r)[1] for r in mixed]
        assert all(70 < ops.count(op) < 130 for op in "+-*")
        assert gsm8k_correct(list(mixed["answer"]), answer=list(mixed["answer"])) == [1.0] * 300
    for bad in ({"ops": "/"}, {"min_value": 30, "max_value": 20}, {"max_factor": 1}):
        with pytest.raises(ValueError):
            gsm8k.generate(2, **bad)


def test_prompt_forms():
    roles = {v: [m["role"] for m in gsm8k.chat_prompt("Q?", v)] for v in ("short", "short-zero", "bare", "alt")}
    assert roles["short"] == roles["alt"] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert roles["short-zero"] == ["system", "user"] and roles["bare"] == ["user"]
    assert gsm8k.chat_prompt("Q?", "alt")[1] != gsm8k.chat_prompt("Q?", "short")[1]  # other worked turns
    questions = gsm8k.generate(300, seed=5)["question"]
    forms = [len(gsm8k.chat_prompt(q, "mix")) for q in questions]
    assert {forms.count(n) for n in (6, 2, 1)} <= set(range(70, 131))  # each form about a third of the rows
    assert forms == [len(gsm8k.chat_prompt(q, "mix")) for q in questions]  # the same row, the same form


def test_instruction_variants_place_the_instruction_and_never_join_a_training_mix():
    q = "Ken has 10 apples. How many apples does Ken have?"
    for name, (where, text) in gsm8k.ASK.items():
        messages = gsm8k.chat_prompt(q, f"ask-{name}")
        user = messages[-1]["content"]
        assert not any(m["role"] == "assistant" for m in messages)  # no worked turns
        if where == "system":
            assert messages[0] == {"role": "system", "content": text} and user == q
        else:
            assert len(messages) == 1 and user == (f"{text}\n\n{q}" if where == "before" else f"{q}\n{text}")
    assert len(gsm8k.ASK) >= 8 and {w for w, _ in gsm8k.ASK.values()} == {"system", "before", "after"}
    questions = gsm8k.generate(2000, seed=21, ops="+-*", max_value=50, max_steps=1)["question"]
    seen = {m["content"] for q in questions for v in ("mix", "mix-ask") for m in gsm8k.chat_prompt(q, v)}
    assert not {text for _, text in gsm8k.ASK.values()} & {t for s in seen for t in [s, s.rpartition("\n")[2]]}
    assert {text for _, text in gsm8k.TRAIN_ASK.values()} <= {t for s in seen for t in [s, s.rpartition("\n")[2]]}
    picked = [gsm8k.chat_prompt(q, "ask-mix") for q in questions[:500]]
    counts = [sum(p == gsm8k.chat_prompt(q, f"ask-{name}") for p, q in zip(picked, questions, strict=False))
              for name in gsm8k.ASK]
    assert sum(counts) == 500 and min(counts) >= 25  # every variant, about a tenth each


def test_robust_suite_asks_the_same_problems_every_way_and_pools_them():
    robust = load_suite("robust")
    recipe = recipes_dir() / f"{robust.recipe}.yaml"
    assert robust.pooled and len(robust.sets) == len(gsm8k.ASK)
    problems = gsm8k.generate(50, seed=908, ops="+-*", max_value=50, max_steps=1)
    prompts = {}
    for s in robust.sets:
        r = load_recipe(recipe, s.overrides())
        rows = task_rows(r, "eval", load_rows("gsm8k", r.data.eval))
        assert list(rows["answer"]) == [gsm8k.gold(a) for a in problems["answer"]]  # the same problems ...
        assert all(q in row["prompt"][-1]["content"] for q, row in zip(problems["question"], rows, strict=True))
        prompts[s.name] = json.dumps(list(rows["prompt"]))
    assert len(set(prompts.values())) == len(robust.sets)  # ... asked ten different ways


def test_pooled_row_joins_every_set_and_its_gain_is_paired(tmp_path, monkeypatch):
    """Scripted evals: two sets of 10, base right on 2 and 3, trained on 6 and 3 (4 gained, none lost): pooled
    5/20 -> 9/20, exact McNemar p = 2 * 0.5**4 = 0.125."""
    import rlkit.evaluate

    right = {(False, 1): range(2), (True, 1): range(6), (False, 2): range(3), (True, 2): range(3)}

    def scripted(source, ref, *, limit, out, overrides, show_progress, served):
        data = json.loads(overrides[0].removeprefix("data.eval="))
        examples = [{"prompt": f"q{i}", "correct": i in right[ref == "t", data["seed"]]} for i in range(10)]
        return {"model": ref, "n": 10, "accuracy": sum(e["correct"] for e in examples) / 10, "examples": examples,
                "path": str(out), "degenerate": 0.1}

    monkeypatch.setattr(rlkit.evaluate, "evaluate", scripted)
    suite = load_suite(_tiny_suite(tmp_path, n=10))
    suite.pooled = "both"
    summary = run_suite(str(recipes_dir() / "tiny_arith_grpo.yaml"), suite, model="t", out=tmp_path / "o",
                        show_progress=False)
    base, trained = (r["sets"] for r in summary["rows"])
    assert (base["both"]["correct"], trained["both"]["correct"], base["both"]["n"]) == (5, 9, 20)
    assert summary["gain"]["both"]["diff"] == pytest.approx(0.2) and summary["gain"]["both"]["p"] == pytest.approx(0.125)
    assert summary["sets"][-1]["name"] == "both" and base["small"]["degenerate"] == base["both"]["degenerate"] == 0.1


def test_shipped_suites_load_and_their_sets_are_valid_recipe_overrides():
    arith = load_suite("arith")
    recipe = recipes_dir() / f"{arith.recipe}.yaml"
    assert len(arith.sets) >= 6
    for s in arith.sets:
        r = load_recipe(recipe, s.overrides())
        assert r.data.eval.synthetic >= 100
    seeds = {(s.eval["seed"], json.dumps(s.eval["generator"])) for s in arith.sets}
    assert len(seeds) == len(arith.sets)
    calc_suite = load_suite("calc")
    recipe = recipes_dir() / f"{calc_suite.recipe}.yaml"
    held = {}
    for s in calc_suite.sets:
        r = load_recipe(recipe, s.overrides())
        assert r.env.name == "calculator" and r.data.eval.synthetic == 100
        held[s.name] = task_rows(r, "eval", load_rows("calc", r.data.eval))
    assert len({s.eval["seed"] for s in calc_suite.sets}) == len(calc_suite.sets)  # other problems in every set
    train = load_recipe(recipe)
    trained = set(calc.generate(train.data.train.synthetic, seed=train.data.train.seed)["question"])
    for name, rows in held.items():  # no set repeats a training problem
        assert not trained & {r["prompt"][-1]["content"] for r in rows}, name
    assert len(held["alt-prompt"][0]["prompt"]) == len(held["box"][0]["prompt"]) == 10  # system, 2 x 4 turns, question
    assert len(held["no-shots"][0]["prompt"]) == 2 and held["alt-prompt"][0]["prompt"][0] != held["box"][0]["prompt"][0]
    multihop = load_suite("multihop")
    r = load_recipe(recipes_dir() / f"{multihop.recipe}.yaml", multihop.sets[0].overrides())
    assert r.retrieval.corpus.endswith("hotpotqa_train_corpus.json") and r.data.eval.columns["id"] == "_id"


def test_a_bad_suite_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("name: s\nsets:\n  - {name: a, eval: {synthetic: 4}, promt: short}\n")
    with pytest.raises(UserError, match=r"sets\.0\.promt: Extra inputs"):
        load_suite(bad)
    bad.write_text("name: s\nsets:\n  - {name: a, eval: {synthetic: 4}}\n  - {name: a, eval: {synthetic: 5}}\n")
    with pytest.raises(UserError, match="share a name"):
        load_suite(bad)
    for argv, message in ((["--suite", str(tmp_path / "none.yaml")], "no such file"),
                          (["--suite", "arith", "--smoke"], "drop --smoke"),
                          (["--suite", "arith", "--samples", "4"], "drop --suite, or drop --samples"),
                          (["--no-base"], "add --suite")):
        result = CliRunner().invoke(app, ["eval", "rlkit/tiny-qwen3", *argv])
        assert isinstance(result.exception, UserError) and message in str(result.exception)


def _tiny_suite(tmp_path: Path, n: int = 3) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(f"""name: tiny
sets:
  - {{name: small, eval: {{synthetic: {n}, seed: 1, generator: {{max_value: 9, max_steps: 1}}}}, prompt: short}}
  - {{name: products, eval: {{synthetic: {n}, seed: 2, generator: {{ops: "*", max_steps: 1}}}}, prompt: bare,
     max_new_tokens: 6}}
""")
    return path


def test_suite_on_a_run_puts_base_and_adapter_side_by_side(sft_run, tmp_path):
    result = CliRunner().invoke(app, ["eval", str(sft_run), "--suite", str(_tiny_suite(tmp_path)),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert [r["role"] for r in summary["rows"]] == ["base", "trained"]
    assert summary["rows"][1]["model"].endswith("/adapter") and summary["rows"][0]["model"] == "rlkit/tiny-qwen3"
    for row in summary["rows"]:
        for cell in row["sets"].values():
            res = json.loads(Path(cell["results"]).read_text())
            assert cell["n"] == res["n"] == 3 and cell["correct"] == sum(e["correct"] for e in res["examples"])
            assert cell["accuracy"] == pytest.approx(res["accuracy"])
    products = json.loads(Path(summary["rows"][0]["sets"]["products"]["results"]).read_text())
    assert all(re.search(r"\d+ groups|\d+ \w+ with \d+", e["prompt"]) for e in products["examples"])
    assert "small" in result.output and "products" in result.output and "gain" in result.output


def test_suite_cells_carry_wilson_intervals_and_the_gain_is_paired(tmp_path, monkeypatch):
    """Scripted evals (no model): set `small` goes 2/10 -> 8/10 on the same problems (6 gained, none lost: exact
    McNemar p = 2 * 0.5**6 = 0.031), `products` 10/20 -> 11/20 (one gained: p = 1)."""
    import io

    from rich.console import Console

    import rlkit.evaluate
    from rlkit.cli.suite import suite_table
    from rlkit.stats import wilson

    right = {(False, 1): range(2), (True, 1): range(8), (False, 2): range(10), (True, 2): range(11)}

    def scripted(source, ref, *, limit, out, overrides, show_progress, served):
        data = json.loads(overrides[0].removeprefix("data.eval="))
        n = data["synthetic"]
        examples = [{"prompt": f"q{i}", "correct": i in right[ref == "trained/adapter", data["seed"]]} for i in range(n)]
        return {"model": ref, "n": n, "accuracy": sum(e["correct"] for e in examples) / n, "examples": examples,
                "path": str(out)}

    monkeypatch.setattr(rlkit.evaluate, "evaluate", scripted)
    suite = load_suite(_tiny_suite(tmp_path, n=10))
    suite.sets[1].eval["synthetic"] = 20
    summary = run_suite(str(recipes_dir() / "tiny_arith_grpo.yaml"), suite, model="trained/adapter",
                        out=tmp_path / "out", show_progress=False)
    base, trained = (r["sets"] for r in summary["rows"])
    assert base["small"]["interval"] == pytest.approx(list(wilson(2, 10)))
    assert trained["products"]["interval"] == pytest.approx(list(wilson(11, 20)))
    small, products = summary["gain"]["small"], summary["gain"]["products"]
    assert small["diff"] == pytest.approx(0.6) and small["p"] == pytest.approx(2 * 0.5 ** 6) and small["significant"]
    assert products["diff"] == pytest.approx(0.05) and products["p"] == 1.0 and not products["significant"]
    assert json.loads((tmp_path / "out" / "suite.json").read_text())["gain"]["small"]["test"] == "mcnemar"
    console = Console(file=io.StringIO(), width=240)
    console.print(suite_table(summary))
    lines = console.file.getvalue().splitlines()  # a row per set: base, trained, gain
    (header,) = [line for line in lines if "base: rlkit/tiny-qwen3-small" in line]
    assert header.index("base: rlkit/tiny-qwen3-small") < header.index("trained: trained/adapter") < header.index("gain")
    (small,) = [line for line in lines if line.startswith("│ small ")]
    assert re.search(r"0\.200 \[0\.057, 0\.510\] \(2/10\)\s+│\s+0\.800 \[0\.490, 0\.943\] \(8/10\)\s+│\s+"
                     r"\+0\.600 \[\+0\.\d{3}, \+0\.\d{3}\] p=0\.031 \*", small)
    (products,) = [line for line in lines if line.startswith("│ products ")]
    assert re.search(r"0\.500 \[0\.299, 0\.701\] \(10/20\)\s+│\s+0\.550 \[0\.342, 0\.742\] \(11/20\)\s+│\s+"
                     r"\+0\.050 \[[-+]0\.\d{3}, \+0\.\d{3}\] p=1(?! \*)", products)


@pytest.mark.slow
def test_real_model_suite_table_matches_plain_eval(smollm2_dir, tmp_path):
    """SmolLM2 on two sets: the suite's counts are those of `rlkit eval` with the same set as --set overrides."""
    from rlkit.evaluate import evaluate

    suite = load_suite(_tiny_suite(tmp_path, n=12))
    recipe = str(recipes_dir() / "smol_arith_grpo.yaml")
    summary = run_suite(recipe, suite, out=tmp_path / "suite", show_progress=False)
    assert [r["role"] for r in summary["rows"]] == ["base"]
    cells = summary["rows"][0]["sets"]
    for s in suite.sets:
        plain = evaluate(recipe, overrides=s.overrides(), out=tmp_path / f"{s.name}.json", show_progress=False)
        golds = [e["gold"] for e in plain["examples"]]
        rescored = sum(gsm8k_correct([e["completion"]], answer=[g])[0] for e, g in zip(plain["examples"], golds, strict=True))
        assert cells[s.name]["correct"] == rescored == round(plain["accuracy"] * 12) and cells[s.name]["n"] == 12
    # the model does sums better than products shown no worked turns
    assert cells["small"]["correct"] > cells["products"]["correct"]


@pytest.mark.skipif(not (SHARED / "hotpotqa_closed").is_dir(), reason="shared/data/hotpotqa_closed is absent")
def test_multihop_suite_searches_its_own_corpus(tmp_path, monkeypatch):
    """The multihop set's questions load with their own columns, and its tool searches its own corpus."""
    from rlkit.data import load_rows
    from rlkit.retrieval.index import build_retriever

    monkeypatch.chdir(ROOT)  # the suite's paths are read from the repo root
    suite = load_suite("multihop")
    recipe = load_recipe(recipes_dir() / f"{suite.recipe}.yaml",
                         [*suite.sets[0].overrides(), f"retrieval.cache_dir={tmp_path}"])
    rows = load_rows(recipe.data.task, recipe.data.eval)
    assert len(rows) == 100 and rows[0]["supporting_ids"] == ["Alû", "Lilu (mythology)"]
    retriever = build_retriever(recipe.retrieval, show_progress=False)
    assert "Lilu (mythology)" in [p.title for p in retriever.search("Lilu demon Gallu", k=5)]


def test_compare_pairs_models_already_evaluated_on_one_suite(tmp_path, monkeypatch):
    """Scripted evals written to disk (no model): on `small` (10 problems) base 2, t 6, u 8 right; on `products`
    base 5, t 5, u 9. u - base pooled: 7/20 -> 17/20, 10 gained, none lost: exact McNemar p = 2 * 0.5**10."""
    import shutil

    import rlkit.evaluate
    from rlkit.evaluate.suite import compare_suites
    from rlkit.runs import RESOLVED

    right = {("base", 1): 2, ("t", 1): 6, ("u", 1): 8, ("base", 2): 5, ("t", 2): 5, ("u", 2): 9, ("u", 3): 8}

    def scripted(source, ref, *, limit, out, overrides, show_progress, served):
        data = json.loads(overrides[0].removeprefix("data.eval="))
        n = limit or data["synthetic"]
        hits = right["base" if ref not in ("t", "u") else ref, data["seed"]]
        examples = [{"prompt": f"q{data['seed']}-{i}", "gold": str(i), "correct": i < hits} for i in range(n)]
        results = {"model": ref, "n": n, "accuracy": sum(e["correct"] for e in examples) / n, "examples": examples,
                   "path": str(out)}
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results))
        return results

    monkeypatch.setattr(rlkit.evaluate, "evaluate", scripted)
    suite = load_suite(_tiny_suite(tmp_path, n=10))
    recipe = str(recipes_dir() / "tiny_arith_grpo.yaml")
    for model, folder, limit in (("t", "a", None), ("u", "b", None), ("u", "short", 8)):
        run_suite(recipe, suite, model=model, no_base=model == "u", limit=limit, out=tmp_path / folder,
                  show_progress=False)
    suite.sets[0].eval["seed"] = 3  # the same number of problems, other ones
    run_suite(recipe, suite, model="u", no_base=True, out=tmp_path / "other", show_progress=False)
    suite.sets[0].eval["seed"], suite.pooled = 1, "both sets"  # a suite with its own pooled row
    run_suite(recipe, suite, model="u", no_base=True, out=tmp_path / "with-pooled", show_progress=False)
    shutil.move(tmp_path / "b", tmp_path / "moved")  # found by where the folder is now, not where it was written
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / RESOLVED).write_text("name: r\n")
    shutil.copytree(tmp_path / "a", run / "eval" / "suite-tiny")

    summary = compare_suites([f"base={tmp_path / 'a'}:base", f"T={run}:trained", f"U={tmp_path / 'moved'}"])
    assert [m["role"] for m in summary["models"]] == ["base", "trained", "trained"]
    small, products, pooled = summary["rows"]
    assert [r["set"] for r in summary["rows"]] == ["small", "products", "pooled"] and pooled["n"] == 20
    assert {k: a["accuracy"] for k, a in pooled["accuracy"].items()} == pytest.approx(
        {"base": 0.35, "T": 0.55, "U": 0.85})
    assert small["diff"]["T - base"]["diff"] == pytest.approx(0.4) and small["diff"]["T - base"]["p"] == pytest.approx(
        2 * 0.5 ** 4)
    assert products["diff"]["T - base"]["p"] == 1.0 and not products["diff"]["T - base"]["significant"]
    assert pooled["diff"]["U - base"]["p"] == pytest.approx(2 * 0.5 ** 10) and pooled["diff"]["U - base"]["significant"]

    for specs, message in (([str(tmp_path / "a")], "two or more"),
                           ([str(tmp_path / "a"), str(tmp_path / "a")], "both"),
                           ([str(tmp_path / "a"), f"{tmp_path / 'moved'}:base"], "has no base row"),
                           ([str(tmp_path / "a"), str(tmp_path / "short")], r"same problems \(8 against 10"),
                           ([str(tmp_path / "a"), str(tmp_path / "other")], r"same problems \(problem 1 differs"),
                           ([str(tmp_path / "a"), str(tmp_path)], "not an `rlkit eval --suite` folder"),
                           ([str(tmp_path / "a"), str(tmp_path / "none")], "no such file or folder")):
        with pytest.raises(UserError, match=message):
            compare_suites(specs)

    joined = compare_suites([f"U={tmp_path / 'moved'}", f"P={tmp_path / 'with-pooled'}"])["rows"][-1]
    assert joined["set"] == "both sets" and joined["diff"]["P - U"]["diff"] == 0.0 and joined["n"] == 20

    out = tmp_path / "cmp" / "c.json"
    result = CliRunner().invoke(app, ["compare", f"{tmp_path / 'a'}:base", f"U={tmp_path / 'moved'}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # pooled U - base, whole at any width (a narrow console shows a block per row, the cell on a line of its own)
    assert re.search(r"\+0\.500 \[\+0\.\d{3}, \+0\.\d{3}\] p=0\.002 \*", result.output) and "U - " in result.output
    assert json.loads(out.read_text())["rows"][2]["diff"][f"U - {tmp_path / 'a'}:base"]["diff"] == pytest.approx(0.5)
    assert "| pooled | 20 |" in out.with_suffix(".md").read_text()
    assert CliRunner().invoke(app, ["compare", str(tmp_path / "a"), f"U={tmp_path / 'moved'}",
                                    "--out", str(out)]).exit_code == 0  # its own output: replaced
    mine = tmp_path / "mine.json"
    mine.write_text('{"notes": 1}')
    (tmp_path / "notes.md").write_text("my notes")
    (tmp_path / "empty.json").touch()
    (tmp_path / "empty.md").write_text("mine too")
    # a user's file; one beside the Markdown it would write (new, or empty); a Markdown --out, which the table would
    # overwrite
    for target in (mine, tmp_path / "notes.json", tmp_path / "empty.json", tmp_path / "c.md"):
        result = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), f"U={tmp_path / 'moved'}",
                                          "--out", str(target)])
        assert isinstance(result.exception, UserError), result.output
    assert mine.read_text() == '{"notes": 1}' and (tmp_path / "notes.md").read_text() == "my notes"
    assert not (tmp_path / "notes.json").exists() and (tmp_path / "empty.md").read_text() == "mine too"
    assert not (tmp_path / "c.md").exists()
