"""transformers + peft (+ bitsandbytes nf4 for QLoRA). Runs on CPU and GPU."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path
from typing import Any

from rlkit import compat, runs
from rlkit.errors import UserError
from rlkit.recipe import LoraSpec, ModelSpec

_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
log = logging.getLogger("rlkit")


def quantization_config(compute_dtype: Any):
    """QLoRA's quantization: nf4 with double quantization (merge must load the base the same way)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype)


def torch_dtype(name: str):
    import torch

    if name == "auto":
        # bf16 where the GPU has it; CPU training stays in float32 (bf16 matmuls are slow there).
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, _DTYPES[name])


def load(spec: ModelSpec, *, head: str = "causal", name: str | None = None, training: bool = False,
         quantization: dict[str, Any] | None = None, device: str | None = None):
    """Base model and tokenizer for ``spec`` (a ``ModelSpec``).

    ``head="score"`` loads a one-label sequence-classification model (reward and value models) from
    the same checkpoint; its score head is new. ``name`` loads another checkpoint the same way.
    ``training``: the trainer places the model (see :func:`device_map`); otherwise it goes to the GPU
    where there is one. ``quantization`` is a recorded bitsandbytes config (:func:`loaded_base`) to load
    the base exactly as a run did, instead of rlkit's nf4 one; ``device`` forces a device ("cpu").
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from rlkit.tiny import resolve_model_id

    name = resolve_model_id(name or spec.name_or_path)
    dtype = torch_dtype(spec.dtype)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    four_bit = spec.load_in_4bit or quantization is not None
    if quantization is not None:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig.from_dict(dict(quantization))
    elif spec.load_in_4bit:
        kwargs["quantization_config"] = quantization_config(dtype)
    if training and four_bit:
        _refuse_sharded_4bit()
    cuda = torch.cuda.is_available() and device != "cpu"
    if dtype == torch.bfloat16 and device is None and not cuda and not compat.cpu_supports_bf16():
        _warn_emulated_bf16()
    placement = device_map(cuda=cuda, four_bit=four_bit, training=training, local_rank=_local_rank(), device=device)
    if placement is not None:
        kwargs["device_map"] = placement
    if head == "score":
        kwargs["num_labels"] = 1
    auto_class = AutoModelForSequenceClassification if head == "score" else AutoModelForCausalLM
    model = _from_pretrained(auto_class, name, **kwargs)
    if four_bit and not cuda:
        compat.disable_cpu_bf16_packing(model)
    tokenizer = load_tokenizer(name)
    if head == "score":
        # The score is read at the last non-pad token, which needs the pad id in the config.
        model.config.pad_token_id = tokenizer.pad_token_id
        keep_score_in_float32(model)
    elif not cuda:
        contiguous_head_input(model)
    return model, tokenizer


@cache  # once a process: every model a demo or an eval loads would say it again
def _warn_emulated_bf16() -> None:
    log.warning("model.dtype bfloat16 on a CPU without bf16 matmul units (AVX512-BF16 or AMX): torch emulates them, "
                "slower than float32 (SmolLM2 on AVX2: 5x to evaluate, 20x to train; docs/performance.md); "
                "--set model.dtype=float32 trains and generates faster here")


def contiguous_head_input(model: Any) -> None:
    """The LM head reads a contiguous copy of its input on the CPU.

    transformers computes logits for the last positions only (``hidden_states[:, -k:, :]``, a strided view);
    torch's CPU matmul of a strided 3-D input by a frozen bf16 head copied the whole head (49,152 x 576, 57 MB
    for SmolLM2) once per sequence: 0.9 GB of a 16-sequence GRPO loss forward, and again in generation's first
    pass. Copying the slice instead costs its own size (bench/loss_memory.py; docs/performance.md).
    """
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous)


def _contiguous(module: Any, args: tuple) -> tuple:
    return tuple(a.contiguous() if hasattr(a, "contiguous") else a for a in args)


def device_map(*, cuda: bool, four_bit: bool, training: bool, local_rank: int = 0,
               device: str | None = None) -> dict[str, Any] | None:
    """Where from_pretrained puts the weights: this process's GPU, or None (CPU; the trainer moves it).

    A 4-bit model must be quantized on the GPU it runs on; a 16-bit model for inference (eval, chat,
    rollouts, merge checks) would otherwise stay on the CPU of a GPU machine. A 16-bit model for
    training is left to the trainer, which places it (and shards it under ZeRO-3/FSDP) itself.
    ``device="cpu"`` with 4-bit is an explicit CPU map: given none, transformers' bitsandbytes loader puts
    the model on the current GPU whenever CUDA exists (transformers 5.17 quantizer_bnb_4bit.py:102-105).
    """
    if device == "cpu":
        return {"": "cpu"} if four_bit else None
    if not cuda or (training and not four_bit):
        return None
    return {"": local_rank}


def _refuse_sharded_4bit() -> None:
    """Ranks launched outside rlkit: the same one line as ``rlkit.launch.check_quantized``."""
    import os

    from transformers.integrations import is_deepspeed_zero3_enabled

    what = "DeepSpeed ZeRO-3" if is_deepspeed_zero3_enabled() else (
        "FSDP" if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true") else None)
    if what:
        raise UserError(f"model.load_in_4bit under {what} is not supported by rlkit (no device_map, "
                        "bnb_4bit_quant_storage = compute dtype needed); launch with --accelerate-config multi_gpu "
                        "or set model.load_in_4bit=false")


def _local_rank() -> int:
    import os

    return int(os.environ.get("LOCAL_RANK", "0"))


def keep_score_in_float32(model: Any) -> None:
    """A 16-bit reward/value model keeps its score head in float32.

    PEFT upcasts LoRA weights to float32 but not ``modules_to_save`` (the score head): in bf16 an update
    of lr 3e-6 to a weight of size ~0.02 is below its rounding step and the value head never learns. The
    hidden states reaching it are cast to float32, so the head also works outside autocast.
    """
    import torch

    score = getattr(model, "score", None)
    if score is None or score.weight.dtype == torch.float32:
        return
    score.to(torch.float32)
    score.register_forward_pre_hook(_inputs_to_float32)


def _inputs_to_float32(module: Any, args: tuple) -> tuple:
    return tuple(a.to(module.weight.dtype) if hasattr(a, "to") else a for a in args)


def loaded_base(model: Any) -> dict[str, Any]:
    """The base a loaded (possibly PEFT-wrapped) model really is: checkpoint and quantization.

    Unsloth swaps a requested ``Qwen/Qwen3-1.7B`` with ``load_in_4bit`` for its pre-quantized
    ``unsloth/Qwen3-1.7B-unsloth-bnb-4bit`` (some modules kept 16-bit): an adapter trained there must be
    merged and evaluated on that base, with that quantization, not on the recipe's name.
    """
    config = model.config
    quant = getattr(config, "quantization_config", None)
    if quant is not None and not isinstance(quant, dict):
        quant = quant.to_dict()
    return {"name_or_path": compat.config_name_or_path(config), "quantization": _jsonable_quantization(quant),
            "dtype": str(model.dtype).removeprefix("torch.")}


def _jsonable_quantization(quant: dict[str, Any] | None) -> dict[str, Any] | None:
    import json

    if quant is None:
        return None
    # Enums (quant_method) and torch dtypes become their names: the run directory is plain YAML.
    plain = {k: (str(v).removeprefix("torch.") if "dtype" in k and v is not None and not isinstance(v, str) else v)
             for k, v in quant.items() if not k.startswith("_")}
    return json.loads(json.dumps(plain, default=str))


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _from_pretrained(cls: Any, name: str, **kwargs: Any):
    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():  # a path; a Hub id cannot start so
        raise UserError(f"model.name_or_path: {name}: no such folder; give a model folder, a run directory or a Hub "
                        "model id")
    try:
        return cls.from_pretrained(name, **kwargs)
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"model.name_or_path: cannot load {name!r}: {first}") from None


def lora_config(spec: LoraSpec | None, *, head: str = "causal"):
    """The recipe's LoRA; on a score head (reward/value model) the new head is trained in full too."""
    if spec is None:
        return None
    from peft import LoraConfig

    modules_to_save = list(spec.modules_to_save or [])
    if head == "score" and "score" not in modules_to_save:
        modules_to_save.append("score")
    return LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                      target_modules=spec.target_modules, modules_to_save=modules_to_save or None,
                      bias="none", task_type="SEQ_CLS" if head == "score" else "CAUSAL_LM")


def attach_adapter(model: Any, path: str | Path, *, trainable: bool):
    """Load a saved LoRA onto ``model``; trainable for continued training (SFT -> RL)."""
    from peft import PeftModel

    directory = runs.adapter_dir(path)
    peft_model = PeftModel.from_pretrained(model, str(directory), is_trainable=trainable)
    if trainable:
        n = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        if n == 0:
            raise UserError(f"init_from: {directory} loaded with zero trainable parameters")
    return peft_model
