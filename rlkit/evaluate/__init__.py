"""``rlkit eval``: greedy pass@1 on a recipe's eval split, batched, with per-example predictions.

The target is a recipe (its base model) or a run directory (base + the run's adapter); ``--model``
names something else to evaluate: a merged model directory, a base model id, an adapter directory
or another run directory. An agent recipe is evaluated by rollouts (:mod:`rlkit.evaluate.agent`), a reward
recipe by pairwise accuracy (:mod:`rlkit.evaluate.reward_model`); :mod:`rlkit.evaluate.show` prints results.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit import jsonl, safety
from rlkit.errors import UserError
from rlkit.evaluate.agent import evaluate_agent
from rlkit.evaluate.results import default_out, journal, write_results
from rlkit.evaluate.reward_model import evaluate_reward_model
from rlkit.evaluate.sampled import check as check_samples
from rlkit.evaluate.sampled import sample_task
from rlkit.evaluate.served import Served, completer, endpoint_of, is_endpoint
from rlkit.inference.reference import resolve_target
from rlkit.stats import wilson

if TYPE_CHECKING:
    from rlkit.recipe import Recipe


def evaluate(
    target: str | Path,
    model: str | None = None,
    *,
    limit: int | None = None,
    smoke: bool = False,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
    show_progress: bool = True,
    resume: bool = False,
    samples: int | None = None,
    temperature: float | None = None,
    served: Served | None = None,
    backend: str = "hf",
) -> dict[str, Any]:
    """Evaluate and write a results JSON; returns the results (``accuracy``, ``examples``, ...).

    ``model`` may be an OpenAI-compatible endpoint's base URL, reached as ``served`` says
    (:mod:`rlkit.evaluate.served`).

    Each example (each trajectory, for an agent) is appended to a JSONL file next to the results as it
    finishes; ``resume`` continues after the ones a killed eval wrote. ``samples`` K adds pass@k, avg@k
    and maj@k from K samples per problem at ``temperature`` (:mod:`rlkit.evaluate.sampled`). ``backend`` ``vllm``
    generates greedily with vLLM's engine on this GPU instead of batched transformers (``hf``).
    """
    check_samples(samples, temperature)
    check_backend(backend, model, samples)
    sampling = {"samples": samples, "temperature": temperature if temperature is not None else 1.0}
    if out is not None:  # before any model loads: never a results file rlkit did not write
        safety.check_target(out, "--out")
        if Path(out).exists():
            safety.check_replaceable_file(out, "--out", ("recipe", "model"))
    recipe, run_dir = resolve_target(target, overrides, smoke)
    if endpoint_of(recipe, run_dir, model) and backend != "hf":  # (an endpoint beside a run dir fails in there)
        raise UserError(f"{target}: its model is served at an endpoint, which generates on its server; drop "
                        "--backend vllm")
    if recipe.data.eval is None:
        raise UserError(f"{target}: the recipe has no `data.eval` split to evaluate on")
    if recipe.env is not None:
        return evaluate_agent(recipe, run_dir, model, limit=limit, out=out, show_progress=show_progress,
                              resume=resume, served=served, backend=backend, **sampling)
    if recipe.algorithm == "reward":
        if is_endpoint(model):
            raise UserError(f"--model {model}: a reward model scores pairs locally; give its run or adapter")
        if backend != "hf":
            raise UserError(f"{target}: a reward model scores pairs, it generates nothing; drop --backend vllm")
        if samples:
            raise UserError(f"{target}: --samples does not apply to a reward model (it scores pairs, not samples)")
        return evaluate_reward_model(recipe, run_dir, model, limit=limit, out=out, show_progress=show_progress)
    from rlkit.data import Scored, get_task

    if not isinstance(get_task(recipe.data.task), Scored):
        raise UserError(f"{target}: task {recipe.data.task!r} has no answer to check, so no accuracy")
    return evaluate_task(recipe, run_dir, model, limit=limit, out=out, show_progress=show_progress, resume=resume,
                         served=served, backend=backend, **sampling)


def check_backend(backend: str, model: str | None, samples: int | None) -> None:
    """``--backend`` hf or vllm; vLLM here needs vLLM and a GPU, said in one line before anything loads."""
    if backend not in ("hf", "vllm"):
        raise UserError(f"--backend {backend!r}: use hf or vllm")
    if backend == "vllm":
        if is_endpoint(model):
            raise UserError(f"--model {model}: an endpoint generates on its server; drop --backend vllm")
        if samples:
            raise UserError("--samples samples with the hf backend; drop --backend vllm or --samples")
        from rlkit.agents.vllm import require_vllm

        require_vllm()


def evaluate_task(recipe: Recipe, run_dir: Path | None, model: str | None, *, limit: int | None,
                  out: str | Path | None, show_progress: bool = True, resume: bool = False,
                  samples: int | None = None, temperature: float = 1.0,
                  served: Served | None = None, backend: str = "hf") -> dict[str, Any]:
    """Accuracy of greedy completions, checked by the task's answer rule; the examples in row order."""
    from rlkit.data import get_task, load_rows, task_rows

    task = get_task(recipe.data.task)
    source = recipe.data.eval.model_copy(update={"limit": limit}) if limit else recipe.data.eval
    rows = task_rows(recipe, "eval", load_rows(recipe.data.task, source))

    if samples and endpoint_of(recipe, run_dir, model):
        raise UserError(f"--model {model}: --samples needs the model here (it samples in batches of its own); "
                        "drop --samples for an endpoint")
    subject = completer(recipe, run_dir, model, max_new_tokens=recipe.eval.max_new_tokens, served=served,
                        backend=backend)
    label = subject.label
    from rlkit.rewards.math import extract_answer
    from rlkit.rewards.text import degenerate

    path = Path(out) if out else default_out(recipe.name, run_dir, label)
    with safety.hold(path), journal(path, ".examples.jsonl", resume, ("prompt", "completion")) as sink:
        # Examples are written in row order as each batch finishes: a killed eval resumes after the last one.
        todo = rows.select(range(len(sink.done), len(rows)))

        def write_batch(first: int, completions: list[str], cut: list[bool]) -> None:
            batch = todo.select(range(first, first + len(completions)))
            for row, c, s, x in zip(batch, completions, task.score(completions, batch), cut, strict=True):
                prediction = extract_answer(c)
                sink.write({"prompt": row["prompt"][-1]["content"], "gold": row["answer"], "prediction": prediction,
                            "completion": c, "correct": bool(s), "degenerate": degenerate(c, prediction), "cut": x})

        started = time.time()
        subject.complete(list(todo["prompt"]), batch_size=recipe.eval.batch_size, show_progress=show_progress,
                        on_batch=write_batch)
        elapsed = time.time() - started
        examples = jsonl.read_records(sink.path)
        correct = sum(e["correct"] for e in examples)
        results = {
            "recipe": recipe.name, "model": label, "task": recipe.data.task, "n": len(examples),
            "accuracy": correct / len(examples), "interval": list(wilson(correct, len(examples))),
            **degenerate_share(examples), **cut_share(examples), "seconds": round(elapsed, 2), "examples": examples,
        }
        if samples:
            lm, tokenizer = subject.local
            results["samples"] = sample_task(recipe, lm, tokenizer, task, rows, path, k=samples,
                                             temperature=temperature, resume=resume, show_progress=show_progress)
        return write_results(results, path)


def degenerate_share(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """``degenerate``: the share of replies with no answer, a character run or a loop cut by the token limit
    (:func:`rlkit.rewards.text.degenerate`), and ``degenerate_kinds``: how many of each. Examples written before
    rlkit recorded it (a resumed eval) are read again from their completion."""
    from collections import Counter

    from rlkit.rewards.math import extract_answer
    from rlkit.rewards.text import degenerate

    kinds = Counter(e["degenerate"] if "degenerate" in e else
                    degenerate(e["completion"], extract_answer(e["completion"])) for e in examples)
    kinds.pop(None, None)
    return {"degenerate": sum(kinds.values()) / len(examples), "degenerate_kinds": dict(sorted(kinds.items()))}


def cut_share(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """``cut``: the share of replies the token limit ended (``eval.max_new_tokens`` reached without a stop token);
    none when an example was written before rlkit recorded it (a resumed eval): its reply is not read again."""
    if not examples or any("cut" not in e for e in examples):
        return {}
    return {"cut": sum(bool(e["cut"]) for e in examples) / len(examples)}
