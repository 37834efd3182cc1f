"""Trajectory records: what an episode earned (rewards), answered (task metrics) and did (tools, tokens)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rlkit.agents.episodes import Episode

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def score_episodes(episodes: list[Episode], recipe: Recipe) -> list[dict[str, Any]]:
    """Trajectory records: rewards from the recipe's ``rewards:``, the task's answer metrics, env metrics."""
    from rlkit.data import get_task, success_rule
    from rlkit.envs import env_metrics
    from rlkit.rewards import RewardSet
    from rlkit.rewards.qa import final_answer

    task, succeeded = get_task(recipe.data.task), success_rule(recipe)
    rewards = RewardSet(recipe.rewards) if recipe.rewards else None
    totals: list[float | None] = [None] * len(episodes)
    per_reward: dict[str, list[float]] = {}
    if rewards is not None and episodes:
        columns = {key: [e.row.get(key) for e in episodes] for key in episodes[0].row if key != "prompt"}
        totals, per_reward = rewards([e.row["prompt"] for e in episodes], [e.completion for e in episodes], **columns)
    from rlkit.rewards.text import completion_text

    records = []
    for i, e in enumerate(episodes):
        metrics = {**task.episode_metrics(e.completion, e.row), **env_metrics(e.env), **evidence_recall(e)}
        usage = {key: sum(t[key] for t in e.turns) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
        records.append({
            "id": e.row.get("id", str(e.index)), "question_type": e.row.get("question_type"),
            "messages": e.messages, "tool_calls": e.tool_calls, "turns": e.turns, "usage": usage,
            "rounds": sum(1 for m in e.completion if m["role"] == "assistant"),
            "reward": totals[i], "rewards": {name: values[i] for name, values in per_reward.items()},
            "metrics": metrics, "success": e.error is None and succeeded(metrics), "error": e.error,
            "stopped_by": e.stopped_by, "answer": e.row.get("answer"),
            "retries": sum(t.get("retries", 0) for t in e.turns),
            "searches": getattr(e.env, "searches", None), "supporting_ids": e.row.get("supporting_ids"),
            "prediction": final_answer(completion_text(e.completion)),
        })
    return records


def evidence_recall(episode: Episode) -> dict[str, float]:
    """``{"evidence_recall": share of the row's supporting ids among the documents the episode's searches
    returned}``, matched by document id (by title for a corpus without ids); ``{}`` when either is unknown."""
    gold = set(episode.row.get("supporting_ids") or ())
    searches = getattr(episode.env, "searches", None)
    if not gold or searches is None:
        return {}
    found = {r["doc_id"] if r.get("doc_id") is not None else r.get("title") for s in searches for r in s["results"]}
    return {"evidence_recall": len(gold & found) / len(gold)}


def unpaid_successes(records: list[dict[str, Any]], recipe: Recipe) -> dict[str, int]:
    """Per reward of the recipe with a positive weight, how many successful episodes it scores 0 while it pays
    other successful ones: SFT rows built from them teach what the recipe's RL reward does not pay for (a
    ``min_tool_calls`` or a format the teacher's episodes lack), and RL then pushes the SFT model away from its
    own lesson. Penalties (negative weights) and logged-only rewards (weight 0) are not counted."""
    from rlkit.rewards import RewardSet

    if not recipe.rewards:
        return {}
    rewards = RewardSet(recipe.rewards)
    paying = [name for name, weight in zip(rewards.names, rewards.weights, strict=True) if weight > 0]
    succeeded = [r for r in records if r["success"]]
    unpaid = {}
    for name in paying:
        values = [r["rewards"].get(name) for r in succeeded]
        zeros = sum(1 for v in values if v == 0)
        if zeros and any(v is not None and v > 0 for v in values):
            unpaid[name] = zeros
    return unpaid


def sft_records(records: list[dict[str, Any]], tools: list[dict]) -> list[dict[str, Any]]:
    """SFT rows (``messages`` plus ``tools``, a JSON string as TRL reads it) from the successful trajectories
    whose every tool call succeeded: a malformed or failed call is not a behaviour to teach."""
    schema = json.dumps(tools)
    return [{"messages": r["messages"], "tools": schema} for r in records
            if r["success"] and all(call.get("error") is None for call in r["tool_calls"])]

