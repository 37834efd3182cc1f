"""An OpenAI-compatible chat-completions endpoint as an agent policy, through the ``openai`` client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from rlkit.agents.episodes import Turn, describe
from rlkit.errors import UserError


class EndpointPolicy:
    """An OpenAI-compatible chat-completions endpoint, through the ``openai`` client.

    Every request has a total deadline of ``timeout`` seconds (``asyncio.wait_for``: the client's own
    timeout bounds each read, so a server that trickles bytes would otherwise hold a request forever).
    Transient failures (connection errors, the deadline, 429, 5xx) are retried up to ``max_retries``
    times with exponential backoff, and each turn records how many retries it took.
    """

    concurrent = True

    def __init__(self, endpoint: str, *, api_key: str | None, served_model: str | None, max_new_tokens: int,
                 temperature: float = 0.0, timeout: float = 120.0, max_retries: int = 2,
                 backoff: float = 0.5) -> None:
        self.endpoint, self.served_model, self.api_key = endpoint, served_model, api_key or "EMPTY"
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.client = self._client()

    def _client(self) -> Any:
        import openai

        # Retries are rlkit's (counted, recorded) and the deadline is rlkit's `wait_for`; the client's own
        # per-read timeout only backs it up, a little later, so the total deadline is what a user sees.
        return openai.AsyncOpenAI(base_url=self.endpoint, api_key=self.api_key, timeout=self.timeout + 5,
                                  max_retries=0)

    def preflight(self) -> str:
        """One tiny request before any episode: a dead endpoint, a wrong model or a bad key is a UserError here,
        whatever flags were given, instead of N failed episodes. Returns the served model's name."""
        return asyncio.run(self._preflight())

    async def _preflight(self) -> str:
        # Its own client: an httpx pool must not outlive the event loop it was made in.
        client, self.client = self.client, self._client()
        try:
            name = await self.model_name()
            messages = [{"role": "user", "content": PREFLIGHT_PROMPT}]
            response, error, _ = await self._request(lambda: self.client.chat.completions.create(
                model=name, messages=messages, max_completion_tokens=1, temperature=0.0))
        finally:
            await self.client.close()
            self.client = client
        if error is not None:
            raise UserError(f"--endpoint {self.endpoint}: the preflight request to model {name!r} failed "
                            f"({describe(error)}); check the URL and that the server is up") from None
        return name

    async def model_name(self) -> str:
        """The served model: ``--served-model``, or the endpoint's only model."""
        if self.served_model is None:
            response, error, _ = await self._request(self._list_models)
            if error is not None:
                raise UserError(f"--endpoint {self.endpoint}: cannot list models ({describe(error)}); "
                                "check the URL, or pass --served-model")
            if len(response) != 1:
                raise UserError(f"--endpoint {self.endpoint} serves {len(response)} models "
                                f"({', '.join(response[:5]) or 'none'}); pick one with --served-model")
            self.served_model = response[0]
        return self.served_model

    async def _list_models(self) -> list[str]:
        return [m.id async for m in self.client.models.list()]

    async def _request(self, make: Callable[[], Any]) -> tuple[Any, Exception | None, int]:
        """``(response, None, retries)`` or ``(None, error, retries)``; misconfiguration raises a UserError."""
        import openai

        retries = 0
        while True:
            try:
                return await asyncio.wait_for(make(), self.timeout), None, retries
            except _fatal_errors() as e:  # every request would fail the same way: stop, don't record N failures
                raise UserError(f"--endpoint {self.endpoint}: {describe(e)}; check --api-key, --served-model and "
                                "that the server accepts tools") from None
            except TimeoutError:
                error: Exception = DeadlineExceeded(f"no complete response within {self.timeout:g}s")
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as e:
                error = e
            except openai.OpenAIError as e:  # e.g. 422: this request is wrong, another may not be
                return None, e, retries
            if retries >= self.max_retries:
                return None, error, retries
            retries += 1
            await asyncio.sleep(min(self.backoff * 2 ** (retries - 1), 8.0))

    async def agenerate(self, messages: list[dict[str, Any]], tools: list[dict]) -> Turn:
        started = time.time()
        model = await self.model_name()
        response, error, retries = await self._request(lambda: self.client.chat.completions.create(
            model=model, messages=[_openai_message(m) for m in messages], tools=tools or None,
            max_completion_tokens=self.max_new_tokens, temperature=self.temperature))
        seconds = time.time() - started
        if error is not None:
            return Turn({}, finish_reason="error", seconds=seconds, error=f"endpoint error: {describe(error)}",
                        retries=retries)
        if not response.choices:
            return Turn({}, finish_reason="error", seconds=seconds, error="endpoint error: no choices in the response",
                        retries=retries)
        choice = response.choices[0]
        message: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
        # vLLM >= 0.11 and OpenRouter say `reasoning`; older vLLM and DeepSeek `reasoning_content`.
        reasoning = getattr(choice.message, "reasoning", None) or getattr(choice.message, "reasoning_content", None)
        if reasoning:
            message["reasoning_content"] = reasoning
        if choice.message.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                for c in choice.message.tool_calls]
        usage = response.usage
        finish = "tool_calls" if message.get("tool_calls") else (choice.finish_reason or "stop")
        return Turn(message, prompt_tokens=usage.prompt_tokens if usage else 0,
                    completion_tokens=usage.completion_tokens if usage else 0, finish_reason=finish, seconds=seconds,
                    retries=retries)


PREFLIGHT_PROMPT = "Reply with the word OK."


class DeadlineExceeded(Exception):
    """A request that did not complete within the policy's total deadline."""


def transport_failures(records: list[dict[str, Any]]) -> dict[str, int]:
    """Episodes that ended on an endpoint error, by error type (``APIConnectionError``: 3, ...)."""
    import collections

    kinds = (r["error"].removeprefix("endpoint error: ").partition(":")[0] for r in records
             if (r.get("error") or "").startswith("endpoint error: "))
    return dict(collections.Counter(kinds).most_common())


def _fatal_errors() -> tuple[type[Exception], ...]:
    import openai

    return (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError, openai.BadRequestError)


def _arguments(raw: str | None) -> dict[str, Any] | str:
    """Tool-call arguments as a dict; a string that is not a JSON object stays a string (the tool call fails)."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return raw or ""
    return value if isinstance(value, dict) else raw or ""


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """rlkit's chat message (transformers' form) as the chat-completions API wants it."""
    out = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id") or f"call_{i}", "type": "function",
             "function": {"name": c["function"]["name"],
                          "arguments": c["function"]["arguments"] if isinstance(c["function"]["arguments"], str)
                          else json.dumps(c["function"]["arguments"])}}
            for i, c in enumerate(message["tool_calls"])]
    if message["role"] == "tool":
        out["tool_call_id"] = message.get("tool_call_id", "")
    return out
