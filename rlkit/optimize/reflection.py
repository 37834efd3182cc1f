"""gepa's reflection model: an OpenAI-compatible endpoint, asked through the judge's client
(:mod:`rlkit.rewards.judge_client`: a total deadline per request, retries with backoff, the key from an
environment variable and never written anywhere), so rlkit needs neither ``gepa[full]`` nor litellm.

gepa calls ``reflection(prompt) -> text`` and, when the call raises, logs it and goes on to its next iteration.
rlkit wants a failing endpoint to stop the run instead: the first request that fails for good (after its
retries, or at once for a wrong model, URL or key) is kept in :attr:`Reflection.error`, every later call fails
without a request, and :meth:`Reflection.stop` (a gepa stopper) ends the optimisation; the command then
reports the error in one line and writes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from rlkit.errors import UserError
from rlkit.rewards.judge_client import Malformed, Settings, Stats, ask

KEY_ENV = "OPENAI_API_KEY"  # unset is fine (a local vLLM server takes any key); another variable named must be set
HINT = "start the server or fix --reflection-endpoint / --reflection-model"


class ReflectionFailed(Exception):
    """The reflection endpoint failed for good (gepa logs it; :meth:`Reflection.stop` then ends the run)."""


def settings(endpoint: str, model: str, *, api_key_env: str | None, temperature: float, max_tokens: int,
             timeout: float, retries: int) -> Settings:
    return Settings(endpoint=endpoint, model=model, api_key_env=api_key_env or KEY_ENV, concurrency=1,
                    timeout=timeout, max_retries=retries, max_tokens=max_tokens, cache=False,
                    temperature=temperature, role="reflection model", hint=HINT, default_key_env=KEY_ENV)


class Reflection:
    """``reflection(prompt) -> text`` for gepa, with what it cost (calls, requests, retries, tokens, seconds)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.calls = 0  # proposals the endpoint answered
        self.cost = Stats()
        self.seconds = 0.0
        self.error: str | None = None

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        if self.error is not None:
            raise ReflectionFailed(self.error)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        started = time.perf_counter()
        try:
            (text,), stats = ask(self.settings, [("", messages, _proposal)])
        except UserError as e:  # a wrong model, URL path or key: every request would fail alike
            self.error = str(e)
            raise ReflectionFailed(self.error) from None
        finally:
            self.seconds += time.perf_counter() - started
        for name in ("requests", "retries", "failures", "prompt_tokens", "completion_tokens"):
            setattr(self.cost, name, getattr(self.cost, name) + getattr(stats, name))
        if text is None:
            s = self.settings
            self.error = (f"{s.role} {s.endpoint} (model {s.model!r}) failed after {stats.retries} retries (last: "
                          f"{stats.last_error})")
            raise ReflectionFailed(self.error)
        self.calls += 1
        return text

    def stop(self, state: Any) -> bool:
        """gepa's ``StopperProtocol``: stop once the endpoint has failed for good."""
        return self.error is not None

    def metrics(self) -> dict[str, Any]:
        return {"reflection_calls": self.calls, "reflection_requests": self.cost.requests,
                "reflection_retries": self.cost.retries, "reflection_prompt_tokens": self.cost.prompt_tokens,
                "reflection_completion_tokens": self.cost.completion_tokens,
                "reflection_seconds": round(self.seconds, 2)}


def _proposal(text: str) -> str:
    """A reply from which gepa's own parser gets a non-empty prompt (the text between its first and last ```
    fence, or the whole reply); an empty one is malformed and asked again."""
    from gepa.strategies.instruction_proposal import InstructionProposalSignature

    if not InstructionProposalSignature.output_extractor(text.strip())["new_instruction"].strip():
        raise Malformed("no new prompt in the reply")
    return text
