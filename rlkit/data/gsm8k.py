"""GSM8K: grade-school math word problems, gold answer after ``####``.

Rows have ``question`` and ``answer`` (a full solution ending in ``#### N``). The model is asked
to reason, then end with GSM8K's own final-answer line ``#### N``; ``rlkit.rewards.math`` reads it.
``generate`` makes GSM8K-format arithmetic word problems for smoke runs and the offline demo.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from rlkit.data import arith
from rlkit.prompts import MATH_TUTOR

SYSTEM_PROMPT = MATH_TUTOR
# Prompt variants (`data.prompt` in a recipe). `calculator` goes with `env: {name: calculator}`.
PROMPTS = {
    "default": SYSTEM_PROMPT,
    "calculator": (
        "You are a careful math tutor with a `calculate` tool for arithmetic. Reason step by step and call the "
        "tool for any calculation you are not sure of, then give the final answer on the last line in the form "
        "`#### <number>`."
    ),
    # For thinking mode (`enable_thinking: true`): the reasoning goes in the think block, kept short.
    "thinking": (
        "You are a careful math tutor. Think briefly: a few short steps are enough. Then give the final answer "
        "on the last line in the form `#### <number>`."
    ),
    # Two lines, shown by example (``SHOTS``): a small model (SmolLM2-135M) copies the format from two worked
    # turns far more reliably than from an instruction, and short answers keep CPU generation cheap.
    "short": "Answer with the calculation, then `#### <number>`.",
    # Other prompt forms of `short` (the `arith` eval suite, the demo's training mix): the system line alone,
    # nothing at all (the chat template's own default system line), another system line with other worked turns.
    "short-zero": "Answer with the calculation, then `#### <number>`.",
    "bare": "",
    "alt": "Solve the word problem. Write the sum you do on one line, then the result as `#### <number>`.",
    # Per row, one of FORMS (a stable hash of the question picks): training that does not tie its gain to
    # one prompt form.
    "mix": "",
}
FORMS = ("short", "short-zero", "bare")
# Instructions as a user might type them, no worked turns: (where, text), where is `system` (the system line),
# `before` or `after` (in the user's message, before or after the question). ASK is for evaluation only (the
# `robust` eval suite, `data.prompt: ask-<name>`, or `ask-mix`: one per problem, a stable hash picks); no training
# mix uses any of them. TRAIN_ASK holds other phrasings for training (`data.prompt: mix-ask`: FORMS and these).
ASK = {
    "sys-hash": ("system", "Solve the problem. End your reply with a line '#### ' followed by the number."),
    "after-hash": ("after", "End your reply with '#### ' and the number."),
    "before-hash": ("before", "Give the result as #### followed by the number."),
    "after-answer": ("after", "Write your final answer as 'Answer: <number>'."),
    "sys-answer": ("system", "You are a helpful assistant. Finish with 'Answer:' and the number."),
    "after-bold": ("after", "Put the final answer in bold."),
    "before-number": ("before", "Please answer this math question with just the number."),
    "after-boxed": ("after", "Put your final answer within \\boxed{}."),
    "sys-is": ("system", "Think it through, then end with 'The answer is N.'"),
    "after-plain": ("after", "What is the answer?"),
}
TRAIN_ASK = {
    "t-sys-calc": ("system", "Show the arithmetic on one line and put the result after ####."),
    "t-after-final": ("after", "Reply with the working, then a final line: #### and the result."),
    "t-sys-tutor": ("system", "You help with word problems. Last line: #### then the number."),
    "t-after-short": ("after", "Keep it short and finish with #### <number>."),
    "t-after-result": ("after", "Work it out; the result goes at the end as '#### result'."),
    "t-sys-plain": ("system", "Be brief. State the sum you compute, then the number."),
}
PROMPTS.update({f"ask-{name}": "" for name in ASK} | {"ask-mix": "", "mix-ask": ""})
# `data.prompt` may also be a file holding the system prompt, or the text itself (`rlkit optimize-prompt` writes
# one); its worked turns are those `data.shots` names (e.g. `short`), none by default.
CUSTOM_PROMPTS = True
# Worked example turns placed between the system prompt and the question, per prompt variant.
SHOTS = {
    "short": [
        {"role": "user", "content": "Ana has 3 pens. Then Ana buys 4 more. How many pens does Ana have now?"},
        {"role": "assistant", "content": "3 + 4 = 7\n#### 7"},
        {"role": "user", "content": "Max has 9 cups. Then Max breaks 2. How many cups does Max have now?"},
        {"role": "assistant", "content": "9 - 2 = 7\n#### 7"},
    ],
    "alt": [
        {"role": "user", "content": "There are 12 birds on a wire and 5 fly away. How many birds are on the wire?"},
        {"role": "assistant", "content": "12 - 5 = 7\n#### 7"},
        {"role": "user", "content": "A box holds 8 red beads and 6 blue beads. How many beads are in the box?"},
        {"role": "assistant", "content": "8 + 6 = 14\n#### 14"},
    ],
}
_CALC_ANNOTATION = re.compile(r"<<[^<>]*>>")


def load(source: Any):
    from rlkit.data.sources import load_source

    return load_source(source, required=("question", "answer"))


def chat_prompt(question: str, variant: str = "default", shots: str | None = None) -> list[dict[str, str]]:
    """The system prompt (a name in ``PROMPTS``, or the text itself), the worked turns of ``shots`` (default: the
    variant's own), the question."""
    pick = zlib.crc32(question.strip().encode())
    if variant in ("mix", "mix-ask", "ask-mix"):
        pool = {"mix": FORMS, "mix-ask": FORMS + tuple(f"ask-{k}" for k in TRAIN_ASK),
                "ask-mix": tuple(f"ask-{k}" for k in ASK)}[variant]
        variant = pool[pick % len(pool)]
    asked = ASK.get(variant[4:]) or TRAIN_ASK.get(variant[4:]) if variant.startswith("ask-") else None
    if asked is not None:
        where, text = asked
        user = {"system": question.strip(), "before": f"{text}\n\n{question.strip()}",
                "after": f"{question.strip()}\n{text}"}[where]
        system = [{"role": "system", "content": text}] if where == "system" else []
        return [*system, {"role": "user", "content": user}]
    text = PROMPTS.get(variant, variant)
    system = [{"role": "system", "content": text}] if text else []
    return [*system, *SHOTS.get(variant if shots is None else shots, []), {"role": "user", "content": question.strip()}]


def solution_text(answer: str) -> str:
    """A GSM8K solution as the assistant should write it: calculator annotations removed."""
    return _CALC_ANNOTATION.sub("", answer).strip()


def gold(answer: str) -> str:
    from rlkit.rewards.math import gold_answer

    return gold_answer(answer) or ""


def sft_rows(ds, prompt: str = "default", shots: str | None = None):
    """Conversational prompt/completion rows: TRL computes the loss on the completion only."""
    return ds.map(
        lambda row: {
            "prompt": chat_prompt(row["question"], prompt, shots),
            "completion": [{"role": "assistant", "content": solution_text(row["answer"])}],
        },
        remove_columns=ds.column_names,
    )


def grpo_rows(ds, prompt: str = "default", shots: str | None = None):
    """Conversational prompts plus the gold number in ``answer`` (passed to the rewards by TRL)."""
    return ds.map(
        lambda row: {"prompt": chat_prompt(row["question"], prompt, shots), "answer": gold(row["answer"])},
        remove_columns=ds.column_names,
    )


eval_rows = grpo_rows
prompt_rows = grpo_rows  # PPO and `rlkit pairs` sample from these prompts and score against `answer`


def load_preference(source: Any):
    """A GSM8K dpo recipe trains on pairs sampled from the model (``rlkit pairs``), not on GSM8K rows."""
    from rlkit.data.preference import load as load_pairs

    return load_pairs(source)


def preference_rows(ds):
    """Pairs from GSM8K rows: the reference solution (chosen) vs the same steps with a wrong final answer.

    Real GSM8K DPO trains on pairs the model sampled itself (``rlkit pairs``); these exist so a dpo
    recipe has generated data for ``--smoke``.
    """
    from rlkit.data.preference import normalize

    def pair(row: dict[str, Any]) -> dict[str, Any]:
        right = solution_text(row["answer"])
        head, _, number = right.rpartition("####")
        wrong = f"{head}#### {_off_by_one(number.strip())}"
        return {"prompt": chat_prompt(row["question"]), "chosen": [{"role": "assistant", "content": right}],
                "rejected": [{"role": "assistant", "content": wrong}]}

    return normalize(ds.map(pair, remove_columns=ds.column_names), "gsm8k pairs")


def _off_by_one(number: str) -> str:
    try:
        return str(int(number.replace(",", "")) + 1)
    except ValueError:
        return number + "1"


def score(completions: list[str], rows) -> list[float]:
    from rlkit.rewards.math import gsm8k_correct

    return gsm8k_correct(completions, answer=list(rows["answer"]))


def episode_metrics(completion: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, float]:
    """An agent episode's answer metrics (``rlkit rollout``): GSM8K is right or wrong, so EM = accuracy."""
    correct = score([completion], {"answer": [row["answer"]]})[0]
    return {"em": correct, "accuracy": correct}


def success(metrics: dict[str, float]) -> bool:
    return metrics.get("accuracy", 0.0) == 1.0


generate = arith.generate  # seeded GSM8K-format word problems (rlkit.data.arith)


def solution_steps(answer: str) -> int:
    """Steps in a GSM8K solution: its lines before the ``#### N`` line."""
    return sum(1 for line in answer.rpartition("####")[0].splitlines() if line.strip())


def easiest(ds, n: int):
    """The ``n`` easiest rows of a GSM8K split, reproducibly: fewest solution steps (lines), then shortest
    question, then file order."""
    order = sorted(range(len(ds)), key=lambda i: (solution_steps(ds[i]["answer"]), len(ds[i]["question"]), i))
    return ds.select(order[:n])
