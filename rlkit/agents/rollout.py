"""``rlkit rollout``: a recipe's agent on a data split, each episode appended to ``trajectories.jsonl`` as it
ends; shared with ``rlkit eval`` of an agent recipe (:mod:`rlkit.evaluate.agent`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit import jsonl, runs, safety
from rlkit.agents.endpoint import transport_failures
from rlkit.agents.engine import run_episodes
from rlkit.agents.episodes import Episode
from rlkit.agents.policies import make_policy
from rlkit.agents.scoring import score_episodes, sft_records, unpaid_successes
from rlkit.errors import UserError
from rlkit.inference.reference import model_tag, resolve_target

if TYPE_CHECKING:
    from rlkit.recipe import Recipe

log = logging.getLogger("rlkit")
TRAJECTORY_KEYS = ("id", "messages")  # what every trajectory record holds: how a file rlkit wrote is told apart


def rollout(target: str | Path, *, model: str | None = None, endpoint: str | None = None, api_key: str | None = None,
            served_model: str | None = None, concurrency: int = 8, backend: str = "hf", split: str = "eval",
            limit: int | None = None, out: str | Path | None = None, sft_out: str | Path | None = None,
            temperature: float = 0.0, max_new_tokens: int | None = None, tool_timeout: float = 30.0,
            timeout: float = 120.0, retries: int = 2, smoke: bool = False, overrides: list[str] | None = None,
            show_progress: bool = True, resume: bool = False, oracle: bool = False,
            cite: bool = False) -> dict[str, Any]:
    """Run the recipe's agent (or ``oracle``, the teacher of :mod:`rlkit.agents.oracle`, quoting the evidence it
    found before answering with ``cite``) on a split; append each
    finished episode to ``trajectories.jsonl`` (and the successful ones as SFT rows at the end).
    ``resume`` plays only the rows ``out`` does not hold yet."""
    recipe, run_dir = resolve_target(target, overrides, smoke)
    if recipe.env is None:
        raise UserError(f"{target}: the recipe has no `env:` (tool environment), so there is nothing to roll out")
    if endpoint and (model or backend != "hf"):
        raise UserError("--endpoint generates on the server; drop --model/--backend")
    if oracle and (endpoint or model or backend != "hf"):
        raise UserError("--oracle is the teacher; drop --endpoint/--model/--backend")
    if cite and not oracle:
        raise UserError("--cite is how the oracle teacher answers; add --oracle, or drop --cite")
    if sft_out is not None:
        safety.check_target(sft_out, "--sft-out")
        if Path(sft_out).exists():
            raise UserError(f"--sft-out {sft_out}: already exists; choose a new file")
    if out is not None:
        safety.check_target(out, "--out")
        if Path(out).exists() and not resume:
            raise UserError(f"--out {out}: already exists; pass --resume to continue it, or choose a new file")
        if Path(out).exists():
            safety.check_replaceable_file(out, "--out", TRAJECTORY_KEYS)
    if resume and out is None:
        raise UserError("--resume continues the trajectories file given by --out; name it")
    from rlkit.data import env_factory

    # Data and environment (its index) first: a bad split or corpus fails before a model loads.
    rows, make_env = episode_rows(recipe, split, limit), env_factory(recipe)
    if oracle:
        from rlkit.agents.oracle import OraclePolicy, oracle_gold

        policy, label = OraclePolicy(oracle_gold(recipe, split, limit, cite=cite)), "oracle"
    else:
        policy, label = make_policy(recipe, run_dir, model=model, endpoint=endpoint, api_key=api_key,
                                    served_model=served_model, backend=backend, temperature=temperature,
                                    max_new_tokens=max_new_tokens, timeout=timeout, retries=retries)
    path = Path(out) if out else _free_path(_default_dir(recipe.name, run_dir, label) / "trajectories.jsonl")
    with safety.hold(path):
        with safety.JsonlAppender(path, resume=resume, keys=TRAJECTORY_KEYS) as sink:
            play(recipe, rows, make_env, policy, tool_timeout, concurrency, show_progress, sink)
        records = in_row_order(path, rows)
    result: dict[str, Any] = {"path": str(path), "episodes": len(records),
                              "successes": sum(r["success"] for r in records),
                              "transport_failures": transport_failures(records),
                              "unpaid": unpaid_successes(records, recipe)}
    if sft_out is not None:
        from rlkit.envs import tool_schemas

        sft_rows = sft_records(records, tool_schemas(make_env()))
        runs.write_jsonl(sft_rows, sft_out)
        result.update(sft_path=str(sft_out), sft_rows=len(sft_rows))
    return result


def episode_rows(recipe: Recipe, split: str, limit: int | None) -> list[dict[str, Any]]:
    """The split's rows as episodes start from them (prompts as the recipe frames them), the first ``limit``."""
    from rlkit.data import load_rows, task_rows

    source = recipe.data.eval if split == "eval" else recipe.data.train
    if source is None:
        raise UserError(f"the recipe has no data.{split} split")
    if limit:
        source = source.model_copy(update={"limit": limit})
    return task_rows(recipe, "eval", load_rows(recipe.data.task, source)).to_list()


