"""Shared by the tests that train GRPO with a tool on a scripted policy, and by those run on every shipped recipe."""

import json

import pytest
import yaml

from rlkit.recipe import shipped_recipes


def is_ppo(path) -> bool:
    return yaml.safe_load(path.read_text())["algorithm"] == "ppo"


def shipped_recipe_params() -> list:
    """Every shipped recipe as a pytest param named by its stem, the PPO ones marked ``ppo`` (tests/conftest.py
    skips them on TRL >= 1.13, which no longer ships PPOTrainer)."""
    return [pytest.param(p, id=p.stem, marks=[pytest.mark.ppo] if is_ppo(p) else []) for p in shipped_recipes()]


def script_calculator(trainer, tok, golds: dict[str, str], tool_turn: str) -> list[dict]:
    """Make ``trainer``'s generation a script: the first turn computes the gold with the calculator
    (``gold - 7 + 7``), the turn after the tool result answers it (every other completion adds one, so half
    the answers are right). ``tool_turn`` is how the chat template marks that a tool result came back.

    Returns the list each training step's completion ids, completion mask and tool mask are appended to.
    """
    turns = {"n": 0}

    def scripted(prompt_ids, images, multimodal_fields, *args, **kwargs):  # TRL 1.14 adds num_generations
        completions = []
        for ids in prompt_ids:
            text = tok.decode(ids)
            if tool_turn not in text:  # first turn: compute the answer with the tool
                gold = next(g for q, g in golds.items() if q in text)
                call = {"name": "calculate", "arguments": {"expression": f"{int(gold) - 7} + 7"}}
                reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
            else:  # second turn: every other completion copies the tool result, the rest add one
                result = text.rpartition("<tool_response>\n")[2].partition("\n</tool_response>")[0]
                turns["n"] += 1
                reply = f"#### {int(result) + turns['n'] % 2}<|im_end|>"
            completions.append(tok(reply, add_special_tokens=False)["input_ids"])
        return completions, None

    return script_and_capture(trainer, scripted)


def script_and_capture(trainer, scripted) -> list[dict]:
    """Make ``scripted`` the trainer's generation of one turn; returns the list each training step's completion
    ids, completion mask and tool mask are appended to."""
    batches: list[dict] = []
    generate_and_score = trainer._generate_and_score_completions

    def capture(inputs):
        out = generate_and_score(inputs)
        batches.append({k: out[k].clone() for k in ("completion_ids", "completion_mask", "tool_mask")})
        return out

    trainer._generate_single_turn = scripted
    trainer._generate_and_score_completions = capture
    return batches


def episodes_by_mask(tok, batches: list[dict]) -> list[tuple[str, str, str]]:
    """Each captured completion as ``(what the model wrote, what the tool mask hid, the tool's result)``:
    the text under ``tool_mask`` and the text the mask removes from the loss, decoded apart."""
    out = []
    for batch in batches:
        for ids, mask, tool in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"], strict=True):
            keep = mask.bool()
            model_text, tool_text = tok.decode(ids[keep & tool.bool()]), tok.decode(ids[keep & ~tool.bool()])
            out.append((model_text, tool_text, tool_text.partition("<tool_response>\n")[2].partition("\n</tool_response>")[0]))
    return out
