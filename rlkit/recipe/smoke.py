"""``--smoke``: the same recipe shrunk to run in seconds on a CPU with no downloads.

It swaps in the built-in tiny model, a couple of steps and CPU-safe settings, and reports every change
it made. Data on the Hub becomes generated data in the task's format; a local data file or corpus file is
kept (the first 32 training and 8 eval rows), so a user's own data goes through the whole pipeline.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rlkit.tiny import TINY_MODEL

# trainer keys rlkit sets for a smoke run; all are TRL field names.
_TRAINER = {
    "max_steps": 2,
    "logging_steps": 1,
    "warmup_steps": 0,
    "warmup_ratio": None,
    "save_steps": 2,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "gradient_checkpointing": False,
    "report_to": "none",
    "dataloader_num_workers": 0,
    "bf16": False,
    "fp16": False,
}
_GRPO = {"use_vllm": False, "num_generations": 4, "max_completion_length": 24, "steps_per_generation": None,
         "generation_batch_size": None, "log_completions": False}
_SFT = {"max_length": 256, "packing": False}
_PAIRWISE = {"max_length": 256}  # dpo and reward
_PPO = {"total_episodes": 8, "response_length": 24, "num_ppo_epochs": 1, "num_mini_batches": 1,
        "local_rollout_forward_batch_size": 4, "num_sample_generations": 0, "per_device_eval_batch_size": 4}
_ALGORITHM = {"grpo": _GRPO, "sft": _SFT, "dpo": _PAIRWISE, "reward": _PAIRWISE, "ppo": _PPO}
_CPU_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")


def apply_smoke(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    data = copy.deepcopy(data)
    changes: list[str] = []

    def put(section: dict, key: str, value: Any, path: str) -> None:
        old = section.get(key, "<unset>")
        if value is None:
            if key in section:
                del section[key]
                changes.append(f"{path}: {old!r} -> <TRL default>")
            return
        if old != value:
            section[key] = value
            changes.append(f"{path}: {old!r} -> {value!r}")

    model = data.setdefault("model", {})
    put(model, "name_or_path", TINY_MODEL, "model.name_or_path")
    put(model, "backend", "hf", "model.backend")
    put(model, "load_in_4bit", False, "model.load_in_4bit")
    # Agent prompts carry a system prompt and tool schemas (~550 tokens) plus room for tool rounds.
    put(model, "max_seq_length", 1024 if data.get("env") else 512, "model.max_seq_length")
    put(model, "attn_implementation", "eager", "model.attn_implementation")
    if isinstance(data.get("lora"), dict):
        put(data["lora"], "r", 8, "lora.r")
        put(data["lora"], "alpha", 16, "lora.alpha")
    if data.get("init_from"):
        put(data, "init_from", None, "init_from")
    # A reward model becomes the tiny model with a new (random) score head; the value model its default.
    if data.get("reward_model"):
        put(data, "reward_model", TINY_MODEL, "reward_model")
    if data.get("value_model"):
        put(data, "value_model", None, "value_model")
    if isinstance(data.get("pairs"), dict):
        put(data["pairs"], "prompts", {"synthetic": 4, "seed": 2}, "pairs.prompts")
        put(data["pairs"], "samples", 4, "pairs.samples")
        put(data["pairs"], "max_new_tokens", 24, "pairs.max_new_tokens")
    if isinstance(data.get("env"), dict):
        put(data["env"], "max_turns", 2, "env.max_turns")
        _smoke_serve_search(data["env"], put)
    if isinstance(data.get("retrieval"), dict):  # a local corpus, or a generated news corpus, indexed with BM25
        retrieval = data["retrieval"]
        if not _local_file(retrieval.get("corpus")):
            put(retrieval, "corpus", None, "retrieval.corpus")
            put(retrieval, "synthetic", 40, "retrieval.synthetic")
            for key in ("format", "fields", "corpus_config", "corpus_split"):
                put(retrieval, key, None, f"retrieval.{key}")
        put(retrieval, "method", "bm25", "retrieval.method")
        if retrieval.get("tokenizer") not in ("words", "chars"):  # those need no download
            put(retrieval, "tokenizer", None, "retrieval.tokenizer")
    task_data = data.setdefault("data", {})
    for split, rows, seed in (("train", 32, 0), ("eval", 8, 1)):
        source = task_data.get(split)
        if isinstance(source, dict) and _local_file(source.get("path")):
            put(source, "limit", min(source.get("limit") or rows, rows), f"data.{split}.limit")
        else:
            put(task_data, split, {"synthetic": rows, "seed": seed}, f"data.{split}")
    evals = data.setdefault("eval", {})
    put(evals, "max_new_tokens", 24, "eval.max_new_tokens")
    if isinstance(evals.get("ifeval", {}), dict):  # `rlkit eval --ifeval --smoke`: a few prompts, short replies
        ifeval = evals.setdefault("ifeval", {})
        put(ifeval, "limit", min(ifeval.get("limit") or 8, 8), "eval.ifeval.limit")
        put(ifeval, "max_new_tokens", 24, "eval.ifeval.max_new_tokens")

    trainer = data.setdefault("trainer", {})
    algorithm = data.get("algorithm")
    wanted = {**_TRAINER, **_ALGORITHM.get(algorithm, {})}
    if algorithm == "grpo" and data.get("env"):
        wanted["max_completion_length"] = 160  # room for a tool call, its result and an answer
    if algorithm == "sft" and data.get("env"):
        wanted["max_length"] = 768  # whole tool trajectories: system prompt, tool schemas, results
    for key, value in wanted.items():
        put(trainer, key, value, f"trainer.{key}")
    if trainer.get("optim", "adamw_torch") not in _CPU_OPTIMIZERS:
        put(trainer, "optim", "adamw_torch", "trainer.optim")
    return data, changes


def _smoke_serve_search(env: dict[str, Any], put: Any) -> None:
    """An ``env: mcp`` server that is ``rlkit serve-search`` serves the smoke corpus too (``--smoke``), run by this
    very rlkit (this interpreter, this package on its path), so the check needs no install and no download."""
    server = env.get("server")
    if env.get("name") != "mcp" or not isinstance(server, dict) or not isinstance(server.get("args"), list):
        return
    args = [str(a) for a in server["args"]]
    command = str(server.get("command", ""))
    if command.endswith("python") or command.endswith("python3"):
        args = args[2:] if args[:2] == ["-m", "rlkit"] else []
    elif not command.endswith("rlkit"):
        return
    if not args or args[0] != "serve-search":
        return
    import sys

    put(server, "command", sys.executable, "env.server.command")
    put(server, "args", ["-m", "rlkit", *args, *([] if "--smoke" in args else ["--smoke"])], "env.server.args")
    root = str(Path(__file__).resolve().parents[2])  # the checkout (or site-packages) holding this rlkit
    put(server, "env", {**(server.get("env") or {}), "PYTHONPATH": root}, "env.server.env")


def _local_file(path: Any) -> bool:
    return isinstance(path, str) and Path(path).expanduser().is_file()