def play(recipe: Recipe, rows: list[dict[str, Any]], make_env: Callable[[], Any], policy: Any, tool_timeout: float,
         concurrency: int, show_progress: bool, sink: Any) -> None:
    """Play the rows whose record ``sink`` does not hold yet; write each record the moment its episode ends."""
    done = {str(r.get("id")) for r in sink.done}
    todo = [(i, row) for i, row in enumerate(rows) if str(row.get("id", i)) not in done]
    if sink.done:
        log.info("%s: %d episodes already written; playing the other %d", sink.path, len(sink.done), len(todo))

    def write(episode: Episode) -> None:
        record = score_episodes([episode], recipe)[0]
        record["id"] = episode.row.get("id", str(todo[episode.index][0]))  # or the row's place in the whole split
        if not sink.written:  # the path a killed run's --resume needs
            log.info("writing trajectories to %s as episodes finish", sink.path)
        sink.write(record)

    run_episodes([row for _, row in todo], make_env, policy, max_turns=recipe.env.max_turns, tool_timeout=tool_timeout,
                 concurrency=concurrency, show_progress=show_progress, on_done=write)


def in_row_order(path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite a finished trajectories file (written as episodes ended) in the split's row order."""
    place = {str(row.get("id", i)): i for i, row in enumerate(rows)}
    records = sorted(jsonl.read_records(path), key=lambda r: place.get(str(r.get("id")), len(place)))
    runs.write_jsonl(records, path)
    return records


def _free_path(path: Path) -> Path:
    """``path``, or ``stem-2.jsonl``, ``stem-3.jsonl``...: a later rollout never overwrites an earlier one."""
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def _default_dir(name: str, run_dir: Path | None, label: str) -> Path:
    return (run_dir / "rollouts" if run_dir else Path("rollouts") / name) / model_tag(label)


def print_summary(result: dict[str, Any]) -> bool:
    """The trajectories' analysis and where they are; False when most episodes failed on endpoint errors (the
    numbers then say nothing of the model), after saying so on stderr."""
    import sys

    from rich.console import Console

    from rlkit.analyze import analyze, render

    console = Console()
    render(analyze(result["path"]), console)
    console.print(f"{result['episodes']} episodes, {result['successes']} successful: {result['path']}")
    if "sft_path" in result:
        console.print(f"{result['sft_rows']} successful trajectories as SFT rows: {result['sft_path']}")
    for name, n in result.get("unpaid", {}).items():
        print(f"rlkit: warning: {n} of {result['successes']} successful episodes earn 0 from the reward {name}, "
              "which pays the other successes: SFT on them teaches what the recipe's RL stage does not pay for "
              "(compare the reward's args, such as min_tool_calls, with those episodes)", file=sys.stderr)
    failed = sum(result["transport_failures"].values())
    if failed * 2 <= result["episodes"]:
        return True
    kinds = ", ".join(f"{kind}: {n}" for kind, n in result["transport_failures"].items())
    print(f"rlkit: {failed} of {result['episodes']} episodes failed on endpoint errors ({kinds}); "
          f"trajectories kept in {result['path']}", file=sys.stderr)
    return False
