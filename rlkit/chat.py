"""``rlkit chat``: talk to a trained model in the terminal, its tool calls and results shown as they happen.

The model, the environment and the system prompt come from a run directory's resolved recipe (or
``--recipe`` for a bare model); ``--env`` picks or overrides the environment. Turns go through the
same :class:`rlkit.agents.episodes.Episode` as rollouts, so the tools behave exactly as in training.
Type ``/reset`` to start over, ``/exit`` (or Ctrl-D) to leave.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.agents.episodes import Episode
from rlkit.errors import UserError

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def chat(target: str, *, env: str | None = None, recipe_path: Path | None = None, max_new_tokens: int = 512,
         temperature: float = 0.0, read=input) -> None:
    from rich.console import Console

    from rlkit.agents.hf import HFPolicy
    from rlkit.inference.load import load_for_generation

    recipe, run_dir, model = _resolve(target, recipe_path, env)
    make_env = _env_factory(recipe, env)
    lm, tokenizer, label = load_for_generation(recipe, run_dir, model)
    policy = HFPolicy(lm, tokenizer, chat_template_kwargs=recipe.model.chat_template_kwargs,
                      max_new_tokens=max_new_tokens, temperature=temperature, batch_size=1)
    system = _system_prompt(recipe)
    console = Console()
    console.print(f"[bold]rlkit chat[/] — {label}" + (f", tools: {recipe.env.name}" if make_env else "")
                  + "  (/reset, /exit)")
    episode = _new_episode(make_env, system)
    while True:
        try:
            text = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            break
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            episode = _new_episode(make_env, system)
            console.print("[dim](new conversation)[/]")
            continue
        if not text:
            continue
        episode.messages.append({"role": "user", "content": text})
        episode.done, episode.error, episode.stopped_by = False, None, None
        episode.first_turn = len(episode.turns)
        tools = _tools(episode.env)
        max_turns = recipe.env.max_turns if make_env else 0
        while not episode.done:
            seen = len(episode.messages)
            episode.take(policy.generate([episode.messages], tools)[0], max_turns=max_turns, tool_timeout=30.0)
            show_messages(console, episode.messages[seen:])
        if episode.error:
            console.print(f"[red]error:[/] {shown(episode.error)}")
        elif episode.stopped_by:
            console.print(f"[yellow](stopped after {max_turns} tool rounds)[/]")


def _resolve(target: str, recipe_path: Path | None, env: str | None) -> tuple[Recipe, Path | None, str | None]:
    """(recipe, run dir, model reference for :func:`rlkit.inference.load.load_for_generation`)."""
    from rlkit import runs
    from rlkit.inference.reference import resolve_target

    path = Path(target)
    if runs.is_run_dir(path) and recipe_path is None:
        recipe, run_dir = resolve_target(path)
        return recipe, run_dir, None
    if recipe_path is not None:
        recipe, _ = resolve_target(recipe_path)
        return recipe, None, target
    from rlkit.recipe import validate

    recipe = validate({"name": "chat", "algorithm": "sft", "model": {"name_or_path": target},
                       "data": {"task": "sft", "train": {"synthetic": 1}}}, source="rlkit chat")
    if env == "retrieval":
        raise UserError("--env retrieval needs a corpus: pass --recipe RECIPE with a `retrieval:` section")
    return recipe, None, None


def _env_factory(recipe: Recipe, env: str | None):
    from rlkit.data import env_factory
    from rlkit.envs import env_class
    from rlkit.recipe import EnvSpec

    if env is not None and (recipe.env is None or recipe.env.name != env):
        env_class(env)  # unknown names fail here, with the valid ones listed
        if env == "mcp":
            raise UserError("--env mcp needs a server: pass --recipe RECIPE with `env: {name: mcp, server: ...}`")
        recipe.env = EnvSpec(name=env, max_turns=recipe.env.max_turns if recipe.env else 6)
    return env_factory(recipe) if recipe.env is not None else None


def _system_prompt(recipe: Recipe) -> str | None:
    from rlkit.data import get_task

    prompts = getattr(get_task(recipe.data.task), "PROMPTS", None)
    return prompts.get(recipe.data.prompt) if prompts else None


def _new_episode(make_env: Any, system: str | None) -> Episode:
    env = make_env() if make_env else None
    if env is not None:
        env.reset()
    messages = [{"role": "system", "content": system}] if system else []
    return Episode(0, {}, env, messages, prompt_length=len(messages))


def _tools(env: Any) -> list[dict]:
    from rlkit.envs import tool_schemas

    return tool_schemas(env) if env is not None else []


def shown(text: Any) -> str:
    """Text from a model or a tool, safe to print: rich markup escaped, and control characters (ANSI escape
    sequences that could recolour, move the cursor or retitle the terminal) written as visible ``\\x1b``."""
    from rich.markup import escape

    return escape(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text)))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def show_messages(console: Any, messages: list[dict[str, Any]]) -> None:
    """A turn's new messages: reasoning dimmed, the answer, each tool call and its (shortened) result."""
    for message in messages:
        if message["role"] == "assistant":
            if message.get("reasoning_content"):
                console.print(f"[dim]{shown(message['reasoning_content'].strip())}[/]")
            if message.get("content"):
                console.print(f"[bold cyan]model>[/] {shown(message['content'].strip())}")
            for call in message.get("tool_calls") or []:
                fn = call.get("function", {})
                console.print(f"[magenta]→ {shown(fn.get('name', '?'))}[/]"
                              f"({shown(json.dumps(fn.get('arguments'), ensure_ascii=False))})")
        elif message["role"] == "tool":
            content = message["content"]
            short = content if len(content) <= 600 else content[:600] + " …"
            console.print(f"[green]← {shown(message.get('name', 'tool'))}:[/] {shown(short)}")
