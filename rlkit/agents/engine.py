"""The engine: episodes run to their end against a policy, batched or concurrent."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from rlkit.agents.episodes import Episode, describe
from rlkit.errors import UserError

log = logging.getLogger("rlkit")


def run_episodes(rows: Sequence[dict[str, Any]], make_env: Callable[[], Any], policy: Any, *, max_turns: int,
                 tool_timeout: float | None = 30.0, concurrency: int = 8, show_progress: bool = True,
                 on_done: Callable[[Episode], None] | None = None) -> list[Episode]:
    """Run one episode per row to the end; returns them in row order. ``on_done(episode)`` sees each one
    as it finishes (to write it at once)."""
    on_done = on_done or (lambda episode: None)
    from rlkit import progress
    from rlkit.envs import tool_schemas

    episodes = []
    for i, row in enumerate(rows):
        env = make_env()
        appended = env.reset(**row)
        messages = [dict(m) for m in row["prompt"]]
        if appended:  # TRL's contract: text from reset() is appended to the last user message
            messages[-1]["content"] = f"{messages[-1]['content']}\n\n{appended}"
        episodes.append(Episode(i, row, env, messages, prompt_length=len(messages)))
    if not episodes:
        return episodes
    tools = tool_schemas(episodes[0].env)
    with progress.bar("rollouts", len(episodes), show=show_progress) as advance:
        if policy.concurrent:
            asyncio.run(_run_concurrent(episodes, policy, tools, max_turns, tool_timeout, concurrency, advance,
                                        on_done))
        else:
            wave = getattr(policy, "wave", None) or len(episodes)  # episodes played together, turn by turn
            for first in range(0, len(episodes), wave):
                while live := [e for e in episodes[first:first + wave] if not e.done]:
                    for episode, turn in zip(live, policy.generate([e.messages for e in live], tools), strict=True):
                        episode.take(turn, max_turns=max_turns, tool_timeout=tool_timeout)
                        if episode.done:
                            on_done(episode)
                            advance()
    return episodes


async def _run_concurrent(episodes: list[Episode], policy: Any, tools: list[dict], max_turns: int,
                          tool_timeout: float | None, concurrency: int, advance: Callable[[], None],
                          on_done: Callable[[Episode], None]) -> None:
    await policy.model_name()  # fail once, clearly, before any episode runs
    limit = asyncio.Semaphore(concurrency)

    async def play(episode: Episode) -> None:
        try:
            while not episode.done:
                async with limit:
                    turn = await policy.agenerate(episode.messages, tools)
                # Tools may block (a search on a large index); keep the event loop serving other episodes.
                await asyncio.to_thread(episode.take, turn, max_turns=max_turns, tool_timeout=tool_timeout)
        except UserError:
            raise
        except Exception as e:  # one malformed response must not cost the other episodes
            log.exception("episode %d failed", episode.index)
            episode.error, episode.done = f"rollout error: {describe(e)}", True
        on_done(episode)
        advance()

    await asyncio.gather(*(play(e) for e in episodes))
