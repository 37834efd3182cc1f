"""Memory of TRL's GRPO loss forward and backward on CPU, per token: what `rlkit doctor`'s CPU plan is built on.

The recipe's trainer is built as `rlkit train` builds it (model in the recipe's dtype, TRL's LoRA), then
`GRPOTrainer.compute_loss` and the backward run on random token ids of a given shape (batch x prompt +
completion), with and without gradient checkpointing. glibc's mmap threshold is pinned at 128 KiB so that RSS
follows live tensors (rlkit/cpu_memory.py); each figure is a difference of RSS (`VmRSS`, or the
high-water `VmHWM` reset through /proc/self/clear_refs) against the RSS before the forward:

- kept: what the forward leaves alive for the backward (saved activations, completion logits)
- forward, backward: the high-water mark of each

    OMP_NUM_THREADS=1 .venv/bin/python bench/loss_memory.py smol_arith_grpo 4x128+32 4x256+32
    OMP_NUM_THREADS=1 .venv/bin/python bench/loss_memory.py smol_arith_grpo 4x128+32 --no-checkpointing

Shapes are BxP+C (sequences x prompt tokens + completion tokens). Prints one JSON line per shape.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from common import ROOT

MB = 1e6


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(trainer, batch: int, prompt: int, completion: int, checkpointing: bool) -> dict:
    import gc

    import torch

    from rlkit.cpu_memory import _libc

    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
    else:
        model.gradient_checkpointing_disable()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    inputs = {"prompt_ids": torch.randint(vocab, (batch, prompt), generator=generator),
              "prompt_mask": torch.ones(batch, prompt, dtype=torch.long),
              "completion_ids": torch.randint(vocab, (batch, completion), generator=generator),
              "completion_mask": torch.ones(batch, completion, dtype=torch.long),
              "advantages": torch.randn(batch, generator=generator),
              "num_items_in_batch": torch.tensor(float(batch * completion))}
    model.zero_grad(set_to_none=False)  # the LoRA gradients exist from here on, as after a first step
    gc.collect()
    _libc().malloc_trim(0)
    before = _status("VmRSS")
    _reset_peak()
    loss = trainer.compute_loss(model, inputs)
    forward, kept = _status("VmHWM") - before, _status("VmRSS") - before
    _reset_peak()
    trainer.accelerator.backward(loss)
    backward = _status("VmHWM") - before
    del loss
    gc.collect()
    left = _status("VmRSS") - before
    model.zero_grad(set_to_none=False)
    return {"batch": batch, "prompt": prompt, "completion": completion, "checkpointing": checkpointing,
            "kept_mb": kept / MB, "forward_mb": forward / MB, "backward_mb": backward / MB, "left_mb": left / MB,
            "before_mb": before / MB}


def main(recipe: str, shapes: list[str], checkpointing: bool, threshold_kb: int) -> None:
    sys.path.insert(0, str(ROOT))
    from rlkit.cpu_memory import keep_heap_small
    from rlkit.recipe import load_recipe
    from rlkit.train import build_trainer

    keep_heap_small(threshold_kb * 1024)
    with tempfile.TemporaryDirectory(prefix="rlkit-loss-memory-") as tmp:
        (Path(tmp) / "run").mkdir()
        trainer, _ = build_trainer(load_recipe(ROOT / "recipes" / f"{recipe}.yaml", ["trainer.report_to=none"]),
                                   Path(tmp) / "run")
        for shape in shapes:
            sizes, completion = shape.split("+")
            batch, prompt = sizes.split("x")
            print(json.dumps(measure(trainer, int(batch), int(prompt), int(completion), checkpointing)), flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    kb = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--threshold-kb=")), 128)
    main(args[0], args[1:], checkpointing="--no-checkpointing" not in sys.argv, threshold_kb=kb)
