"""``rlkit train``: recipe -> backend -> data -> TRL config -> TRL trainer -> run directory."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

log = logging.getLogger("rlkit")


def default_run_dir(recipe: Any, smoke: bool) -> Path:
    return Path("runs") / (f"{recipe.name}-smoke" if smoke else recipe.name)


def train(
    recipe_path: str | Path,
    overrides: list[str] | None = None,
    *,
    smoke: bool = False,
    output_dir: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Train one recipe; returns the run directory (adapter in ``RUN/adapter``)."""
    from rlkit import backends, runs
    from rlkit.recipe import backend_request, cuda_available, load_recipe, trainer_config

    recipe = load_recipe(recipe_path, overrides, smoke=smoke, validate_trainer=False)
    for change in recipe.smoke_changes:
        log.info("smoke: %s", change)
    backend = backends.choose(backend_request(recipe))  # before trl is imported (Unsloth's rule)
    trainer_cfg = trainer_config(recipe, output_dir="/tmp/rlkit-validate", source=str(recipe_path))
    _check_machine(recipe, trainer_cfg, backend, cuda_available())

    run_dir = Path(output_dir) if output_dir else default_run_dir(recipe, smoke)
    runs.prepare(run_dir, overwrite)
    try:
        return _run(recipe, run_dir, backend, smoke, str(recipe_path))
    except UserError:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing half-written blocks a retry
        raise


def _check_machine(recipe: Any, cfg: Any, backend: str, cuda: bool) -> None:
    use_vllm = bool(getattr(cfg, "use_vllm", False))
    if use_vllm and not cuda:
        raise UserError("trainer.use_vllm: vLLM needs a CUDA GPU and this machine has none; "
                        "set --set trainer.use_vllm=false (or use --smoke)")
    if use_vllm and backend == "hf" and recipe.model.load_in_4bit:
        # TRL's own vLLM weight sync cannot handle a 4-bit base (trl#4973).
        raise UserError("trainer.use_vllm with model.load_in_4bit on the hf backend is not supported by TRL "
                        "(trl#4973); use backend: unsloth, a 16-bit base, or use_vllm: false")


def _run(recipe: Any, run_dir: Path, backend: str, smoke: bool, source: str) -> Path:
    started = time.time()
    trainer, tokenizer = build_trainer(recipe, run_dir, smoke=smoke, source=source)
    log.info("training %s (%s, %s backend) -> %s", recipe.name, recipe.algorithm, backend, run_dir)
    trainer.train()
    trainer.save_model(str(run_dir / "adapter"))
    # Continuing from init_from with a KL reference, TRL keeps a frozen copy of the starting adapter
    # named "ref", and PEFT saves every adapter: the run's adapter is the trained one alone.
    shutil.rmtree(run_dir / "adapter" / "ref", ignore_errors=True)
    tokenizer.save_pretrained(str(run_dir / "adapter"))
    log.info("done in %.1fs: adapter in %s", time.time() - started, run_dir / "adapter")
    return run_dir


def build_trainer(recipe: Any, run_dir: Path, *, smoke: bool = False, source: str = "<recipe>"):
    """Everything up to ``trainer.train()``: data, TRL config, model, trainer; writes the provenance."""
    from rlkit import backends, handoff, runs
    from rlkit.recipe import trainer_config
    from rlkit.tiny import resolve_model_id
    from rlkit.trainers import builder

    algo = builder(recipe.algorithm)
    started_from = handoff.check(recipe, head=algo.HEAD) if recipe.init_from else None
    train_ds = algo.dataset(recipe)
    args = trainer_config(recipe, output_dir=str(run_dir / "checkpoints"), source=source)
    # TRL wraps the model in its LoRA inside the trainer's __init__, before transformers' Trainer
    # seeds; seeding here makes the LoRA (and any new score head) initialise the same on every run.
    from transformers import set_seed

    set_seed(args.seed)
    model, tokenizer, peft_config, backend = backends.load(
        recipe, use_vllm=bool(getattr(args, "use_vllm", False)), seed=args.seed, head=algo.HEAD)
    provenance = {
        "source": source,
        "smoke": smoke,
        "smoke_changes": recipe.smoke_changes,
        "backend": backend,
        "model_loaded": resolve_model_id(recipe.model.name_or_path),
        "dtype": str(model.dtype).removeprefix("torch."),  # what `dtype: auto` became on this machine
        "init_from": started_from,
    }
    runs.write_resolved(run_dir, recipe.to_dict(), provenance)
    trainer = algo.build(recipe, model, tokenizer, peft_config, train_ds, args, [runs.metrics_callback(run_dir)])
    _require_trainable(getattr(trainer.model, "policy", trainer.model))  # PPO wraps policy + value model
    return trainer, tokenizer


def _require_trainable(model: Any) -> None:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        raise UserError("the model has zero trainable parameters, so training would change nothing; "
                        "check `lora:` and `init_from:`")
    log.info("trainable parameters: %s", f"{trainable:,}")
