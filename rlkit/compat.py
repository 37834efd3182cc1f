"""Every place rlkit leans on a library's private or version-specific internals, in one module.

Each entry names the library version it was written against and what breaks when upstream changes;
``tests/test_compat.py`` holds a canary per entry that fails loudly, naming the installed version.
Nothing here is imported at module level: importing ``rlkit.compat`` costs nothing.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

# --- trl.chat_template_utils (TRL 1.12; not exported from ``trl``) -------------------------------
# If TRL moves or renames these, `rlkit doctor`'s template checks, tool rollouts and the tiny model's
# tokenizer stop working with an ImportError here.


def add_response_schema(tokenizer: Any) -> Any:
    from trl.chat_template_utils import add_response_schema as impl

    return impl(tokenizer)


def parse_response(tokenizer: Any, ids: list[int], prefix: list[int] | None = None) -> dict[str, Any]:
    from trl.chat_template_utils import parse_response as impl

    return impl(tokenizer, ids, prefix=prefix)


def get_training_chat_template(tokenizer: Any) -> str | None:
    from trl.chat_template_utils import get_training_chat_template as impl

    return impl(tokenizer)


def is_chat_template_prefix_preserving(tokenizer: Any) -> bool:
    from trl.chat_template_utils import is_chat_template_prefix_preserving as impl

    return impl(tokenizer)


def supports_tool_calling(tokenizer: Any) -> bool:
    from trl.chat_template_utils import supports_tool_calling as impl

    return impl(tokenizer)


def has_generation_markers(template: str) -> bool:
    from trl.chat_template_utils import has_generation_markers as impl

    return impl(template)


def is_chat_template_stop_token_trained(tokenizer: Any, chat_template: str | None = None) -> bool:
    from trl.chat_template_utils import is_chat_template_stop_token_trained as impl

    return impl(tokenizer, chat_template=chat_template)


def qwen3_chat_template() -> str:
    """TRL's copy of the Qwen3 chat template (a module-level string)."""
    from trl.chat_template_utils import qwen3_chat_template as template

    return template


# --- TRL's tool loop (TRL 1.12, GRPOTrainer.__init__ and the private GRPOTrainer._tool_call_loop) ---

# The public environment methods TRL does not expose as tools. If TRL adds one, rlkit's rollouts would
# offer the model a tool that training never did.
TRL_NON_TOOL_METHODS = ("reset", "get_reward")


def trl_tool_error(message: str) -> str:
    """The tool-result text TRL 1.12's ``_tool_call_loop`` gives the model for a failed call:
    ``str({"error": message})``. If TRL changes it, rollouts show the model other text than training did."""
    return str({"error": message})


# --- trl.cli (TRL 1.12) -------------------------------------------------------------------------


def trl_accelerate_config(name_or_path: str) -> Path:
    """The accelerate config file TRL 1.12's ``trl.cli.accelerate_config`` resolver finds for a config it
    ships (``zero2``, ``fsdp2`` ...) or a file path. If TRL moves the resolver or renames its configs,
    ``rlkit train --accelerate-config NAME`` fails here."""
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    try:
        resolved = resolve_accelerate_config_argument(["--accelerate_config", name_or_path])
    except ValueError as e:
        raise UserError(f"--accelerate-config {name_or_path!r}: {e}") from None
    return Path(resolved[resolved.index("--config_file") + 1])


# --- TRL 1.15's Triton log-prob kernel ---------------------------------------------------------------------

# From 1.15, TRL's SFT, DPO and GRPO trainers compute log-probabilities only through a fused LM head whose
# kernel is Triton's (trl/trainer/utils.py:504-509 imports it if it can, 1638 calls it unconditionally);
# without Triton (CPU-only torch, macOS) every training step fails with a NoneType AttributeError.
TRITON_MISSING = ("TRL {version}'s {algorithm} trainer needs Triton (Linux with a CUDA build of torch), which "
                  "this machine lacks; install the tested TRL with `pip install 'trl>=1.12,<1.15'` "
                  "(`make install` does), or train on a GPU")


def check_trl_kernels(algorithm: str) -> None:
    """A one-line UserError where the installed TRL's trainer for ``algorithm`` cannot run here."""
    import trl

    if algorithm in ("sft", "dpo", "grpo") and trainers_need_missing_triton(trl.__version__):
        raise UserError(TRITON_MISSING.format(version=trl.__version__, algorithm=algorithm.upper()))


def trainers_need_missing_triton(trl_version: str) -> bool:
    """Whether TRL ``trl_version``'s SFT, DPO and GRPO trainers cannot run here: >= 1.15, and no Triton."""
    return _version_tuple(trl_version) >= (1, 15) and importlib.util.find_spec("triton") is None


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


