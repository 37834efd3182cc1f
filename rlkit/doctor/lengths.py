"""Prompt lengths of a recipe's scored rows, in tokens: the mean (a step's token count) and the longest (the width
a batch of mixed lengths is padded to, which the memory plans count)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlkit.doctor import Context


def mean_prompt_tokens(ctx: Context) -> int | None:
    """Mean prompt length in tokens over the scored rows (what a step's token count averages to), or None."""
    lengths = prompt_lengths(ctx)
    return round(sum(lengths) / len(lengths)) if lengths else None


def padded_prompt_tokens(ctx: Context) -> int | None:
    """The longest scored prompt in tokens, or None: the width a batch of mixed lengths is padded to (the plans')."""
    lengths = prompt_lengths(ctx)
    return max(lengths) if lengths else None


def prompt_lengths(ctx: Context) -> list[int] | None:
    """Each scored row's prompt length in tokens (the chat template applied, with the environment's tools as TRL
    renders them: trl/trainer/grpo_trainer.py:1792), or None; ~4 characters a token without a tokenizer."""
    from rlkit.envs import recipe_tool_schemas
    from rlkit.errors import UserError

    rows = ctx.scored_rows
    if rows is None or "prompt" not in rows.column_names or len(rows) == 0:
        return None
    try:
        tok = ctx.tokenizer
    except UserError:  # no tokenizer here: ~4 characters per token, the usual English BPE ratio
        return [round((sum(len(str(m.get("content") or "")) for m in p) if isinstance(p, list) else len(p)) / 4)
                for p in rows["prompt"]]
    tools = recipe_tool_schemas(ctx.recipe) if ctx.recipe.env is not None else None
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True, tools=tools,
                                     **ctx.recipe.model.chat_template_kwargs) if isinstance(p, list) else p
             for p in rows["prompt"]]
    return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
