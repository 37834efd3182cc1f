"""Does SmolLM2-135M-Instruct (the demos' model) compare two numbers or two dates written right before its Yes/No?

Half of `make demo-search`'s questions ask for such a comparison ("did X report higher revenue growth than Y?", "was
X's report published before Y's?"), and the search agent answers them at chance (docs/demos.md). This asks the base
model the comparison with nothing to search: 100 random pairs per form, the same seed every run, and reads the
logits of "Yes" against "No" where the answer starts. A model that compares says "Yes" about as often as the truth
is "Yes" and is right far above 50; `best cut` is the accuracy of the best threshold on the Yes - No margin, fitted
on the same 100: whether the margin carries the comparison at all (a margin that knows nothing scores 57 on average
and 63 at the 95th percentile, simulated).

    .venv/bin/python bench/compare_probe.py [MODEL_DIR]       # default: the demos' SmolLM2 build; ~2 min on 2 cores
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

MONTHS = ["September", "October", "November", "December"]


def pairs(seed: int = 0, n: int = 100):
    """(form, user text, text the answer starts with, truth) for n pairs of each form."""
    from rlkit.data.multihop_rag import PROMPTS

    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.sample(range(2, 61), 2)  # the synthetic corpus's growth range
        facts = f"Alpha Labs reported revenue up {a}%. Beta Systems reported revenue up {b}%."
        yield "numbers alone", None, f"Is {a} greater than {b}? Answer Yes or No.", "", a > b
        yield "growth, both stated", None, f"{facts} Did Alpha Labs report higher revenue growth than Beta " \
            "Systems? Answer Yes or No.", "", a > b
        yield "growth, agent's prompt", PROMPTS["default"], f"{facts} Did Alpha Labs report higher revenue " \
            "growth than Beta Systems?", "<answer>", a > b
        (m1, d1), (m2, d2) = rng.sample([(m, d) for m in range(4) for d in range(1, 29)], 2)
        yield "dates, both stated", None, f"Report A was published on {MONTHS[m1]} {d1}, 2023. Report B was " \
            f"published on {MONTHS[m2]} {d2}, 2023. Was report A published before report B? Answer Yes or No.", \
            "", (m1, d1) < (m2, d2)


def main(model_dir: str | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.smollm2 import smollm2_path

    if model_dir and not any((Path(model_dir) / name).is_file() for name in ("config.json", "adapter_config.json")):
        print(f"compare_probe: {model_dir} holds no model (config.json) or PEFT adapter (adapter_config.json)",
              file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(2)
    path = model_dir or str(smollm2_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yes, no = tok.encode("Yes")[0], tok.encode("No")[0]
    margins: dict[str, list[tuple[float, bool]]] = {}
    for form, system, user, start, truth in pairs():
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + start
        with torch.no_grad():
            logits = model(tok(text, return_tensors="pt").input_ids).logits[0, -1]
        margins.setdefault(form, []).append(((logits[yes] - logits[no]).item(), truth))
    print(f"{'form':24} {'right':>6} {'says Yes':>9} {'gold Yes':>9} {'best cut':>9}")
    for form, rows in margins.items():
        right = sum((m > 0) == t for m, t in rows)
        best = max(sum((m > cut) == t for m, t in rows) for cut in [m for m, _ in rows] + [float("-inf")])
        print(f"{form:24} {right:>6} {sum(m > 0 for m, _ in rows):>9} {sum(t for _, t in rows):>9} {best:>9}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