# --- trl.experimental.ppo (TRL 1.12; experimental, absent from the 1.13+ wheels) ------------------


def silence_experimental_warning() -> None:  # PPO, environment_factory: rlkit pins and tests them
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


PPO_MISSING = ("PPO needs TRL's PPOTrainer, which TRL {version} no longer has (removed in 1.13); "
               "`pip install 'trl>=1.12,<1.13'` to train PPO, or use GRPO")


def _ppo(name: str) -> type:
    silence_experimental_warning()
    try:
        import trl.experimental.ppo as ppo
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("trl.experimental"):
            raise
        import trl

        raise UserError(PPO_MISSING.format(version=trl.__version__)) from None
    return getattr(ppo, name)


def ppo_trainer_class() -> type:
    """TRL 1.12's ``trl.experimental.ppo.PPOTrainer``; on TRL >= 1.13 (removed) a one-line UserError."""
    return _ppo("PPOTrainer")


def ppo_config_class() -> type:
    """TRL 1.12's ``trl.experimental.ppo.PPOConfig``; on TRL >= 1.13 (removed) a one-line UserError."""
    return _ppo("PPOConfig")


def has_ppo() -> bool:
    """Whether the installed TRL still has PPOTrainer (TRL < 1.13)."""
    return importlib.util.find_spec("trl.experimental.ppo") is not None


