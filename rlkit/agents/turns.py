"""Generated tokens as an assistant turn, tool calls parsed the way TRL parses them; context budgets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlkit.agents.episodes import Turn
from rlkit.compat import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
)
from rlkit.errors import UserError
from rlkit.inference.generate import render, tokenize


def require_response_parser(tokenizer: Any) -> None:
    """Give the tokenizer TRL's response parser for its chat template (how tool calls are read from text)."""
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return
    try:
        add_response_schema(tokenizer)
    except ValueError:
        raise UserError("the model's chat template is not one TRL can parse tool calls from; set "
                        "`tokenizer.response_template` in the model's tokenizer_config (see transformers' "
                        "chat response parsing docs)") from None


def training_template(tokenizer: Any) -> str | None:
    """The chat template TRL trains tool episodes with: the model's own if it keeps earlier turns verbatim,
    else TRL's prefix-preserving variant (Qwen3's stock template drops earlier ``<think>`` blocks). Rollouts
    render with it so a policy is evaluated on the context it was trained on."""
    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


def parsed_turn(tokenizer: Any, ids: list[int], prompt_ids: list[int], cut: bool, seconds: float) -> Turn:
    """A generated token sequence as an assistant message, tool calls parsed the way TRL parses them; ``cut``: the
    generator says its token limit ended it (hf ``Generation.cut``, vLLM's ``finish_reason`` "length", which also
    covers a turn given fewer tokens because the context was nearly full)."""
    message = parse_response(tokenizer, ids, prefix=prompt_ids) if ids else {"role": "assistant", "content": ""}
    message = {k: v for k, v in message.items() if v is not None}
    message["role"] = "assistant"
    finish = "tool_calls" if message.get("tool_calls") else "length" if cut else "stop"
    return Turn(message, prompt_tokens=len(prompt_ids), completion_tokens=len(ids), finish_reason=finish,
                seconds=seconds)


def until_stop(ids: list[int], stops: set[int]) -> list[int]:
    """The tokens up to and including the first stop token (what follows is the batch's padding)."""
    return next((ids[:i + 1] for i, t in enumerate(ids) if t in stops), ids)


def prompt_lengths(tokenizer: Any, conversations: Sequence[list[dict[str, Any]]], tools: list[dict],
                   template: str | None, kwargs: dict[str, Any]) -> list[int]:
    """Tokens of each conversation as the policy prompts it (chat template, tools, generation prompt)."""
    return [len(ids) for ids in tokenize(tokenizer, render(tokenizer, conversations, kwargs, tools=tools,
                                                           template=template))]


def completion_budgets(lengths: Sequence[int], max_model_len: int, max_new_tokens: int) -> list[int | None]:
    """Per prompt, the tokens it may generate inside the context, or None where none fit.

    vLLM refuses a prompt as long as its context with an exception that would end every episode of the
    batch; a multi-turn episode grows until it gets there, so that episode alone ends, with an error.
    """
    return [min(max_new_tokens, max_model_len - n) if n < max_model_len else None for n in lengths]


def overflow_turn(prompt_tokens: int, max_model_len: int) -> Turn:
    """The turn of an episode whose conversation no longer fits the model's context: it ends, with an error."""
    return Turn({}, prompt_tokens=prompt_tokens, finish_reason="length",
                error=f"context overflow: the conversation has {prompt_tokens} tokens, the model's context "
                      f"{max_model_len} (model.max_seq_length)")

