"""The reward card: every reward of the recipe on gold answers and on adversarial completions.

Rewards are called as TRL calls them (conversational completions when the prompts are, every data
column as a keyword). Blocking: a reward that raises, returns NaN/None-only or the wrong count, takes
longer than the budget, gives every probe the same score (no signal), or never pays the gold answer
its best score. Worth a look: a wrong completion that earns as much as the gold one.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from rlkit.doctor import Check, Context
from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe import Recipe

F = "rewards"
BUDGET_S = 1.0  # per reward, per batch of probes; TRL calls rewards once per generation batch
_HUGE_CHARS = 200_000
_UNICODE_DIGITS = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")  # Arabic-Indic digits


def _wrong(gold: str) -> str:
    try:
        return str(int(float(gold)) + 1)
    except ValueError:
        return "Paris" if gold.strip().lower() != "paris" else "London"


def _gold_texts(answer: str, thinking: bool) -> list[str]:
    """Ways a right completion may look: the GSM8K line, an <answer> tag, the bare answer."""
    think = "<think>\nA few short steps.\n</think>\n\n" if thinking else ""
    return [f"{think}Working it out step by step.\n#### {answer}", f"{think}<answer>{answer}</answer>",
            f"{think}{answer}"]


def probes(answer: str, question: str, thinking: bool) -> dict[str, str]:
    """Adversarial completions for one row; none of them is a right answer given honestly."""
    wrong = _wrong(answer)
    return {
        "empty": "",
        "format only, wrong answer": f"Working it out step by step.\n#### {wrong}",
        "wrong answer tag": f"<answer>{wrong}</answer>",
        "several answers": f"#### {wrong} #### {answer}",
        "question copied": question,
        "unicode digits": f"#### {answer.translate(_UNICODE_DIGITS)}",
        "answer in unclosed think": f"<think>\nThe answer is {answer}.\n#### {answer}",
        "huge": ("7 " * (_HUGE_CHARS // 2)) + f"\n#### {wrong}",
    }


# Probes that may legitimately score like the gold (right answer, odd form): reported, never warned about.
_NEUTRAL = ("unicode digits",)


def checks(ctx: Context) -> tuple[list[Check], dict[str, list[dict[str, Any]]]]:
    recipe = ctx.recipe
    if not recipe.rewards:
        return [], {}
    out, specs = _judges(recipe.rewards)
    if any(c.verdict == "fail" for c in out) or not specs:
        return out, {}
    rows = ctx.scored_rows
    if rows is None or "answer" not in rows.column_names:
        return [*out, Check(F, "reward card", "skip", "no prompt rows with gold answers to score")], {}
    from rlkit.rewards import resolve_reward

    thinking = _thinking(recipe)
    funcs = [(r.name.rpartition(":")[2], r.weight, resolve_reward(r.name, r.args)) for r in specs]
    conversational = isinstance(rows[0]["prompt"], list)
    columns = {c: rows[c] for c in rows.column_names if c != "prompt"}
    answers = [str(a) for a in rows["answer"]]
    questions = [_question(p) for p in rows["prompt"]]

    def wrap(texts: list[str]) -> list:
        return [as_episode(t, recipe) for t in texts] if conversational else texts

    failed: set[str] = set()

    def call(name: str, func: Any, texts: list[str], label: str) -> list[float] | None:
        started = time.perf_counter()
        try:
            values = func(prompts=rows["prompt"], completions=wrap(texts), **columns)
        except UserError as e:  # rlkit's own check of a user reward (rlkit.rewards) caught NaN, a wrong count or type
            out.append(Check(F, f"{name}: {label}", "fail", str(e),
                             "return one finite float (or None) per completion"))
            failed.add(name)
            return None
        except Exception as e:  # the card's point is to show any exception a reward raises, as evidence
            out.append(Check(F, f"{name}: {label}", "fail", f"raised {type(e).__name__}: {e}",
                             "rewards must return a score for any text, never raise"))
            failed.add(name)
            return None
        seconds = time.perf_counter() - started
        values = list(values) if values is not None else []
        if len(values) != len(texts):
            out.append(Check(F, f"{name}: {label}", "fail", f"returned {len(values)} scores for {len(texts)} "
                             "completions", "return one score per completion"))
            failed.add(name)
            return None
        bad = [v for v in values if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v))]
        if bad:
            out.append(Check(F, f"{name}: {label}", "fail", f"returned non-finite scores {bad[:3]}",
                             "return finite floats (or None to skip a completion)"))
            failed.add(name)
            return None
        if seconds > BUDGET_S and name not in REMOTE:  # a judge's time is the network's; it has its own timeout
            out.append(Check(F, f"{name}: {label}", "fail", f"took {seconds:.2f}s for {len(texts)} completions "
                             f"(budget {BUDGET_S:.0f}s)", "make the reward linear in the completion length"))
            failed.add(name)
        return [float(v) if v is not None else math.nan for v in values]

    # Gold: the form that earns the most in total, per row (the recipe's rewards decide what "right" looks like).
    candidates = list(zip(*[_gold_texts(a, thinking) for a in answers], strict=True))
    per_candidate = []
    for texts in candidates:
        scores = {name: call(name, func, list(texts), "gold") for name, _, func in funcs}
        per_candidate.append(scores)
    if failed:
        return out, {}
    totals = [[sum(w * _nz(s[name][i]) for name, w, _ in funcs) for i in range(len(answers))]
              for s in per_candidate]
    best = [max(range(len(candidates)), key=lambda c, i=i: totals[c][i]) for i in range(len(answers))]
    gold = {name: [per_candidate[best[i]][name][i] for i in range(len(answers))] for name, _, _ in funcs}
    gold_total = [totals[best[i]][i] for i in range(len(answers))]

    table = [{"completion": "gold", **{n: _mean(v) for n, v in gold.items()}, "total": _mean(gold_total)}]
    probe_sets = [probes(a, q, thinking) for a, q in zip(answers, questions, strict=True)]
    scores: dict[str, dict[str, list[float]]] = {}
    for label in probe_sets[0]:
        texts = [p[label] for p in probe_sets]
        scores[label] = {name: call(name, func, texts, label) for name, _, func in funcs}
        if any(v is None for v in scores[label].values()):
            continue
        total = [sum(w * _nz(scores[label][name][i]) for name, w, _ in funcs) for i in range(len(texts))]
        table.append({"completion": label, **{n: _mean(v) for n, v in scores[label].items()}, "total": _mean(total)})
        scores[label]["__total__"] = total
    for name, _, _ in funcs:
        if name in failed:
            continue
        out.append(_verdict(name, gold[name], {label: s[name] for label, s in scores.items()}, len(answers)))
    if not failed:
        out.append(_total_verdict(gold_total, {label: s["__total__"] for label, s in scores.items()
                                               if "__total__" in s}))
    return out, {"reward card": table}


REMOTE = ("judge", "rank")  # rewards that call an endpoint (rlkit.rewards.judge)


def _judges(rewards: list) -> tuple[list[Check], list]:
    """One request to each judge endpoint first: an unreachable judge is one blocking line, not a card of
    timeouts. ``rank`` scores a prompt's completions against each other, so the card (one probe per prompt)
    cannot score it: it is reported and left out of the card."""
    from rlkit.rewards.judge import settings_of
    from rlkit.rewards.judge_client import preflight

    out, specs = [], []
    for spec in rewards:
        if spec.name in REMOTE:
            try:
                preflight(settings_of(spec.args or {}))
            except UserError as e:
                out.append(Check(F, f"{spec.name}: endpoint", "fail", str(e), "start the judge server or fix its args"))
                continue
            out.append(Check(F, f"{spec.name}: endpoint", "ok", f"{spec.args['endpoint']} answers as "
                             f"{spec.args['model']!r}"))
        if spec.name == "rank":
            out.append(Check(F, "rank", "skip", "a relative reward: it scores each prompt's group of completions "
                             "against each other in training; the card's probes come one per prompt"))
            continue
        specs.append(spec)
    return out, specs


def gold_totals(recipe: Recipe, rows: Any) -> list[float]:
    """Per row, the weighted total of the best-scoring gold form (what a right answer earns)."""
    from rlkit.rewards import RewardSet

    rewards = RewardSet(recipe.rewards)
    thinking = _thinking(recipe)
    conversational = isinstance(rows[0]["prompt"], list)
    columns = {c: rows[c] for c in rows.column_names if c != "prompt"}
    best = [float("-inf")] * len(rows)
    for texts in zip(*[_gold_texts(str(a), thinking) for a in rows["answer"]], strict=True):
        completions = [as_episode(t, recipe) for t in texts] if conversational else list(texts)
        totals, _ = rewards(rows["prompt"], completions, **columns)
        best = [max(b, t) for b, t in zip(best, totals, strict=True)]
    return best


# The tool round before a probe's answer in a recipe with an env: rewards that ask for a search see one.
_TOOL_ROUND = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "probe",
                                                                    "function": {"name": "tool", "arguments": {}}}]},
               {"role": "tool", "name": "tool", "content": "(a tool result)"}]


def as_episode(text: str, recipe: Recipe) -> list[dict[str, Any]]:
    """A probe as a conversational completion: the answer message, after one tool round if the recipe has an env
    (as TRL hands a tool-using completion to the rewards: tool calls and results, then the final message)."""
    return [*(_TOOL_ROUND if recipe.env is not None else []), {"role": "assistant", "content": text}]


def _thinking(recipe: Recipe) -> bool:
    return bool(recipe.model.chat_template_kwargs.get("enable_thinking")) or any(
        r.name in ("think_format", "short_think") for r in recipe.rewards)


def _verdict(name: str, gold: list[float], probe_scores: dict[str, list[float]], n: int) -> Check:
    everything = [v for v in gold if not math.isnan(v)] + [v for s in probe_scores.values() for v in s
                                                           if not math.isnan(v)]
    data = {"gold_mean": _mean(gold), "probes": {k: _mean(v) for k, v in probe_scores.items()}}
    if not everything:
        return Check(F, name, "fail", "returned None for every completion", "score at least some completions", data)
    if max(everything) == min(everything):
        return Check(F, name, "fail", f"scores {everything[0]:g} on the gold answers and on every probe: no signal "
                     "for GRPO (every group gets the same reward)", "reward what differs between right and wrong",
                     data)
    top = max(everything)
    short = [i for i, v in enumerate(gold) if math.isnan(v) or v < top]
    if len(short) == n:
        return Check(F, name, "fail", f"no gold answer earns the top score {top:g} (gold mean {_mean(gold):g}): it "
                     "pays something else more than a right answer", "check which column and form the reward reads",
                     data)
    above = [label for label, vals in probe_scores.items() if _mean(vals) > _mean(gold)]
    if above:
        return Check(F, name, "fail", f"pays {', '.join(above)} more than the gold answers "
                     f"({_mean(probe_scores[above[0]]):g} > {_mean(gold):g})", "make the right answer the best answer",
                     data)
    return Check(F, name, "ok", f"gold {_mean(gold):g} (best {top:g}); " + ", ".join(
        f"{k} {_mean(v):g}" for k, v in probe_scores.items()), data=data)


def _total_verdict(gold: list[float], totals: dict[str, list[float]]) -> Check:
    """The weighted sum GRPO sees: every dishonest probe must earn less than the gold answer."""
    gold_mean = _mean(gold)
    hacks = [label for label, vals in totals.items() if label not in _NEUTRAL and _mean(vals) >= gold_mean]
    data = {"gold": gold_mean, **{k: _mean(v) for k, v in totals.items()}}
    if hacks:
        return Check(F, "weighted total", "warn", f"{', '.join(hacks)} earn(s) as much as the gold answer "
                     f"({gold_mean:g}) in the weighted total", "add or reweight a reward that tells them apart", data)
    return Check(F, "weighted total", "ok", f"gold earns {gold_mean:g}; the best wrong probe "
                 f"{max((_mean(v) for k, v in totals.items() if k not in _NEUTRAL), default=0.0):g}", data=data)


def _question(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _nz(v: float) -> float:
    return 0.0 if math.isnan(v) else v


def _mean(values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return round(sum(vals) / len(vals), 4) if vals else math.nan