def ppo_reward_model_base() -> type:
    """A ``torch.nn.Module`` base that TRL 1.12's private ``trl.experimental.utils.get_reward`` reads as a
    sequence-classification reward model: it calls ``getattr(model, model.base_model_prefix)(input_ids=...,
    attention_mask=...)`` for ``hidden_states``, then ``model.score(hidden_states[-1])``, and takes the
    value at each sequence's last real token. A subclass defines ``sequence_scores(input_ids,
    attention_mask) -> list[float]``; the base broadcasts them over the sequence. If ``get_reward`` reads a
    model differently, PPO with rule rewards scores wrongly or fails.
    """
    from types import SimpleNamespace

    import torch

    class PPORewardModel(torch.nn.Module):
        base_model_prefix = "backbone"

        def __init__(self) -> None:
            super().__init__()
            self.score = torch.nn.Identity()

        def backbone(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> SimpleNamespace:
            values = self.sequence_scores(input_ids, attention_mask)
            scores = torch.tensor(values, dtype=torch.float32, device=input_ids.device)
            hidden = scores[:, None, None].expand(input_ids.shape[0], input_ids.shape[1], 1)
            return SimpleNamespace(hidden_states=(hidden,))

        def sequence_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[float]:
            raise NotImplementedError

    return PPORewardModel


# --- PEFT (0.21) ----------------------------------------------------------------------------------


def peft_saved_adapter_dir(save_dir: Path, adapter_name: str) -> Path:
    """Where PEFT 0.21's ``PeftModel.save_pretrained`` writes a non-``default`` adapter: a subfolder named
    after it (TRL's frozen ``ref`` copy lands in ``ref/``). If PEFT moves it, a saved run adapter would
    carry the KL reference along with the trained adapter."""
    return save_dir / adapter_name


def is_peft_adapter_parameter(name: str) -> bool:
    """Whether a parameter name is one of PEFT 0.21's adapter weights (``lora_A``/``lora_B`` ...) or a
    fully trained ``modules_to_save`` copy. If PEFT renames them, an adapter loaded to continue training
    under Unsloth would stay frozen."""
    return "lora_" in name or "modules_to_save" in name


# --- transformers (5.17) --------------------------------------------------------------------------


def known_trackers() -> frozenset[str]:
    """The ``report_to`` names transformers 5.17 knows (``INTEGRATION_TO_CALLBACK``, undocumented). If it
    moves, every recipe's ``trainer.report_to`` check fails with an ImportError here."""
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    return frozenset(INTEGRATION_TO_CALLBACK)


def tensorboard_writer(callback: Any) -> Any:
    """The ``SummaryWriter`` of transformers 5.17's ``TensorBoardCallback`` (its ``tb_writer`` attribute,
    None before the run opens it). If renamed, the resolved recipe silently stops reaching TensorBoard."""
    return getattr(callback, "tb_writer", None)


def config_name_or_path(config: Any) -> str:
    """The checkpoint a transformers 5.17 config was loaded from (the private ``_name_or_path``; the public
    ``name_or_path`` property is the same value). If it goes, run records lose the base they trained on."""
    return config._name_or_path


def qwen2_pretokenize_regex() -> str:
    """transformers 5.17's ``PRETOKENIZE_REGEX`` from ``models.qwen2.tokenization_qwen2`` (a module
    constant): the tiny model's tokenizer splits text as Qwen2/3 does. If it moves, building the tiny
    model fails with an ImportError here."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    return PRETOKENIZE_REGEX


def wrap_checkpoint_save(trainer: Any, wrap: Any) -> None:
    """Make ``wrap(save)`` this trainer's ``_save_checkpoint(model, trial)``: transformers 5.17's private save of one
    checkpoint, which TRL's trainers override and PPO calls too. If it is renamed, a full disk while saving a
    checkpoint keeps the library's traceback instead of rlkit's one line."""
    trainer._save_checkpoint = wrap(trainer._save_checkpoint)


# --- bitsandbytes (0.50) --------------------------------------------------------------------------


def disable_cpu_bf16_packing(model: Any) -> None:
    """Keep bitsandbytes 0.50's plain nf4 layout on CPU: ``Linear4bit.support_avx512bf16_for_cpu`` makes it
    repack the weights on first use on CPUs with AVX512-BF16, after which dequantizing and merging read
    them wrongly. If the attribute is renamed, setting it does nothing and CPU QLoRA merges go wrong on
    those CPUs only."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


# bitsandbytes 0.50's CPU backend (imported by peft) looks, on CPUs with AVX512-BF16, for the `kernels` package's fused
# 4-bit matmul and else warns to `pip install kernels`; that kernel serves only the packed layout rlkit turns off.
BNB_KERNELS_HINT = "Failed to load CPU gemm_4bit_forward from kernels-community"
BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"


class _NoKernelsHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(BNB_KERNELS_HINT)


def quiet_bnb_kernels_hint() -> None:
    """Drop that one warning, by its text, from bitsandbytes' CPU-ops logger; its other records pass. Call it before
    bitsandbytes is imported (the CLI's logging setup does). If the text changes, the warning shows again."""
    logger = logging.getLogger(BNB_CPU_LOGGER)
    if not any(isinstance(f, _NoKernelsHint) for f in logger.filters):
        logger.addFilter(_NoKernelsHint())


# --- torch (2.13) ---------------------------------------------------------------------------------


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bf16 natively: oneDNN allows it (torch 2.13's private ``torch.ops.mkldnn.
    _is_mkldnn_bf16_supported``, false under ``ONEDNN_MAX_CPU_ISA=AVX2``) and an x86 CPU has AVX512-BF16 or AMX
    (AVX-512 alone passes oneDNN's check at a fifth of float32's speed). If these go, CPU generation raises here."""
    import torch

    x86, cpu = platform.machine().lower() in ("x86_64", "amd64"), torch.cpu
    units = not x86 or cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported() and units)


def torch_huge_pages() -> None:
    """Have torch back each CPU tensor of 2 MiB or more with transparent huge pages, through its own switch
    ``THP_MEM_ALLOC_ENABLE=1`` (c10's ``alloc_cpu`` ``madvise``s such buffers; torch 2.13). rlkit's pinned mmap
    threshold (:mod:`rlkit.cpu_memory`) makes each large tensor a fresh mapping; in 2 MiB pages it faults 512 times
    less: smol_arith_grpo 60 -> 32 s a step, the same losses to the last digit (docs/performance.md). Torch reads it
    at its first CPU allocation (the CLI calls this first); a value the user set wins; Linux only. If torch stops
    reading it, nothing breaks and CPU steps are slower again."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def torch_write_failed(error: BaseException) -> bool:
    """``torch.save`` (2.13) to a full path: its zip writer raises ``RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos N vs M``, no errno. If reworded, a quota hit keeps torch's traceback."""
    return isinstance(error, RuntimeError) and any(s in str(error) for s in ("inline_container.cc", "StreamWriter"))


def safetensors_errno(error: BaseException) -> int | None:
    """The errno of safetensors' (0.8) ``SafetensorError`` for a failed write, from its Rust I/O error text ("... (os
    error 28)"). If reworded, a full disk while saving an adapter keeps its traceback."""
    import re

    found = type(error).__name__ == "SafetensorError" and re.search(r"\(os error (\d+)\)", str(error))
    return int(found.group(1)) if found else None


# --- vLLM (0.27.1) ---------------------------------------------------------------------------------

# The ``max_lora_rank`` values vLLM's ``LoRAConfig`` accepts (``vllm.config.lora.MaxLoRARanks``; its punica
# kernels are built for these), kept here so recipes are checked without vLLM. If vLLM changes them, a
# colocated engine refuses the rank rlkit picks.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# --- Unsloth (2026.10) -----------------------------------------------------------------------------


def keep_unsloth_compiled_cache_in(directory: Path) -> None:
    """Point Unsloth's generated trainer code at ``directory`` (``UNSLOTH_COMPILE_LOCATION``, read by
    unsloth_zoo at import; default ``./unsloth_compiled_cache`` of the working directory). A location the
    user set wins. If Unsloth stops reading it, the cache lands in the working directory again."""
    os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", str(directory))

