"""Rollout engine: episodes/s with every live episode's turn in one batch vs one episode at a time.

The episodes are the calculator agent's (`recipes/gsm8k_calculator_grpo.yaml` with `--smoke`: the tiny
model, generated GSM8K-format problems, the `calculate` tool), run by `rlkit.agents.engine.run_episodes` with
`HFPolicy`, greedy, the same `max_new_tokens`. Batched: all 16 episodes in one engine call, batch size
16. One at a time: the same 16 episodes, one engine call each, batch size 1. Target: >= 3x at 16
episodes. The demo's larger `small` model is measured too, for scale.

A random-initialised model never writes a parseable tool call, so every episode here is one assistant
turn of `max_new_tokens` tokens; with a trained agent, later turns batch the same way.

    .venv/bin/python bench/rollout.py
"""

from __future__ import annotations

import time

from common import ROOT, figure, median, table, write

EPISODES = 16
MAX_NEW_TOKENS = 48
REPEAT = 2
TARGET = 3.0
ATTENTION = ("eager", "sdpa")  # the first is what --smoke uses and what the target is held to
RECIPE = ROOT / "recipes" / "gsm8k_calculator_grpo.yaml"


def alternate(runs: dict) -> dict[str, tuple[float, list]]:
    """{name: (median seconds of `REPEAT` runs, the episodes of the last)}; the runs take turns, so a change
    in the machine's load falls on both."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    episodes = {}
    for _ in range(REPEAT):
        for name, run in runs.items():
            started = time.perf_counter()
            episodes[name] = run()
            seconds[name].append(time.perf_counter() - started)
    return {name: (median(seconds[name]), episodes[name]) for name in runs}


def measure(attention: str) -> dict:
    from rlkit.agents.engine import run_episodes
    from rlkit.agents.hf import HFPolicy
    from rlkit.data import load_rows, task_rows
    from rlkit.envs import make_factory
    from rlkit.inference.load import load_for_generation
    from rlkit.recipe import load_recipe

    # --smoke: the tiny model and generated data; smoke picks eager attention, sdpa is measured too.
    overrides = [f"model.attn_implementation={attention}", f"data.eval.synthetic={EPISODES}"]
    recipe = load_recipe(RECIPE, overrides, smoke=True)
    rows = task_rows(recipe, "eval", load_rows(recipe.data.task, recipe.data.eval)).to_list()
    make_env = make_factory(recipe)
    model, tokenizer, _ = load_for_generation(recipe, None, None)
    kwargs = {"chat_template_kwargs": recipe.model.chat_template_kwargs, "max_new_tokens": MAX_NEW_TOKENS,
              "temperature": 0.0}
    batched = HFPolicy(model, tokenizer, batch_size=EPISODES, **kwargs)
    single = HFPolicy(model, tokenizer, batch_size=1, **kwargs)
    max_turns = recipe.env.max_turns

    def run_batched():
        return run_episodes(rows, make_env, batched, max_turns=max_turns, show_progress=False)

    def run_single():
        return [e for row in rows for e in run_episodes([row], make_env, single, max_turns=max_turns,
                                                        show_progress=False)]

    run_batched()  # warm-up: first-call allocations and kernel selection
    timings = alternate({"batched": run_batched, "single": run_single})
    (batch_seconds, a), (single_seconds, b) = timings["batched"], timings["single"]
    same = sum(x.completion == y.completion for x, y in zip(a, b, strict=True))
    tokens = sum(t["completion_tokens"] for e in a for t in e.turns)
    return {"model": recipe.model.name_or_path, "attention": attention,
            "parameters": sum(p.numel() for p in model.parameters()),
            "batched_seconds": batch_seconds, "single_seconds": single_seconds,
            "batched_eps": EPISODES / batch_seconds, "single_eps": EPISODES / single_seconds,
            "speedup": single_seconds / batch_seconds, "identical_completions": same,
            "turns": sum(len(e.turns) for e in a), "generated_tokens": tokens}


def main() -> None:
    results = {attention: measure(attention) for attention in ATTENTION}
    rows = [[r["model"], attention, f"{r['parameters'] / 1e6:.2f}M", r["batched_eps"], r["single_eps"], r["speedup"],
             f"{r['identical_completions']}/{EPISODES}", r["turns"], r["generated_tokens"]]
            for attention, r in results.items()]
    r = results[ATTENTION[0]]
    figures = [
        figure(f"batched / one-at-a-time episodes/s at {EPISODES} episodes", r["speedup"], "x", at_least=TARGET,
               digits=1, note=f"{ATTENTION[0]} attention, as --smoke sets it"),
        figure("batched episodes/s", r["batched_eps"], "episodes/s", digits=1),
        figure("one-at-a-time episodes/s", r["single_eps"], "episodes/s", digits=2),
        figure(f"batched / one-at-a-time at {EPISODES} episodes, sdpa attention", results["sdpa"]["speedup"], "x",
               digits=1),
    ]
    write("rollout", "Rollout engine: batched vs one episode at a time", figures,
          [table(f"{EPISODES} calculator episodes, greedy, max_new_tokens {MAX_NEW_TOKENS}, median of {REPEAT}",
                 ["model", "attention", "parameters", "batched episodes/s", "one-at-a-time episodes/s", "speedup",
                  "identical completions", "turns (batched run)", "generated tokens"], rows)],
          what="Episodes per second of `rlkit.agents.engine.run_episodes` with `HFPolicy` when the "
               f"{EPISODES} episodes' turns are generated in one batch vs one episode at a time (batch size 1), "
               "same episodes, greedy.",
          details=results,
          notes=["Random-initialised models never emit a parseable tool call, so each episode is one turn; "
                 "'identical completions' counts episodes whose batched (left-padded) and unbatched greedy "
                 "outputs are the same text."])


if __name__ == "__main__":
    main()
