"""Reward throughput: completions scored per second by `gsm8k_correct` and `qa_correct`.

The rewards are called as TRL calls them during GRPO: one batch of conversational completions (lists of
messages) plus the gold `answer` column. The completions look like a policy's:

- GSM8K: worked solutions (GSM8K train from ../shared/data when present, otherwise rlkit's generator)
  ending in `#### N`, `\\boxed{N}`, "The answer is N" or a wrong number, a third of them after a
  `<think>` block.
- QA: MultiHop-RAG-style tool trajectories over rlkit's synthetic news corpus: a search call, the tool
  result, then a final answer inside `<answer>` (some after thinking, some without the tag, some wrong).

    .venv/bin/python bench/rewards.py
"""

from __future__ import annotations

import functools
import json
import random

from common import ROOT, figure, median, table, times, write

N = 4000
REPEAT = 5
GSM8K_TRAIN = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def gsm8k_batch(n: int, seed: int = 0) -> tuple[list, list[str], str]:
    """(completions, gold answers, where the solutions came from)."""
    from rlkit.data.gsm8k import generate, solution_text

    if GSM8K_TRAIN.is_file():
        rows = [json.loads(line) for line in GSM8K_TRAIN.read_text().splitlines()[:n]]
        source = "GSM8K train (../shared/data/gsm8k)"
    else:
        rows = generate(n, seed=seed).to_list()
        source = "rlkit.data.gsm8k.generate"
    rng = random.Random(seed)
    completions, golds = [], []
    for i, row in enumerate(rows):
        steps, _, number = solution_text(row["answer"]).rpartition("####")
        number, steps = number.strip(), steps.strip()
        ending = [f"#### {number}", f"The answer is $\\boxed{{{number}}}$.", f"So the answer is {number}.",
                  f"#### {number}1"][i % 4]  # the last one is wrong
        text = f"{steps}\n{ending}"
        if rng.random() < 1 / 3:
            text = f"<think>\nLet me work through it. {row['question']}\n</think>\n\n{text}"
        completions.append([{"role": "assistant", "content": text}])
        golds.append(row["answer"])
    return completions, golds, source


def qa_batch(n: int, seed: int = 0) -> tuple[list, list[str], str]:
    from rlkit.retrieval.synthetic import articles, queries

    corpus = articles(60, seed=seed)
    rng = random.Random(seed)
    completions, golds = [], []
    for i, q in enumerate(queries(corpus, n, seed=seed)):
        passage = rng.choice(corpus)
        answer = [q["answer"], q["answer"], "Insufficient information.", q["answer"].lower()][i % 4]
        final = (f"Based on the search results, the answer is in the {passage['source']} article.\n"
                 f"<answer>{answer}</answer>")
        if i % 5 == 0:
            final = f"Answer: {answer}"
        if rng.random() < 1 / 3:
            final = f"<think>\nThe results mention {passage['title']}. That settles it.\n</think>\n\n{final}"
        call = {"type": "function", "function": {"name": "search", "arguments": {"query": q["query"]}}}
        completions.append([
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "search", "content": f"[1] {passage['title']}\n{passage['body']}"},
            {"role": "assistant", "content": final},
        ])
        golds.append(q["answer"])
    return completions, golds, "rlkit.retrieval.synthetic queries over 60 generated articles"


def main() -> None:
    from rlkit.rewards import REWARDS

    cases = {"gsm8k_correct": gsm8k_batch(N), "qa_correct": qa_batch(N)}
    rows, figures, details = [], [], {}
    for name, (completions, golds, source) in cases.items():
        reward = REWARDS[name]
        prompts = [[{"role": "user", "content": "..."}]] * len(completions)
        call = functools.partial(reward, prompts=prompts, completions=completions, answer=golds)
        scores = call()
        seconds = times(call, REPEAT)
        rate = len(completions) / median(seconds)
        mean_chars = sum(len(c[-1]["content"]) for c in completions) / len(completions)
        rows.append([name, len(completions), round(mean_chars), median(seconds), rate, sum(scores) / len(scores)])
        figures.append(figure(f"{name} throughput", rate, "completions/s", digits=0))
        details[name] = {"source": source, "n": len(completions), "seconds": seconds, "completions_per_second": rate,
                         "mean_reward": sum(scores) / len(scores)}
    write("rewards", "Reward throughput", figures,
          [table(f"One call over {N} completions, median of {REPEAT}",
                 ["reward", "completions", "mean chars (final message)", "seconds", "completions/s", "mean reward"],
                 rows)],
          what="Completions per second scored by the registry rewards `gsm8k_correct` and `qa_correct`, called "
               "as TRL calls them (one batch of conversational completions plus the gold `answer` column).",
          details=details, notes=[f"{name}: {d['source']}" for name, d in details.items()])


if __name__ == "__main__":
    main()
