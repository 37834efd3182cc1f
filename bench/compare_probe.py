"""Does SmolLM2-135M-Instruct (the demos' model) compare two numbers or two dates written right before its Yes/No?

Half of `make demo-search`'s questions ask for such a comparison ("did X report higher revenue growth than Y?", "was
X's report published before Y's?"), and the search agent answers them at chance (docs/demos.md). This asks the model
the comparison with nothing to search: 100 random pairs per form, the same seed every run, and reads the logits of
"Yes" against "No" where the answer starts. A model that compares says "Yes" about as often as the truth is "Yes"
and is right far above 50; `best cut` is the accuracy of the best threshold on the Yes - No margin, fitted on the
same rows: whether the margin carries the comparison at all (a margin that knows nothing scores 56-58 of 100 on
average, 62-63 at the 95th percentile; of 50, 30-31 and 34, 35-36 at the 99th; simulated).

`--agent` adds the search agent's own context: the 50 Yes/No questions of the demo's held-out and new-wording sets
with the oracle teacher's two searches and both gold passages before `<answer>` ("passages"), and the same with the
teacher's quoted facts (`rlkit rollout --oracle --cite`) right before it ("facts quoted"), those facts after the
question with no searches or passages between ("facts, no passages"), and the passages followed by the two facts
written as the drills state them, question restated ("facts stated"). About 16 minutes more on 2 cores.

`--drills N FILE` writes N SFT rows (`messages`) of the two stated forms, other names, pairs the probe never asks,
to teach the comparison with `rlkit train` (docs/demos.md has the command and what it taught); `--teach N FILE`, the
demo's 128 teacher rows with each Yes/No answer preceded by its two facts in that stated form, and N drills, 10 a row:

    .venv/bin/python bench/compare_probe.py [MODEL_DIR] [--agent]   # default: the demos' SmolLM2 build; ~2 min
    .venv/bin/python bench/compare_probe.py --drills 1600 runs/compare_drills.jsonl
    .venv/bin/python bench/compare_probe.py --teach 1600 runs/search_taught.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
from itertools import islice
from pathlib import Path

MONTHS = ["September", "October", "November", "December"]
NAMES = ["Acme Corp", "Borealis", "Cobalt Bank", "Delta Foods", "Everline", "Fjord Energy", "Granite Motors",
         "Helix Bio", "Ironwood", "Juniper Air", "Kestrel Media", "Lumen Retail", "Meridian", "Nova Steel"]


def draws(rng: random.Random):
    """Endless (growth a, growth b, date 1, date 2): the synthetic corpus's growth range and four months of 2023."""
    while True:
        yield *rng.sample(range(2, 61), 2), *rng.sample([(m, d) for m in range(4) for d in range(1, 29)], 2)


def growth(x: str, y: str, a: int, b: int) -> str:
    return f"{x} reported revenue up {a}%. {y} reported revenue up {b}%. Did {x} report higher revenue growth than {y}?"


def dated(x: str, y: str, first: str, second: str) -> str:
    return (f"{x}'s report was published on {first}. {y}'s report was published on {second}. Was {x}'s report "
            f"published before {y}'s?")


def stated(kind: str, question: str, quoted: list[str]) -> str | None:
    """The two facts the oracle quoted (``--cite``: "Outlet, date: fact"), rewritten as the drills state them, in the
    question's order, question restated; None without both facts (the oracle quotes only what a search returned)."""
    growth_fact, date_fact = r": (.+?) reported quarterly revenue of .+ up (\d+)%", r"(.+?), (\w+ \d+, \d+):"
    found = [re.search(growth_fact if kind == "comparison_query" else date_fact, line) for line in quoted]
    if len(found) != 2 or not all(found) or not all(match[1] in question for match in found):
        return None
    (x, first), (y, second) = sorted((match.groups() for match in found), key=lambda fact: question.index(fact[0]))
    if kind == "comparison_query":
        return growth(x, y, int(first), int(second))
    if x == y:  # one outlet reported both: in the order quoted
        return dated("the first", "the second", found[0][2], found[1][2])
    return dated(x, y, first, second)


