"""One assistant turn as a policy produced it, and one episode: a question's conversation with its tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One assistant turn as a policy produced it."""

    message: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # stop | tool_calls | length | error
    seconds: float = 0.0
    error: str | None = None
    retries: int = 0  # transient failures retried before this turn's answer (endpoints)


@dataclass
class Episode:
    """One question's conversation with the environment, turn by turn."""

    index: int
    row: dict[str, Any]
    env: Any
    messages: list[dict[str, Any]]
    prompt_length: int
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    done: bool = False
    stopped_by: str | None = None  # "max_turns" when the turn limit ended the episode
    first_turn: int = 0  # tool rounds count from this turn (a chat resets it at each user message)

    @property
    def completion(self) -> list[dict[str, Any]]:
        """The trajectory after the prompt: assistant turns and tool results (what rewards read)."""
        return self.messages[self.prompt_length:]

    def take(self, turn: Turn, *, max_turns: int, tool_timeout: float | None) -> None:
        """Record ``turn``; run its tool calls unless the turn limit is reached; decide whether the episode ends."""
        from rlkit.envs import call_tool

        usage = {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                 "total_tokens": turn.prompt_tokens + turn.completion_tokens,
                 "finish_reason": turn.finish_reason, "seconds": round(turn.seconds, 4), "retries": turn.retries}
        self.turns.append(usage)
        if turn.error is not None:
            self.error, self.done = turn.error, True
            return
        self.messages.append(turn.message)
        calls = turn.message.get("tool_calls") or []
        if not calls:
            self.done = True
            return
        tool_rounds = sum(1 for t in self.turns[self.first_turn:-1] if t["finish_reason"] == "tool_calls")
        if tool_rounds >= max_turns:
            self.done, self.stopped_by = True, "max_turns"
            return
        for i, call in enumerate(calls):
            function = call.get("function", {})
            name, arguments = function.get("name", ""), function.get("arguments", {})
            result = call_tool(self.env, name, arguments, timeout=_backstop(self.env, tool_timeout))
            call_id = call.get("id") or f"call_{len(self.turns)}_{i}"
            call["id"] = call_id
            self.messages.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": result.content})
            self.tool_calls.append({"turn": len(self.turns), "name": name, "arguments": result.arguments,
                                    "content": result.content, "error": result.error,
                                    "seconds": round(result.seconds, 4)})
            if result.timed_out:  # the call may still be running inside this env: the episode cannot go on
                self.error, self.done = f"tool timeout: {name} {result.error}", True
                return


def _backstop(env: Any, tool_timeout: float | None) -> float | None:
    """An environment that bounds its own calls (``call_timeout``: MCP) reports its timeouts as tool text and
    stays usable; rlkit's own timeout then only backs it up, later."""
    own = getattr(env, "call_timeout", None)
    return tool_timeout if own is None or tool_timeout is None else max(tool_timeout, own + 5.0)


def describe(error: Exception) -> str:
    """An error in one line, secrets masked: `APIConnectionError: Connection refused`."""
    from rlkit.secrets import redact

    text = redact(str(error).strip().splitlines()[0]) if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
