"""``rlkit vllm-serve RECIPE``: TRL's vLLM server for a GRPO recipe with ``vllm_mode: server``.

In server mode TRL's GRPOTrainer sends every rank's prompts to one vLLM server on GPUs of its own and, after each
optimizer step, pushes the trained weights into it (LoRA merged first) over NCCL. rlkit only builds the
``trl vllm-serve`` command from the recipe, so the server serves the model the trainer trains, on the address the
trainer connects to; TRL 1.12's ``trl vllm-serve`` in turn runs ``vllm serve`` with the settings TRL's client
needs (NCCL weight transfer, processed logprobs). Pick the server's GPUs with ``CUDA_VISIBLE_DEVICES``.

Recipe -> server flags (anything else goes after the recipe and is passed on as is):

    model.name_or_path              --model (rlkit's tiny pseudo ids become their local build)
    model.dtype                     --dtype
    trainer.vllm_max_model_length   --max_model_len (default: model.max_seq_length)
    trainer.vllm_server_base_url    --port (from the URL; the server listens on every interface)
    trainer.vllm_server_host/_port  --host / --port (TRL's defaults: 0.0.0.0, 8000)
    trainer.vllm_tensor_parallel_size, vllm_gpu_memory_utilization, vllm_model_impl, trust_remote_code
                                    --tensor_parallel_size, --gpu_memory_utilization, --vllm_model_impl,
                                    --trust_remote_code: only when the recipe sets them. TRL reads the first two
                                    only in colocate mode and asks for them "separately when launching the vLLM
                                    server", which is this; otherwise the server keeps TRL's server defaults
                                    (tensor parallel 1, 0.9 of the GPU).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

from rlkit.backends import cuda_available, prepare_vllm_env
from rlkit.errors import UserError
from rlkit.recipe import Recipe, load_recipe
from rlkit.tiny import resolve_model_id
from rlkit.trainers import check_trainer

log = logging.getLogger("rlkit")

# TRL GRPOConfig field -> `trl vllm-serve` flag, passed only when the recipe sets the field.
_SERVER_FLAGS = {
    "vllm_tensor_parallel_size": "--tensor_parallel_size",
    "vllm_gpu_memory_utilization": "--gpu_memory_utilization",
    "vllm_model_impl": "--vllm_model_impl",
}
_DEFAULT_HOST, _DEFAULT_PORT = "0.0.0.0", 8000  # GRPOConfig's vllm_server_host / vllm_server_port defaults


def prequantized(name: str) -> bool:
    """A checkpoint saved already quantized by bitsandbytes (``unsloth/Qwen3-1.7B-unsloth-bnb-4bit``,
    ``...-bnb-4bit``): 4-bit whatever ``load_in_4bit`` says."""
    return "bnb-4bit" in name.lower() or "bnb_4bit" in name.lower()


def check_server_mode(recipe: Recipe, backend: str | None = None) -> None:
    """Refuse what TRL 1.12's server mode cannot train: a 4-bit base, or Unsloth's colocated engine.

    ``backend`` is the one the run will use (``hf`` or ``unsloth``); None: the recipe's request.
    """
    if not recipe.vllm_server_mode:
        return
    if recipe.model.load_in_4bit or prequantized(recipe.model.name_or_path):
        # Merging LoRA into a bitsandbytes 4-bit base keeps it packed in 4 bits, and the server expects 16-bit
        # tensors of the full shape: the first weight sync fails (trl#4973).
        raise UserError("trainer.vllm_mode server pushes the merged weights to the server, which TRL cannot do from "
                        "a 4-bit base (trl#4973); set model.load_in_4bit: false (16-bit LoRA) or use vllm_mode: "
                        "colocate with backend: unsloth")
    if (backend or recipe.model.backend) == "unsloth":
        raise UserError("trainer.vllm_mode server: Unsloth generates with its own colocated vLLM engine; use "
                        "backend: hf for a vLLM server")


def server_address(trainer: dict[str, Any]) -> tuple[str, int]:
    """``(host to listen on, port)`` for the address the recipe's trainer connects to."""
    base_url = trainer.get("vllm_server_base_url")
    if base_url:
        parsed = urlparse(str(base_url))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UserError(f"trainer.vllm_server_base_url {base_url!r}: expected a URL like http://gpu-node:8000")
        # The URL names the server as the trainers reach it, not an interface to bind: listen on all of them.
        return _DEFAULT_HOST, parsed.port or (443 if parsed.scheme == "https" else 80)
    return str(trainer.get("vllm_server_host", _DEFAULT_HOST)), int(trainer.get("vllm_server_port", _DEFAULT_PORT))


def serve_command(recipe: Recipe, extra_args: Sequence[str] = ()) -> list[str]:
    """The ``trl vllm-serve`` command (as ``python -m trl.scripts.vllm_serve``) for ``recipe``'s model.

    ``extra_args`` come last: a ``trl vllm-serve`` flag given again there wins (argparse keeps the last), and
    flags it does not know go on to ``vllm serve``.
    """
    if not recipe.vllm_server_mode:
        raise UserError("the recipe does not generate with a vLLM server; set trainer.use_vllm: true and "
                        "trainer.vllm_mode: server (or --set trainer.use_vllm=true --set trainer.vllm_mode=server)")
    check_server_mode(recipe)
    trainer = recipe.trainer
    host, port = server_address(trainer)
    max_len = trainer.get("vllm_max_model_length") or recipe.model.max_seq_length
    cmd = [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", resolve_model_id(recipe.model.name_or_path),
           "--host", host, "--port", str(port), "--dtype", recipe.model.dtype, "--max_model_len", str(max_len)]
    for key, flag in _SERVER_FLAGS.items():
        if trainer.get(key) is not None:
            cmd += [flag, str(trainer[key])]
    if trainer.get("trust_remote_code"):
        cmd.append("--trust_remote_code")
    return [*cmd, *extra_args]


def serve(recipe_path: str | Path, overrides: Sequence[str] = (), smoke: bool = False,
          extra_args: Sequence[str] = ()) -> NoReturn:
    """Check the machine, then replace this process with the server (it runs until stopped)."""
    recipe = load_recipe(recipe_path, list(overrides), smoke=smoke)
    check_trainer(recipe, source=str(recipe_path))
    cmd = serve_command(recipe, extra_args)
    if importlib.util.find_spec("vllm") is None:
        raise UserError("vllm-serve: vLLM is not installed; on the GPU machine `pip install 'rlkit[gpu]'`")
    if not cuda_available():
        raise UserError("vllm-serve: vLLM needs a CUDA GPU and this machine has none")
    prepare_vllm_env()  # the server inherits this process's environment
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    log.info("vLLM server for %s on GPUs %s: %s", recipe.name, gpus, shlex.join(cmd))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)
