"""The ``rlkit`` command line. Each command parses its arguments and calls one function; the ``recipes``
and ``index`` command groups are in :mod:`rlkit.cli.catalogue`.

Heavy imports (torch, transformers, trl) happen inside the commands, so ``rlkit --help`` and
argument errors stay fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from rlkit.cli.catalogue import index_app, recipes_app
from rlkit.cli.demo import demo
from rlkit.cli.eval_cmd import eval_
from rlkit.cli.optimize import optimize_prompt
from rlkit.cli.options import SetOpt, SmokeOpt, console, main_options
from rlkit.cli.serve import serve_search
from rlkit.errors import Interrupted, StorageError, UserError

app = typer.Typer(help="Post-train language models with SFT, DPO, reward models, PPO and GRPO from one YAML recipe.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
app.callback()(main_options)
app.add_typer(recipes_app, name="recipes")
app.add_typer(index_app, name="index")
app.command()(demo)
app.command("eval")(eval_)
app.command("serve-search")(serve_search)
app.command("optimize-prompt")(optimize_prompt)


@app.command()
def train(
    recipe: Path = typer.Argument(..., help="Recipe YAML file."),
    set_: list[str] = SetOpt,
    smoke: bool = SmokeOpt,
    output_dir: Path = typer.Option(None, "--output-dir", help="Run directory (default runs/<name>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty run directory."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the output directory from its latest "
                                "complete checkpoint."),
    num_processes: int = typer.Option(None, "--num-processes", min=1,
                                      help="Processes on all machines together (relaunches under accelerate)."),
    accelerate_config: str = typer.Option(None, "--accelerate-config",
                                          help="single_gpu, multi_gpu, zero2, zero3, fsdp or an accelerate YAML "
                                               "(default: the recipe's accelerate_config)."),
    num_machines: int = typer.Option(1, "--num-machines", min=1, help="Machines taking part."),
    machine_rank: int = typer.Option(0, "--machine-rank", min=0, help="This machine's rank (0 is the main one)."),
    main_process_ip: str = typer.Option(None, "--main-process-ip", help="Address of the machine with rank 0."),
    main_process_port: int = typer.Option(None, "--main-process-port", help="Port on the machine with rank 0."),
    no_doctor: bool = typer.Option(False, "--no-doctor", help="Skip the pre-launch checks (template, rewards, "
                                   "batch arithmetic, versions) that run before the model loads."),
    max_minutes: float = typer.Option(None, "--max-minutes", min=0.01, help="End training at the first step that "
                                      "finishes this long after training began (before trainer.max_steps)."),
) -> None:
    """Train the recipe; writes the run directory (adapter, metrics, plots, report, resolved recipe).

    Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint and says how to --resume.
    With --num-processes (or --num-machines, or an accelerate config) it runs under `accelerate launch`.
    """
    from rlkit import launch

    if accelerate_config is None:
        from rlkit.recipe import apply_overrides, read_yaml

        accelerate_config = apply_overrides(read_yaml(recipe), set_ or []).get("accelerate_config")
    wants_launch = (num_processes or 1) > 1 or num_machines > 1 or accelerate_config is not None
    if wants_launch and not launch.already_launched():
        from rlkit.recipe import load_recipe
        from rlkit.trainers import check_trainer

        # A mistake in the recipe is one line here, not one traceback per rank from torchrun.
        check_trainer(loaded := load_recipe(recipe, set_ or [], smoke=smoke), source=str(recipe))
        launch.check_quantized(loaded.model.load_in_4bit, accelerate_config)
        argv = sys.argv[sys.argv.index("train") + 1:]
        code = launch.relaunch(argv, num_processes=num_processes, accelerate_config=accelerate_config,
                               num_machines=num_machines, machine_rank=machine_rank, main_process_ip=main_process_ip,
                               main_process_port=main_process_port)
        raise typer.Exit(code)
    from rlkit.train import train as run_train

    run_dir = run_train(recipe, set_ or [], smoke=smoke, output_dir=output_dir, overwrite=overwrite, resume=resume,
                        doctor=not no_doctor, max_minutes=max_minutes)
    if launch.is_main_process():
        console().print(f"[green]run directory:[/] {run_dir}")


@app.command()
def doctor(
    recipe: Path = typer.Argument(..., help="Recipe YAML file."),
    set_: list[str] = SetOpt,
    smoke: bool = SmokeOpt,
    samples: int = typer.Option(None, "--samples", min=0,
                                help="Learnability probe: completions per prompt (default 8; 0 with --smoke)."),
    limit: int = typer.Option(8, "--limit", min=1, help="Train prompts/rows the checks read."),
    gpu: str = typer.Option(None, "--gpu", help="Memory plan target: h100-80gb, a100-40gb, a100-80gb, l4-24gb, "
                            "rtx4090-24gb, t4-16gb, ... or a size in GB (default: this machine's GPU; without "
                            "one, peak RSS on this CPU)."),
    endpoint: str = typer.Option(None, "--endpoint", help="Sample the probe from an OpenAI-compatible server "
                                 "(e.g. http://localhost:8000/v1) instead of loading the model here."),
    api_key: str = typer.Option(None, "--api-key", help="Endpoint API key (default: $OPENAI_API_KEY); never saved."),
    write_filtered: Path = typer.Option(None, "--write-filtered", help="Write the probed prompts that give GRPO a "
                                        "signal to this JSONL (train on it with --set 'data.train={path: FILE}')."),
    out: Path = typer.Option(None, "--out", help="Also write DIR/doctor.md and DIR/doctor.json."),
) -> None:
    """Check a recipe before launching it: template, rewards, learnability, memory, batch arithmetic, versions.

    Exit 0: go. Exit 1: a blocking check failed. Exit 2: a mistake in the command or the recipe.
    """
    from rlkit.doctor import run
    from rlkit.doctor.render import render, write

    if write_filtered is not None and write_filtered.exists():
        raise UserError(f"--write-filtered {write_filtered}: already exists; choose a new file")
    if gpu is not None:
        from rlkit.doctor.memory import parse_gpu

        parse_gpu(gpu)  # a typo fails before anything loads
    report = run(recipe, set_ or [], smoke=smoke, samples=samples, limit=limit, gpu=gpu, endpoint=endpoint,
                 api_key=api_key, write_filtered=write_filtered)
    render(report, console())
    if out is not None:
        md, js = write(report, out)
        console().print(f"report: {md} and {js}")
    if not report.go:
        raise typer.Exit(1)


@app.command("vllm-serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def vllm_serve(
    ctx: typer.Context,
    recipe: Path = typer.Argument(..., help="A grpo recipe with trainer.use_vllm: true and vllm_mode: server."),
    set_: list[str] = SetOpt,
) -> None:
    """Start TRL's vLLM server for the recipe's model, on the host/port its trainer connects to.

    Choose its GPUs with CUDA_VISIBLE_DEVICES; arguments after the recipe go to `trl vllm-serve`.
    """
    from rlkit.vllm_serve import serve

    serve(recipe, set_ or [], extra_args=ctx.args)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run directory from `rlkit train`.")) -> None:
    """Charts (RUN/plots/*.png) and RUN/report.md from a run's metrics and evaluations."""
    from rlkit.report import render, write_report

    summary = write_report(run_dir)
    out = console()
    render(summary, out)
    out.print(f"report: {summary['report']} ({len(summary['plots'])} plots in {Path(run_dir) / 'plots'})")


@app.command()
def compare(
    evals: list[str] = typer.Argument(..., metavar="EVAL", help="Two or more `rlkit eval --suite` folders (or run "
                                      "directories holding one), each [NAME=]PATH[:base|:trained]: NAME heads its "
                                      "column; :base takes the folder's base row (default: its trained row, else its "
                                      "only one)."),
    out: Path = typer.Option(None, "--out", help="Also write the comparison to this .json file, its table as "
                             "Markdown beside it (.md)."),
) -> None:
    """Models already evaluated on the same suite, per set and pooled: each one's accuracy, and each minus the
    first on the same problems (paired; nothing is evaluated again)."""
    from rlkit.cli.suite import print_compare
    from rlkit.evaluate.suite import compare_suites

    print_compare(compare_suites(evals), out)


@app.command()
def merge(
    source: Path = typer.Argument(..., help="A run directory or an adapter directory."),
    out: Path = typer.Option(..., "--out", help="Directory for the merged model (written whole or not at all)."),
    base: str = typer.Option("dequantized", "--base",
                             help="dequantized: faithful for QLoRA (nf4 base as trained, dequantized); "
                                  "original: the unquantized weights."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Saved weights: bfloat16, float16 or float32."),
    base_model: str = typer.Option(None, "--base-model",
                                   help="Base model id/path; must be the one the adapter was trained on."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out directory."),
) -> None:
    """Merge a LoRA adapter into its base, save a plain transformers model, verify it against the adapter."""
    from rlkit.merge import merge as run_merge
    from rlkit.merge.report import print_merge_report

    report = run_merge(source, out, base=base, dtype=dtype, base_model=base_model, overwrite=overwrite)
    print_merge_report(report)


@app.command()
def rollout(
    target: Path = typer.Argument(..., help="An agent recipe (with `env:`) or a run directory."),
    model: str = typer.Option(None, "--model", help="Merged model dir, base model id, adapter dir or run dir."),
    endpoint: str = typer.Option(None, "--endpoint", help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1."),
    api_key: str = typer.Option(None, "--api-key", help="Endpoint API key (default: $OPENAI_API_KEY); never saved."),
    served_model: str = typer.Option(None, "--served-model", help="Model name served (default: the only one)."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Endpoint requests in flight at once."),
    backend: str = typer.Option("hf", "--backend", help="Local generation: hf (batched transformers) or vllm (GPU)."),
    split: str = typer.Option("eval", "--split", help="Which data split to roll out: eval or train."),
    limit: int = typer.Option(None, "--limit", min=1, help="The first N questions."),
    temperature: float = typer.Option(0.0, "--temperature", min=0, help="0 = greedy."),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", min=1, help="Per turn (default eval.max_new_tokens)."),
    tool_timeout: float = typer.Option(30.0, "--tool-timeout", min=0.01, help="Seconds a tool call may take."),
    timeout: float = typer.Option(120.0, "--timeout", min=0.01,
                                  help="Endpoint: total seconds one request may take, however the server trickles."),
    retries: int = typer.Option(2, "--retries", min=0, help="Endpoint: retries of a failed request (recorded)."),
    out: Path = typer.Option(None, "--out", help="trajectories.jsonl path (default RUN/rollouts/<model>/)."),
    sft_out: Path = typer.Option(None, "--sft-out", help="Also write the successful trajectories as SFT rows here."),
    smoke: bool = SmokeOpt,
    set_: list[str] = SetOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue --out: play only the rows it does not hold yet."),
    oracle: bool = typer.Option(False, "--oracle", help="Teacher that knows the gold evidence (offline --endpoint)."),
    cite: bool = typer.Option(False, "--cite", help="--oracle quotes each hop's evidence before answering."),
) -> None:
    """Run the recipe's tool agent episode by episode; append each to trajectories.jsonl as it ends; summarise."""
    from rlkit.agents.rollout import print_summary
    from rlkit.agents.rollout import rollout as run_rollout

    if split not in ("eval", "train"):
        raise UserError(f"--split {split!r}: use eval or train")
    result = run_rollout(target, model=model, endpoint=endpoint, api_key=api_key, served_model=served_model,
                         concurrency=concurrency, backend=backend, split=split, limit=limit, out=out, sft_out=sft_out,
                         temperature=temperature, max_new_tokens=max_new_tokens, tool_timeout=tool_timeout,
                         timeout=timeout, retries=retries, smoke=smoke, overrides=set_ or [], resume=resume,
                         oracle=oracle, cite=cite)
    if not print_summary(result):  # mostly transport failures: the numbers say nothing of the model
        raise typer.Exit(1)


@app.command("analyze")
def analyze_(
    trajectories: Path = typer.Argument(..., help="A trajectories.jsonl from `rlkit rollout` or `rlkit eval`."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown tables instead of terminal tables."),
    out: Path = typer.Option(None, "--out", help="Write the Markdown report to this file."),
) -> None:
    """Quality (EM/F1/accuracy per question type), rounds, tool calls and token usage, split by success."""
    from rlkit.analyze import main as run_analyze

    run_analyze(str(trajectories), markdown=markdown, out=str(out) if out else None)


@app.command()
def chat(
    target: str = typer.Argument(..., help="A run directory, adapter dir, merged model dir or model id."),
    env: str = typer.Option(None, "--env", help="Tool environment (default: the run's `env:`), e.g. calculator."),
    recipe: Path = typer.Option(None, "--recipe", help="Recipe for a bare model (its env, retrieval and prompt)."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", min=1, help="Per assistant turn."),
    temperature: float = typer.Option(0.0, "--temperature", min=0, help="0 = greedy."),
) -> None:
    """Chat with a model in the terminal; its tool calls and their results show as they happen."""
    from rlkit.chat import chat as run_chat

    run_chat(target, env=env, recipe_path=recipe, max_new_tokens=max_new_tokens, temperature=temperature)


@app.command()
def pairs(
    recipe: Path = typer.Argument(..., help="A dpo recipe with a `pairs:` section."),
    model: str = typer.Option(..., "--model", help="Run dir, adapter dir, merged model dir or base model id."),
    out: Path = typer.Option(..., "--out", help="Pairs JSONL to write (prompt/chosen/rejected)."),
    samples: int = typer.Option(None, "--samples", min=2, help="Completions per prompt (default: pairs.samples)."),
    min_gap: float = typer.Option(None, "--min-gap", min=0, help="Keep pairs whose reward gap exceeds this."),
    limit: int = typer.Option(None, "--limit", min=1, help="Use the first N prompts."),
    smoke: bool = SmokeOpt,
    set_: list[str] = SetOpt,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file (one rlkit wrote)."),
    resume: bool = typer.Option(False, "--resume", help="Keep the pairs already in --out; sample the other prompts."),
) -> None:
    """Sample K completions per prompt, score them with the recipe's rewards, keep (best, worst) pairs."""
    from rlkit.pairs import build_pairs, print_summary

    print_summary(build_pairs(recipe, model, out, samples=samples, min_gap=min_gap, limit=limit, smoke=smoke,
                              overrides=set_ or [], overwrite=overwrite, resume=resume))


def _refused() -> type[Exception]:
    from rlkit.doctor import Refused  # light: the doctor package imports nothing heavy at module level

    return Refused


def main() -> None:
    from rlkit.compat import torch_huge_pages
    from rlkit.cpu_memory import threshold_from_env

    torch_huge_pages()  # before any tensor exists
    from rlkit.launch import setup_logging

    setup_logging()
    from rlkit.secrets import redact

    try:
        threshold_from_env()  # a bad RLKIT_MMAP_THRESHOLD_KB stops here, not after a model has loaded
        app()
    except UserError as e:  # a StorageError (a full or read-only disk) exits 74, other user errors 2
        print(f"rlkit: error: {redact(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code if isinstance(e, StorageError) else 2)
    except _refused() as e:
        print(f"rlkit: doctor: {redact(str(e))}; see `rlkit doctor RECIPE`, or pass --no-doctor", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        # A full disk or a read-only mount is the machine's state, not a bug: one line (rlkit's own writers
        # already say this; this catches the same from transformers/torch saving a checkpoint).
        from rlkit.safety import STORAGE_FAULTS, os_error

        if e.errno not in STORAGE_FAULTS:
            raise
        print(f"rlkit: error: {redact(str(os_error(e, Path(e.filename or '.'))))}", file=sys.stderr)
        sys.exit(StorageError.exit_code)
    except Interrupted as e:
        from rlkit.launch import LAUNCHED_ENV, is_main_process

        if is_main_process():
            print(f"rlkit: {e}", file=sys.stderr)
        # Under `rlkit train --num-processes`, the launching rlkit reports the signal's exit code; a rank that
        # exits non-zero would make torchrun report a failure.
        sys.exit(0 if os.environ.get(LAUNCHED_ENV) else e.exit_code)


if __name__ == "__main__":
    main()