def pairs(seed: int = 0, n: int = 100):
    """(form, messages, text the answer starts with, truth) for n pairs of each form."""
    from rlkit.data.multihop_rag import PROMPTS

    for a, b, (m1, d1), (m2, d2) in islice(draws(random.Random(seed)), n):
        question = growth("Alpha Labs", "Beta Systems", a, b)
        yield "numbers alone", [_user(f"Is {a} greater than {b}? Answer Yes or No.")], "", a > b
        yield "growth, both stated", [_user(f"{question} Answer Yes or No.")], "", a > b
        yield "growth, agent's prompt", [{"role": "system", "content": PROMPTS["default"]}, _user(question)], \
            "<answer>", a > b
        yield "dates, both stated", [_user(f"Report A was published on {MONTHS[m1]} {d1}, 2023. Report B was "
                                           f"published on {MONTHS[m2]} {d2}, 2023. Was report A published before "
                                           "report B? Answer Yes or No.")], "", (m1, d1) < (m2, d2)


def agent_pairs():
    """The demo's Yes/No questions in the agent's context: the oracle's searches and passages (and quoted facts)."""
    from rlkit.agents.rollout import rollout
    from rlkit.demos.search import SETS

    with tempfile.TemporaryDirectory() as tmp:
        for cite in (False, True):
            for _, slug, extra in SETS:
                out = Path(tmp) / f"{slug}-{cite}.jsonl"
                rollout("recipes/smol_search_grpo.yaml", oracle=True, cite=cite, overrides=extra, out=out,
                        show_progress=False)
                for row in map(json.loads, out.read_text().splitlines()):
                    if row["question_type"] in ("comparison_query", "temporal_query"):
                        said, gold = row["messages"][-1]["content"], row["answer"].strip() == "Yes"
                        start = said[:said.index("<answer>")] + "<answer>"
                        yield f"agent, {slug}, {'facts quoted' if cite else 'passages'}", row["messages"][:-1], \
                            start, gold
                        if cite:  # the same quoted facts after the question alone: no searches, no passages
                            yield f"agent, {slug}, facts, no passages", row["messages"][:2], start, gold
                            restated = stated(row["question_type"], row["messages"][1]["content"],
                                              said[:said.index("<answer>")].strip().splitlines())
                            if restated:  # the facts as the drills state them, after the passages
                                yield f"agent, {slug}, facts stated", row["messages"][:-1], \
                                    f"{restated}\n<answer>", gold


def drills(n: int) -> list[dict]:
    """n rows, each one stated form (growth or dates) about two other names, on a pair the probe never asks."""
    asked = {frozenset(pair) for a, b, d1, d2 in islice(draws(random.Random(0)), 100) for pair in ((a, b), (d1, d2))}
    rng, rows = random.Random(1), []
    for a, b, (m1, d1), (m2, d2) in draws(rng):
        if len(rows) == n:
            break
        dates, (x, y) = rng.randrange(2), rng.sample(NAMES, 2)
        if frozenset(((m1, d1), (m2, d2)) if dates else (a, b)) in asked:
            continue
        user, truth = (growth(x, y, a, b), a > b) if not dates else (
            dated(x, y, f"{MONTHS[m1]} {d1}, 2023", f"{MONTHS[m2]} {d2}, 2023"), (m1, d1) < (m2, d2))
        rows.append({"messages": [_user(f"{user} Answer Yes or No."),
                                  {"role": "assistant", "content": "Yes" if truth else "No"}]})
    return rows


