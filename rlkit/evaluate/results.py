"""Where an eval writes: the results JSON (default ``RUN/eval/<model>.json``) and the JSONL journal next to it
that each finished example or trajectory is appended to."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlkit import safety
from rlkit.inference.reference import model_tag

log = logging.getLogger("rlkit")


@contextmanager
def journal(results: Path, suffix: str, resume: bool, keys: tuple[str, ...]) -> Iterator[Any]:
    """The JSONL file next to ``results`` that an eval appends each finished record to.

    Without ``resume`` an earlier one is replaced, and only if rlkit wrote it.
    """
    path = results.with_suffix(suffix)
    safety.check_target(path, "--out")
    if results.exists():
        safety.check_replaceable_file(results, "--out", ("recipe", "model"))
    if path.exists() and not resume:
        safety.check_replaceable_file(path, "--out", keys)
        path.unlink()
    with safety.JsonlAppender(path, resume=resume, keys=keys) as sink:
        if sink.done:
            log.info("%s: %d records already written; continuing after them", path, len(sink.done))
        yield sink


def write_results(results: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write ``results`` to ``path`` (replacing only a results file rlkit wrote); ``results["path"]`` says where."""
    safety.check_target(path, "--out")
    if path.exists():
        safety.check_replaceable_file(path, "--out", ("recipe", "model"))
    safety.make_parent(path, "eval")
    safety.write_text(path, safety.dumps(results, indent=2))
    results["path"] = str(path)
    return results


def default_out(name: str, run_dir: Path | None, label: str) -> Path:
    """``RUN/eval/<model>.json`` for a run, ``evals/<recipe>/<model>.json`` for a recipe."""
    return (run_dir / "eval" if run_dir else Path("evals") / name) / f"{model_tag(label)}.json"


def per_problem(results: dict[str, Any]) -> list[float]:
    """Each problem's score in row order: an example's ``correct`` (a task eval) or an episode's accuracy
    (an agent eval's trajectories, which it rewrote in row order; an episode without one scores 0)."""
    from rlkit import jsonl

    if "examples" in results:
        return [float(e["correct"]) for e in results["examples"]]
    return [float((r.get("metrics") or {}).get("accuracy") or 0.0)
            for r in jsonl.read_records(Path(results["trajectories"]))]


def problems(results: dict[str, Any]) -> list[Any]:
    """What each score in :func:`per_problem` was for, in the same order (a task eval's prompt and gold answer, an
    agent episode's row id and question): two evals are paired only where these match."""
    from rlkit import jsonl

    if "examples" in results:
        return [[e.get("prompt"), e.get("gold")] for e in results["examples"]]
    return [[r.get("id"), next((m.get("content") for m in r.get("messages") or [] if m.get("role") == "user"), None)]
            for r in jsonl.read_records(Path(results["trajectories"]))]


def gain(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """after - before on the same problems: the difference, its 95% interval, the p-value and whether it is
    significant (:func:`rlkit.stats.paired`: exact McNemar for right/wrong)."""
    from rlkit.stats import paired

    return paired(per_problem(before), per_problem(after))
