"""``rlkit optimize-prompt``: gepa evolves the recipe's system prompt against its rewards (:mod:`rlkit.optimize`)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.cli.options import SetOpt, SmokeOpt


def optimize_prompt(
    recipe: Path = typer.Argument(..., help="Recipe YAML file (a task whose data.prompt may be text: gsm8k, qa, "
                                            "multihop_rag; no env)."),
    reflection_endpoint: str = typer.Option(..., "--reflection-endpoint",
                                            help="OpenAI-compatible base URL of the reflection model, e.g. "
                                                 "http://localhost:8000/v1."),
    reflection_model: str = typer.Option(..., "--reflection-model", help="The model name the endpoint serves."),
    out: Path = typer.Option(..., "--out", help="The prompt file to write (.txt or .md); its results go beside it "
                                                "(.json)."),
    reflection_key_env: str = typer.Option(None, "--reflection-key-env",
                                           help="Environment variable holding the endpoint's API key (default: "
                                                "OPENAI_API_KEY, which may be unset for a local server); the key "
                                                "is never written."),
    budget: int = typer.Option(None, "--budget", min=1, help="gepa's budget in metric calls, one = one train row "
                                                             "generated and scored (default 300; 20 with --smoke)."),
    limit_train: int = typer.Option(None, "--limit-train", min=1, help="Train rows for gepa's reflection "
                                                                       "minibatches (default 32; 4 with --smoke)."),
    limit_val: int = typer.Option(None, "--limit-val", min=1, help="The next train rows: gepa's validation set, "
                                                                   "which picks the best prompt (default 32; 4 with "
                                                                   "--smoke)."),
    limit_eval: int = typer.Option(None, "--limit-eval", min=1, help="Evaluate both prompts on the first N eval rows "
                                                                     "(default: the whole eval split)."),
    minibatch: int = typer.Option(3, "--minibatch", min=1, help="Rows the reflection model sees per proposal."),
    reflection_temperature: float = typer.Option(1.0, "--reflection-temperature", min=0, max=2,
                                                 help="Sampling temperature of the reflection model."),
    reflection_max_tokens: int = typer.Option(2048, "--reflection-max-tokens", min=16,
                                              help="Most tokens per reflection reply."),
    reflection_timeout: float = typer.Option(120.0, "--reflection-timeout", min=0.01,
                                             help="Total seconds one reflection request may take."),
    reflection_retries: int = typer.Option(3, "--reflection-retries", min=0,
                                           help="Retries of a failed reflection request; then the run stops."),
    seed: int = typer.Option(0, "--seed", help="gepa's seed (minibatch order, candidate choice)."),
    smoke: bool = SmokeOpt,
    set_: list[str] = SetOpt,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out prompt file (and JSON) rlkit wrote."),
) -> None:
    """Optimise the recipe's system prompt with gepa, against its rewards on its train split; evaluate it.

    Writes the best prompt to --out (use it with --set data.prompt=FILE) and FILE.json: the eval split's accuracy
    and mean reward under the recipe's prompt and the optimised one (95% intervals, paired gain), gepa's score
    trajectory and the cost. A reflection endpoint that fails (after its retries) stops the run: nothing is written.
    """
    from rlkit.optimize import optimize_prompt as run
    from rlkit.optimize.report import print_summary

    print_summary(run(recipe, out=out, reflection_endpoint=reflection_endpoint, reflection_model=reflection_model,
                      reflection_key_env=reflection_key_env, reflection_temperature=reflection_temperature,
                      reflection_max_tokens=reflection_max_tokens, reflection_timeout=reflection_timeout,
                      reflection_retries=reflection_retries, budget=budget, limit_train=limit_train,
                      limit_val=limit_val, limit_eval=limit_eval, minibatch=minibatch, seed=seed,
                      overrides=set_ or [], smoke=smoke, overwrite=overwrite))