def taught(n: int) -> list[dict]:
    """The demo's teacher rows (the oracle on its 128 training questions), each Yes/No answer preceded by the two
    facts as the drills state them, and n drills packed 10 to a row; shuffled, the same every run."""
    from rlkit.agents.rollout import rollout
    from rlkit.demos.search import TEACHER_QUESTIONS

    with tempfile.TemporaryDirectory() as tmp:
        episodes, sft = Path(tmp) / "episodes.jsonl", Path(tmp) / "sft.jsonl"
        rollout("recipes/smol_search_grpo.yaml", oracle=True, cite=True, split="train", limit=TEACHER_QUESTIONS,
                out=episodes, sft_out=sft, show_progress=False)
        kinds = {e["messages"][1]["content"]: e["question_type"] for e in map(json.loads, episodes.open())}
        rows = list(map(json.loads, sft.open()))
    for row in rows:  # --cite's quoted facts dropped: the plain teacher's row, or the facts stated
        question, last = row["messages"][1]["content"], row["messages"][-1]
        said, at = last["content"], last["content"].index("<answer>")
        restated = (stated(kinds[question], question, said[:at].strip().splitlines())
                    if kinds[question] in ("comparison_query", "temporal_query") else None)
        last["content"] = f"{restated}\n{said[at:]}" if restated else said[at:]
    drilled = drills(n)
    rows += [{"messages": [m for row in drilled[i:i + 10] for m in row["messages"]]} for i in range(0, n, 10)]
    random.Random(0).shuffle(rows)
    return rows


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="compare_probe", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", help="a model or PEFT adapter folder (default: the demos' build)")
    parser.add_argument("--agent", action="store_true", help="add the search agent's context")
    parser.add_argument("--drills", nargs=2, metavar=("N", "FILE"), help="write N drill rows to a new FILE, and stop")
    parser.add_argument("--teach", nargs=2, metavar=("N", "FILE"),
                        help="write the teacher's rows, facts stated, and N drills to a new FILE, and stop")
    args = parser.parse_args(argv)
    if args.drills and args.teach or (args.drills or args.teach) and (args.model_dir or args.agent):
        parser.error("--drills and --teach each write a file and stop: give one of them, without MODEL_DIR or --agent")
    for flag, make in (("--drills", drills), ("--teach", taught)):
        if getattr(args, flag[2:]):
            n, path = getattr(args, flag[2:])
            if not (n.isascii() and n.isdigit()) or Path(path).exists() or not Path(path).parent.is_dir():
                parser.error(f"{flag} {n} {path}: N must be a whole number and FILE a new file in a folder that exists")
            rows = make(int(n))
            Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))
            return print(f"{len(rows)} rows -> {path}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.data.multihop_rag import search_tool_schemas
    from rlkit.smollm2 import smollm2_path

    model_dir = args.model_dir
    if model_dir and not any((Path(model_dir) / name).is_file() for name in ("config.json", "adapter_config.json")):
        parser.error(f"{model_dir} holds no model (config.json) or PEFT adapter (adapter_config.json)")
    torch.set_num_threads(2)
    path = model_dir or str(smollm2_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yes, no = tok.encode("Yes")[0], tok.encode("No")[0]
    margins: dict[str, list[tuple[float, bool]]] = {}
    rows = list(pairs()) + (list(agent_pairs()) if args.agent else [])
    for form, messages, start, truth in rows:
        tools = search_tool_schemas() if form.startswith("agent") else None
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True) + start
        with torch.no_grad():
            logits = model(tok(text, return_tensors="pt").input_ids).logits[0, -1]
        margins.setdefault(form, []).append(((logits[yes] - logits[no]).item(), truth))
    print(f"{'form':38} {'n':>4} {'right':>6} {'says Yes':>9} {'gold Yes':>9} {'best cut':>9}")
    for form, rows in margins.items():
        right = sum((m > 0) == t for m, t in rows)
        best = max(sum((m > cut) == t for m, t in rows) for cut in [m for m, _ in rows] + [float("-inf")])
        print(f"{form:38} {len(rows):>4} {right:>6} {sum(m > 0 for m, _ in rows):>9} {sum(t for _, t in rows):>9} "
              f"{best:>9}")


if __name__ == "__main__":
    main(sys.argv[1:])
