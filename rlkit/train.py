"""``rlkit train``: recipe -> backend -> data -> TRL config -> TRL trainer -> run directory."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shlex
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit import backends, compat, cpu_memory, handoff, progress, report, runs, safety, secrets, storage, tracking
from rlkit.backends import backend_request, cuda_available
from rlkit.backends.hf import loaded_base
from rlkit.doctor.learn import prompt_pool
from rlkit.errors import Interrupted, StorageError, UserError
from rlkit.evaluate.during import agent_eval_callback
from rlkit.launch import barrier, is_main_process, rank_info
from rlkit.recipe import Recipe, load_recipe
from rlkit.tiny import resolve_model_id
from rlkit.trainers import BUILDERS, trainer_config
from rlkit.vllm_serve import check_server_mode, prequantized

if TYPE_CHECKING:
    from transformers import TrainingArguments

log = logging.getLogger("rlkit")


def default_run_dir(recipe: Recipe, smoke: bool) -> Path:
    # `name: .` would make the run directory runs/ itself (every other run inside it), `a/b` a nested one.
    if recipe.name in ("", ".", "..") or "/" in recipe.name or "\\" in recipe.name:
        raise UserError(f"name {recipe.name!r}: the run directory is runs/<name>, so the name must be a plain "
                        "file name; or pass --output-dir")
    return Path("runs") / (f"{recipe.name}-smoke" if smoke else recipe.name)


def train(
    recipe_path: str | Path,
    overrides: list[str] | None = None,
    *,
    smoke: bool = False,
    output_dir: str | Path | None = None,
    overwrite: bool = False,
    resume: bool = False,
    doctor: bool = True,
    max_minutes: float | None = None,
) -> Path:
    """Train one recipe; returns the run directory (adapter in ``RUN/adapter``).

    ``max_minutes`` ends training at the first step that finishes that long after training began (model loading
    not counted), as if ``max_steps`` had been reached there: the adapter and report are written as usual.

    ``resume`` continues the run in the output directory from its latest complete checkpoint
    (weights, optimizer, scheduler, RNG and data position, as transformers restores them).
    ``doctor`` runs ``rlkit doctor``'s cheap checks first and refuses a recipe they block.
    """
    if resume and overwrite:
        raise UserError("--resume continues the run in the output directory and --overwrite deletes it; choose one")
    recipe = load_recipe(recipe_path, overrides, smoke=smoke)
    for change in recipe.smoke_changes:
        log.info("smoke: %s", change)
    backend = backends.choose(backend_request(recipe))  # before trl is imported (Unsloth's rule)
    run_dir = Path(output_dir) if output_dir else default_run_dir(recipe, smoke)
    config = trainer_config(recipe, output_dir=str(run_dir / "checkpoints"), source=str(recipe_path), backend=backend)
    _check_machine(recipe, config, backend, cuda_available())
    if doctor:
        _doctor(recipe, str(recipe_path))

    if resume and recipe.algorithm == "ppo":
        raise UserError("--resume: TRL's PPOTrainer (trl.experimental) cannot resume from a checkpoint; start again "
                        "with --overwrite, or continue from the checkpoint's adapter with --set init_from=...")
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]  # to remove again on a user error
    main, world = is_main_process(), rank_info()[2]
    if resume and world > 1 and not cuda_available():
        # transformers maps the optimizer state to `cpu:0` when several CPU processes resume, which torch refuses.
        raise UserError("--resume with several CPU processes fails inside transformers (it loads the optimizer "
                        "state onto 'cpu:0'); resume on GPUs, or start again with --overwrite")
    inputs = (Path(recipe.init_from),) if recipe.init_from else ()
    safety.check_target(run_dir, "--output-dir", inputs)
    # One writer per run directory. Only the main rank holds the lock: the ranks of one run share it.
    with safety.hold(run_dir) if main else contextlib.nullcontext():
        if resume:
            checkpoint = runs.resume_point(run_dir, recipe.to_dict(), main=main)
            log.info("resuming %s from %s", run_dir, checkpoint.name)
        else:
            runs.prepare(run_dir, overwrite, main=main, inputs=inputs)
            checkpoint = None
        barrier()  # the run directory is ready before any rank writes into it
        again = ["rlkit", "train", str(recipe_path), "--resume", *(["--smoke"] if smoke else []),
                 *(["--output-dir", str(output_dir)] if output_dir else []),
                 *(["--num-processes", str(world)] if world > 1 else []),
                 *(arg for o in overrides or [] for arg in ("--set", o))]
        try:
            return _run(recipe, config, run_dir, backend, smoke, str(recipe_path), checkpoint, shlex.join(again),
                        max_minutes)
        except UserError as e:
            removed = main and not runs.checkpoints(run_dir) and (run_dir / safety.MARKER).is_file()
            if removed:
                shutil.rmtree(run_dir, ignore_errors=True)  # nothing half-written blocks a retry
                for parent in created[1:]:
                    if parent.is_dir() and not any(parent.iterdir()):
                        parent.rmdir()
            if isinstance(e, StorageError):  # a full disk: what was kept, and the command that goes on
                raise storage.explain(e, again, runs.checkpoints(run_dir), removed) from e
            raise


def _doctor(recipe: Recipe, source: str) -> None:
    """The cheap pre-launch checks (no model, no sampling); a blocking verdict stops the run before it starts."""
    from rlkit.doctor import CHEAP, Refused, run

    started = time.perf_counter()
    verdict = run(source, recipe=recipe, families=CHEAP, limit=4, before_training=True)
    for check in verdict.checks:
        if check.verdict == "warn" and is_main_process():
            log.warning("doctor: %s/%s: %s", check.family, check.name, check.evidence)
    log.info("doctor: %s (%.2fs; `rlkit doctor %s` for the full report, --no-doctor to skip)", verdict.summary(),
             time.perf_counter() - started, source)
    if not verdict.go:
        raise Refused(verdict.summary())


def _check_machine(recipe: Recipe, cfg: TrainingArguments, backend: str, cuda: bool) -> None:
    compat.check_trl_kernels(recipe.algorithm)
    use_vllm = bool(getattr(cfg, "use_vllm", False))
    if use_vllm and not cuda:
        raise UserError("trainer.use_vllm: vLLM needs a CUDA GPU and this machine has none; "
                        "set --set trainer.use_vllm=false (or use --smoke)")
    if use_vllm:
        check_server_mode(recipe, backend)
    if use_vllm and backend == "hf" and (recipe.model.load_in_4bit or prequantized(recipe.model.name_or_path)):
        # TRL's own vLLM weight sync cannot handle a 4-bit base (trl#4973), nor a pre-quantized checkpoint.
        raise UserError("trainer.use_vllm with a 4-bit base (model.load_in_4bit or a *-bnb-4bit checkpoint) on the "
                        "hf backend is not supported by TRL (trl#4973); use backend: unsloth, a 16-bit base, or "
                        "use_vllm: false")
    if use_vllm and importlib.util.find_spec("vllm") is None:
        raise UserError("trainer.use_vllm: vLLM is not installed; `pip install 'rlkit[gpu]'` or set use_vllm: false")


def _run(recipe: Recipe, config: TrainingArguments, run_dir: Path, backend: str, smoke: bool, source: str,
         checkpoint: Path | None, resume_command: str, max_minutes: float | None = None) -> Path:
    started = time.time()
    trainer, tokenizer = build_trainer(recipe, run_dir, smoke=smoke, source=source, resumed_from=checkpoint,
                                       config=config)
    log.info("training %s (%s, %s backend) -> %s", recipe.name, recipe.algorithm, backend, run_dir)
    stop = _stop_on_signal()
    trainer.add_callback(stop)
    if max_minutes is not None:
        trainer.add_callback(runs.time_limit_callback(max_minutes))
        progress.set_time_limit(trainer, max_minutes)
    try:
        # On CPU, RSS follows live tensors while training: freed ones go back to the OS (see cpu_memory).
        with stop.installed(), cpu_memory.small_heap(active=not cuda_available(), trainer=trainer):
            trainer.train(**({"resume_from_checkpoint": str(checkpoint)} if checkpoint else {}))
    except _Stopped:  # a checkpoint saved; or a second signal: at once, no checkpoint of this step, no report
        pass
    state, main = trainer.state, is_main_process()
    if stop.signum is not None and state.global_step < state.max_steps:
        if main and not stop.now:
            _report(run_dir, done=False)
        saved = runs.checkpoints(run_dir)
        where = f"checkpoint saved in {saved[-1]}" if saved else "no checkpoint was saved"
        name = ", then ".join(signal.Signals(s).name for s in (stop.signum, stop.now) if s)
        how = "at once after" if stop.now else "at"
        then = f"resume with: {resume_command}"
        if recipe.algorithm == "ppo" and saved:
            then = f"PPO cannot resume; continue from the checkpoint's adapter with --set init_from={saved[-1]}"
        raise Interrupted(f"{name}: stopped {how} step {state.global_step}/{state.max_steps}; {where}; {then}",
                          128 + (stop.now or stop.signum))
    storage.save_adapter(trainer, tokenizer, run_dir / "adapter", main)
    if not main:
        return run_dir
    log.info("done in %.1fs: adapter in %s", time.time() - started, run_dir / "adapter")
    _report(run_dir)
    if (offline := tracking.wandb_offline_dir(run_dir)) and "wandb" in trainer.args.report_to:
        log.info("W&B offline run: upload it with `wandb sync %s`", offline)
    return run_dir


def _report(run_dir: Path, done: bool = True) -> None:
    """Plots and report.md (unless ``RLKIT_NO_REPORT=1``); a plotting failure is logged, never fails the run."""
    if not report.wanted():
        return
    then = f"draw it with: rlkit report {shlex.quote(str(run_dir))} (the run itself is complete: its adapter is in " \
           f"{run_dir / 'adapter'})" if done else None  # an interrupted run: resume from its checkpoint
    try:
        with storage.writing("the report", run_dir / report.REPORT, then=then):
            summary = report.write_report(run_dir)
        log.info("report: %s (%d plots in %s)", summary["report"], len(summary["plots"]), run_dir / "plots")
    except StorageError:
        raise
    except UserError as e:
        log.warning("no report: %s", e)
    except Exception:
        log.exception("writing the report failed; the run itself is complete")


class _Stopped(BaseException):
    """Raised to leave the trainer's loop: from a callback once the checkpoint a signal asked for is saved, or at once
    in a run resumed at its last step; from the handler of a second signal. A BaseException, as Ctrl-C's
    KeyboardInterrupt: no library's ``except Exception`` keeps it."""


