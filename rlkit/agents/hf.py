"""A local transformers model as an agent policy; the live episodes' next turns in batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlkit.agents.episodes import Turn
from rlkit.agents.turns import parsed_turn, require_response_parser, training_template, until_stop
from rlkit.inference.generate import TurnCache, generate_ids, render, stop_ids, tokenize


class HFPolicy:
    """A local transformers model; generates the next turn of many episodes in one batch. On CPU, episodes play in
    waves of ``batch_size`` (``wave``), each episode's KV cache kept from turn to turn (:class:`TurnCache`): a turn
    reads only the reply and tool result that grew its conversation, and the kept caches are one batch's. On a
    GPU (measured only on CPU) every live episode's turn is batched and read whole, as before."""

    concurrent = False

    def __init__(self, model: Any, tokenizer: Any, *, chat_template_kwargs: dict[str, Any], max_new_tokens: int,
                 temperature: float = 0.0, batch_size: int = 32) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.kwargs, self.max_new_tokens = chat_template_kwargs, max_new_tokens
        self.temperature, self.batch_size = temperature, batch_size
        require_response_parser(tokenizer)
        self.template = training_template(tokenizer)
        cpu = next(model.parameters()).device.type == "cpu"
        self.wave, self.turns = (batch_size, TurnCache()) if cpu else (None, None)

    def generate(self, conversations: Sequence[list[dict[str, Any]]], tools: list[dict]) -> list[Turn]:
        tok = self.tokenizer
        prompts = tokenize(tok, render(tok, conversations, self.kwargs, tools=tools, template=self.template))
        generations = generate_ids(self.model, tok, prompts, max_new_tokens=self.max_new_tokens,
                                   batch_size=self.batch_size, temperature=self.temperature,
                                   turn_cache=self.turns)
        stops = stop_ids(self.model, tok)
        return [parsed_turn(tok, until_stop(g.ids, stops), g.prompt_ids, g.cut, g.seconds) for g in generations]
