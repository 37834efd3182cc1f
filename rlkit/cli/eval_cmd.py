"""``rlkit eval``: greedy pass@1 on a recipe's eval split, with sampled metrics (``--samples K``), on every set of
an eval suite (``--suite``), or IFEval's instruction following, base beside trained (``--ifeval FILE``)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.cli.options import SetOpt, SmokeOpt
from rlkit.errors import UserError


def eval_(
    target: str = typer.Argument(..., help="A recipe YAML or a run directory (with --suite or --ifeval also a model)."),
    model: str = typer.Option(None, "--model", help="Merged model dir, base model id, adapter dir, run dir, or an "
                              "OpenAI-compatible endpoint's base URL (http://localhost:8000/v1)."),
    served_model: str = typer.Option(None, "--served-model", help="An endpoint's model name (default: its only one)."),
    api_key: str = typer.Option(None, "--api-key", help="An endpoint's API key (default: $OPENAI_API_KEY); never "
                                "saved."),
    limit: int = typer.Option(None, "--limit", min=1, help="Evaluate the first N eval examples."),
    smoke: bool = SmokeOpt,
    set_: list[str] = SetOpt,
    out: Path = typer.Option(None, "--out", help="Results JSON (default RUN/eval/<model>.json)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a killed eval after the examples it wrote."),
    suite: str = typer.Option(None, "--suite", help="A suite YAML or a shipped suite (arith, multihop): every set, "
                              "base and trained side by side; --out is then a folder."),
    ifeval: Path = typer.Option(None, "--ifeval", help="IFEval's input_data.jsonl (or its folder): instruction "
                                "following, base and trained side by side, a drop past eval.ifeval.tolerance "
                                "flagged; --out is then a folder."),
    base: str = typer.Option(None, "--base", help="With --suite/--ifeval: the base to compare with (default: the "
                             "run's)."),
    no_base: bool = typer.Option(False, "--no-base", help="With --suite/--ifeval: skip the base model."),
    samples: int = typer.Option(None, "--samples", help="Also K samples per problem: pass@1, pass@K, avg@K, maj@K."),
    temperature: float = typer.Option(None, "--temperature", help="Sampling temperature for --samples (default 1)."),
    backend: str = typer.Option("hf", "--backend", help="Local generation: hf (batched transformers) or vllm (vLLM's "
                                "engine on this GPU, the adapter as a LoRA)."),
) -> None:
    """Greedy pass@1 accuracy on the recipe's eval split (on every set of a --suite; --samples K: sampled metrics;
    --ifeval FILE: IFEval prompt/instruction accuracy, strict and loose)."""
    from rlkit.evaluate.served import Served, is_endpoint

    if (served_model or api_key) and not any(is_endpoint(ref) for ref in (target, model, base)):
        raise UserError("--served-model/--api-key reach a model at an endpoint: give its URL as TARGET, --model or "
                        "--base (http://host:8000/v1), or drop them")
    served = Served(api_key=api_key, served_model=served_model)
    if backend != "hf" and (ifeval is not None or suite is not None):
        raise UserError("--backend vllm evaluates one eval split (plain or agent); drop --suite/--ifeval, or "
                        "--backend")
    if ifeval is not None:
        from rlkit.evaluate.ifeval import run_ifeval
        from rlkit.evaluate.show import print_ifeval

        if suite is not None or samples is not None or resume:
            raise UserError("--ifeval is an eval of its own: drop --suite/--samples/--resume")
        print_ifeval(run_ifeval(target, ifeval, model=model, base=base, no_base=no_base, limit=limit, out=out,
                                overrides=set_ or [], smoke=smoke, served=served))
        return
    if suite is not None:
        from rlkit.cli.suite import eval_suite

        if smoke or resume:
            raise UserError("--suite evaluates whole sets: drop --smoke/--resume (use --limit N for a quick look)")
        if samples is not None:
            raise UserError("--samples works on one eval split; drop --suite, or drop --samples")
        eval_suite(target, suite, model=model, base=base, no_base=no_base, limit=limit, out=out, overrides=set_ or [],
                   served=served)
        return
    if base is not None or no_base:
        raise UserError("--base/--no-base compare models on a --suite or --ifeval; add --suite NAME|FILE")
    from rlkit.evaluate import evaluate
    from rlkit.evaluate.show import print_eval

    print_eval(evaluate(target, model, limit=limit, smoke=smoke, out=out, overrides=set_ or [], resume=resume,
                        samples=samples, temperature=temperature, served=served, backend=backend))