def _stop_on_signal() -> Any:
    """A TrainerCallback for SIGINT/SIGTERM: finish the step, save a checkpoint, stop.

    ``with callback.installed():`` holds the signal handlers; a second signal stops at once.
    """
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):
        signum: int | None = None
        now: int | None = None  # the second signal's, when one stopped it at once

        def on_step_end(self, args, state, control, **kwargs):
            if rank_info()[2] > 1:  # ranks may see the signal a step apart: stop together, on the same step
                import torch
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    flag = torch.tensor([self.signum or 0], device=args.device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                    self.signum = int(flag.item()) or None
            if self.signum is not None:
                control.should_save = True
                control.should_training_stop = True

        def on_step_begin(self, args, state, control, **kwargs):
            if 0 < state.max_steps <= state.global_step:
                # Resumed from the final step's checkpoint (its adapter could not be written): transformers would
                # train one step past max_steps; the weights it loaded are the run's, so save them as they are.
                raise _Stopped

        def on_save(self, args, state, control, **kwargs):
            if self.signum is not None:
                raise _Stopped  # the checkpoint is complete; leave any trainer's loop here

        @contextmanager
        def installed(self):
            if threading.current_thread() is not threading.main_thread():
                yield  # signal handlers live in the main thread only
                return
            previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

            def handle(signum, frame):
                if self.signum is not None:
                    self.now = signum
                    raise _Stopped
                self.signum = signum
                log.warning("%s: finishing this step, saving a checkpoint, then stopping "
                            "(send it again to stop at once)", signal.Signals(signum).name)

            for s in previous:
                signal.signal(s, handle)
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    return StopOnSignal()


def build_trainer(recipe: Recipe, run_dir: Path, *, smoke: bool = False, source: str = "<recipe>",
                  resumed_from: Path | None = None, config: TrainingArguments | None = None):
    """Everything up to ``trainer.train()``: data, TRL config, model, trainer; writes the provenance.

    ``config`` is the TRL config ``rlkit train`` already built for ``run_dir``; without it it is built here.
    """
    algo = BUILDERS.get(recipe.algorithm)
    started_from = handoff.check(recipe, head=algo.HEAD) if recipe.init_from else None
    train_ds = algo.dataset(recipe)
    args = config or trainer_config(recipe, output_dir=str(run_dir / "checkpoints"), source=source,
                                    backend=backends.choose(backend_request(recipe)))
    args.run_name = args.run_name or run_dir.name
    # rlkit's checkpoint callback rotates, after marking the new checkpoint complete (see runs.checkpoint_callback).
    keep, args.save_total_limit = args.save_total_limit, None
    _keep_token_out_of_files(args)
    main = is_main_process()
    tracking.prepare(args.report_to, run_dir, main=main)
    # TRL wraps the model in its LoRA inside the trainer's __init__, before transformers' Trainer
    # seeds; seeding here makes the LoRA (and any new score head) initialise the same on every run.
    from transformers import set_seed

    set_seed(args.seed)
    model, tokenizer, peft_config, backend = backends.load(
        recipe, use_vllm=bool(getattr(args, "use_vllm", False)), seed=args.seed, head=algo.HEAD)
    if recipe.algorithm == "grpo" and not cuda_available() and recipe.model.attn_implementation is None:
        from rlkit.inference.fastgen import grouped_heads_uncopied

        grouped_heads_uncopied(model)  # it generates inside training; a recipe's own attention is kept
    provenance = {
        "source": source, "smoke": smoke, "smoke_changes": recipe.smoke_changes, "backend": backend,
        "model_loaded": resolve_model_id(recipe.model.name_or_path),
        "dtype": str(model.dtype).removeprefix("torch."),  # what `dtype: auto` became on this machine
        # The checkpoint and quantization really loaded (Unsloth may swap in its pre-quantized repo):
        # merge, eval and rollouts load the adapter's base from here.
        "base_model": loaded_base(getattr(model, "policy", model)),
        "init_from": started_from,
    }
    provenance |= {"resumed_from": str(resumed_from)} if resumed_from is not None else {}
    resolved = runs.write_resolved(run_dir, recipe.to_dict(), provenance, write=main)
    rank, local_rank, world = rank_info()
    if world > 1:
        log.info("rank %d of %d (local rank %d) on %s, %d training rows in the dataset", rank, world, local_rank,
                 args.device, len(train_ds), extra={"all_ranks": True})
    train_ds = prompt_pool(recipe, model, tokenizer, train_ds, args, run_dir, main=main)  # GRPO's sampling.pool
    trainer = algo.build(recipe, model, tokenizer, peft_config, train_ds, args,
                         [runs.metrics_callback(run_dir), runs.checkpoint_callback(keep)])
    storage.guard_checkpoints(trainer)  # a full disk during a save: one line, the half-written checkpoint removed
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)  # rlkit's bar (or log line per step) replaces tqdm's
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(progress.training_callback(f"{recipe.algorithm} {recipe.name}"))
    trainer.add_callback(tracking.config_callback(trainer, resolved))
    if recipe.eval.agent_every and recipe.algorithm == "grpo" and recipe.env is not None:
        # First: its scores join the step's logs before metrics.jsonl and the trackers read them.
        trainer.callback_handler.callbacks.insert(0, agent_eval_callback(recipe, run_dir, tokenizer, main=main))
    _require_trainable(getattr(trainer.model, "policy", trainer.model))  # PPO wraps policy + value model
    if main:
        runs.write_trainer_config(run_dir, trainer.args)
    return trainer, tokenizer


def _keep_token_out_of_files(args: TrainingArguments) -> None:
    """transformers pickles the whole TrainingArguments into ``training_args.bin`` (adapter and every
    checkpoint), ``hub_token`` included. The token moves to ``HF_TOKEN``, where huggingface_hub reads it
    for a push, and is masked in logs from here on."""
    token = getattr(args, "hub_token", None)
    if token:
        secrets.register(token)
        os.environ["HF_TOKEN"] = token
        args.hub_token = None


def _require_trainable(model: Any) -> None:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        raise UserError("the model has zero trainable parameters, so training would change nothing; "
                        "check `lora:` and `init_from:`")
    log.info("trainable parameters: %s", f"{trainable:,}")
