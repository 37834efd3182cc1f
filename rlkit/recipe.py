"""Recipes: one YAML file per experiment, validated before any model loads.

rlkit's own sections are strict pydantic models (an unknown key is an error naming the closest
valid key). The ``trainer:`` block uses TRL's field names verbatim and is validated by building
the TRL config class of the recipe's algorithm: rlkit never re-declares TRL's fields.

Order of operations in :func:`load_recipe`: YAML -> ``--smoke`` substitutions -> ``--set``
overrides (so an explicit override wins over smoke) -> schema -> TRL config.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from rlkit.errors import UserError

ALGORITHMS = ("sft", "dpo", "reward", "ppo", "grpo")
# Algorithms whose rewards come from rlkit's reward functions (`rewards:`).
_REWARD_FUNCTION_ALGORITHMS = ("grpo", "ppo", "dpo")
# Recipe keys that rlkit fills from its own sections: setting them in `trainer:` would be ambiguous.
RLKIT_OWNED_TRAINER_KEYS = {
    "output_dir": "use `rlkit train --output-dir DIR` (the run directory)",
    "reward_weights": "set `weight:` on each entry of `rewards:`",
    "chat_template_kwargs": "set `model.chat_template_kwargs` (it reaches training, eval and rollouts alike)",
    "reward_model_path": "set `reward_model:` (a reward run directory or a Hub id)",
    "sft_model_path": "set `model.name_or_path` (and `init_from:` to continue an adapter)",
    "model_adapter_name": "rlkit names the adapters itself when continuing from `init_from:`",
    "ref_adapter_name": "rlkit names the adapters itself when continuing from `init_from:`",
    "max_tool_calling_iterations": "set `env.max_turns` (it bounds training, rollouts and chat alike)",
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ModelSpec(Strict):
    name_or_path: str
    backend: Literal["auto", "unsloth", "hf"] = "auto"
    load_in_4bit: bool = False
    max_seq_length: int = Field(2048, gt=0)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    # Unsloth's colocated vLLM engine takes this share of GPU memory (fast_inference).
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    # transformers' attention kernel; null = its default. Tiny models on CPU run faster with "eager".
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    # Passed to the chat template everywhere the model is prompted, e.g. {enable_thinking: false}.
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)


class LoraSpec(Strict):
    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"
    modules_to_save: list[str] | None = None


class DataSource(Strict):
    """Where rows come from: a Hub id or local file (``path``), or the task's generator."""

    path: str | None = None
    name: str | None = None
    split: str = "train"
    limit: int | None = Field(None, gt=0)
    synthetic: int | None = Field(None, gt=0, description="generate this many rows with the task's generator")
    seed: int = 0
    generator: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the generator")
    # rlkit's column name -> the file's (tasks that map columns, e.g. qa); default: `data.columns`
    columns: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> DataSource:
        if (self.path is None) == (self.synthetic is None):
            raise ValueError("give exactly one of `path` (Hub id or local file) or `synthetic` (row count)")
        return self


class DataSpec(Strict):
    task: str
    train: DataSource
    eval: DataSource | None = None
    # The task's prompt variant (its ``PROMPTS``), e.g. gsm8k `calculator` or multihop_rag `thinking`;
    # for qa and multihop_rag also a file holding the system prompt, or the text itself.
    prompt: str = "default"
    # rlkit's column name -> the user's, for both splits (qa: question, answer, aliases, id, type, supporting_ids).
    columns: dict[str, str] = Field(default_factory=dict)
    # When a rollout episode counts as a success (what `--sft-out` keeps): em | f1>=X | accuracy | task
    # (the task's own rule). Default: the task's rule, which for QA tasks is em.
    success: str | None = Field(None, pattern=r"^(em|accuracy|task|f1\s*>=\s*(0(\.\d+)?|1(\.0+)?|\.\d+))$")

    @model_validator(mode="after")
    def _split_columns(self) -> DataSpec:
        for source in (self.train, self.eval):
            if source is not None and source.columns is None and self.columns:
                source.columns = dict(self.columns)
        return self


class RewardSpec(Strict):
    name: str
    weight: float = 1.0
    args: dict[str, Any] = Field(default_factory=dict)


class PairsSpec(Strict):
    """How ``rlkit pairs`` builds on-policy DPO pairs: sample, score with ``rewards:``, keep best vs worst."""

    prompts: DataSource
    samples: int = Field(8, ge=2, description="completions sampled per prompt")
    min_gap: float = Field(0.5, ge=0, description="keep a pair only when best - worst reward exceeds this")
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int | None = Field(None, gt=0, description="default: eval.max_new_tokens")
    batch_size: int = Field(8, gt=0, description="prompts per generate call (each sampled `samples` times)")
    seed: int = 0


class CorpusFields(Strict):
    """Which of the corpus's columns hold a document's id, title, text and extra metadata."""

    id: str | None = Field(None, description="default: the first of id, doc_id, _id a document has")
    title: str = "title"
    text: str = Field("text", description="`body` is read when a document has no `text`")
    metadata: list[str] = Field(default_factory=list, description="columns kept with each passage and shown")


class RetrievalSpec(Strict):
    """The corpus a ``search`` tool reads, how it is chunked and indexed (``rlkit index build``)."""

    corpus: str | None = Field(None, description="a Hub dataset id or a local .jsonl/.json/.parquet/.csv file")
    corpus_config: str | None = Field(None, description="the Hub dataset's config (MultiHop-RAG: corpus)")
    corpus_split: str = "train"
    synthetic: int | None = Field(None, gt=0, description="generate this many articles instead (smoke runs, tests)")
    seed: int = 0
    # json: an array of objects; hotpotqa: an object keyed by title; multihop_rag: an array of {title, body, ...}
    format: Literal["auto", "jsonl", "json", "hotpotqa", "multihop_rag", "parquet", "csv", "hub"] = "auto"
    fields: CorpusFields = Field(default_factory=CorpusFields)
    chunk_tokens: int = Field(200, gt=0, description="chunk size, counted in `tokenizer`'s tokens (or words, chars)")
    chunk_overlap: int = Field(0, ge=0)
    tokenizer: str | None = Field(None, description="what counts chunk tokens: a tokenizer id or path, `words` or "
                                  "`chars` (no tokenizer needed); default: model.name_or_path")
    method: Literal["bm25", "dense", "hybrid"] = "bm25"
    dense_model: str = "intfloat/e5-base-v2"
    rrf_k: int = Field(60, gt=0, description="reciprocal rank fusion constant (hybrid)")
    top_k: int = Field(3, gt=0, description="passages a search returns")
    cache_dir: str | None = Field(None, description="default: $RLKIT_CACHE/indexes")

    @model_validator(mode="after")
    def _check(self) -> RetrievalSpec:
        if (self.corpus is None) == (self.synthetic is None):
            raise ValueError("give exactly one of `corpus` (Hub id or local file) or `synthetic` (article count)")
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError("chunk_overlap must be smaller than chunk_tokens")
        return self


class EnvSpec(Strict):
    """A tool environment (``rlkit.envs.ENVS``) for GRPO training, rollouts, eval and chat."""

    name: str
    max_turns: int = Field(6, gt=0, description="tool-calling rounds per episode (TRL max_tool_calling_iterations)")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the environment")


class EvalSpec(Strict):
    max_new_tokens: int = Field(512, gt=0)
    batch_size: int = Field(32, gt=0)


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    algorithm: Literal["sft", "dpo", "reward", "ppo", "grpo"]
    model: ModelSpec
    lora: LoraSpec | None = Field(default_factory=LoraSpec)
    init_from: str | None = None
    data: DataSpec
    rewards: list[RewardSpec] = Field(default_factory=list)
    # PPO: a reward run directory (algorithm: reward) or a Hub sequence-classification model, used
    # instead of `rewards:`; the value model starts from the policy's base unless `value_model` names one.
    reward_model: str | None = None
    value_model: str | None = None
    pairs: PairsSpec | None = None
    env: EnvSpec | None = None
    retrieval: RetrievalSpec | None = None
    eval: EvalSpec = Field(default_factory=EvalSpec)
    trainer: dict[str, Any] = Field(default_factory=dict)
    # `rlkit train --num-processes N` launches through accelerate with this config unless
    # --accelerate-config names another: single_gpu | multi_gpu | zero2 | zero3 | fsdp | a YAML path.
    accelerate_config: str | None = None
    # What --smoke changed, for the log and the run's provenance (not part of the recipe itself).
    _smoke_changes: list[str] = PrivateAttr(default_factory=list)

    @property
    def smoke_changes(self) -> list[str]:
        return list(self._smoke_changes)

    @model_validator(mode="after")
    def _algorithm_sections(self) -> Recipe:
        algo = self.algorithm
        if algo == "grpo" and not self.rewards:
            raise ValueError("a grpo recipe needs at least one entry in `rewards:`")
        if algo == "ppo" and bool(self.rewards) == bool(self.reward_model):
            raise ValueError("a ppo recipe needs exactly one reward source: `rewards:` (rule rewards) "
                             "or `reward_model:` (a reward run directory or Hub id)")
        if algo == "dpo" and self.pairs is not None and not self.rewards:
            raise ValueError("`pairs:` scores samples with `rewards:`; add at least one reward")
        if algo not in _REWARD_FUNCTION_ALGORITHMS and self.rewards:
            raise ValueError(f"`rewards:` is not used by {algo} recipes; remove it")
        for key in ("reward_model", "value_model"):
            if algo != "ppo" and getattr(self, key) is not None:
                raise ValueError(f"`{key}:` is only used by ppo recipes; remove it")
        if algo != "dpo" and self.pairs is not None:
            raise ValueError("`pairs:` is only used by dpo recipes (`rlkit pairs`); remove it")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------------------------------------
# Loading


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such recipe file (see `rlkit recipes list`)")
    from rlkit.safety import load_yaml

    try:
        data = load_yaml(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path}:{where} malformed YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe is a YAML mapping (key: value), got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "--set") -> dict[str, Any]:
    """Apply ``a.b=c`` overrides; values are parsed as YAML scalars (``true``, ``5e-6``, ``[a, b]``)."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{source} {item!r}: expected KEY=VALUE, e.g. --set trainer.learning_rate=1e-5")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise UserError(f"{source} {item!r}: the value is not valid YAML; quote it") from None
        value = _yaml_float(value)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(f"{source} {item!r}: '{part}' is not a section, cannot set a key inside it")
            node = child
        node[parts[-1]] = value
    return data


def _yaml_float(value: Any) -> Any:
    # PyYAML (YAML 1.1) reads `5e-6` as a string; everyone means the number.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value.lower() for c in "e.") and value[0] in "+-.0123456789" else value
        except ValueError:
            return value
    return value


def load_recipe(
    path: str | Path,
    overrides: list[str] | None = None,
    smoke: bool = False,
    validate_trainer: bool = True,
) -> Recipe:
    """Read, override and validate a recipe. Raises :class:`UserError` with a one-line message."""
    path = Path(path)
    data = read_yaml(path)
    smoke_changes: list[str] = []
    if smoke:
        from rlkit.smoke import apply_smoke

        data, smoke_changes = apply_smoke(data)
    data = apply_overrides(data, overrides or [])
    recipe = validate(data, source=str(path))
    # The request is checked (unsloth cannot train ppo), but no backend is chosen here: only `rlkit train`
    # imports Unsloth (rlkit.backends.choose), so eval, chat, index, validate and the launcher's parent
    # never pay for it nor fail on it.
    backend_request(recipe)
    if validate_trainer:
        trainer_config(recipe, output_dir="/tmp/rlkit-validate", source=str(path))
    recipe._smoke_changes = smoke_changes
    return recipe


def validate(data: dict[str, Any], source: str = "<recipe>") -> Recipe:
    data = {k: _floats_in(v) for k, v in data.items()}
    _check_finite(data, source)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        raise UserError(f"{source}: {_describe(e, data)}") from None
    from rlkit.data import TASKS

    if recipe.data.task not in TASKS:
        raise UserError(f"{source}: data.task: unknown task {recipe.data.task!r}{_suggest(recipe.data.task, TASKS)}")
    _check_task_prompt(recipe, source)
    _check_env(recipe, source)
    if recipe.algorithm in _REWARD_FUNCTION_ALGORITHMS:
        from rlkit.rewards import resolve_reward

        for i, spec in enumerate(recipe.rewards):
            try:
                resolve_reward(spec.name, spec.args)
            except UserError as e:
                raise UserError(f"{source}: rewards.{i}: {e}") from None
    for key, why in RLKIT_OWNED_TRAINER_KEYS.items():
        if key in recipe.trainer:
            raise UserError(f"{source}: trainer.{key}: set by rlkit; {why}")
    return recipe


def _check_task_prompt(recipe: Recipe, source: str) -> None:
    from rlkit.data import get_task, resolve_prompt

    task = get_task(recipe.data.task)
    columns = {**recipe.data.columns, **(recipe.data.train.columns or {}),
               **((recipe.data.eval.columns if recipe.data.eval else None) or {})}
    valid = getattr(task, "COLUMNS", ())
    for key in columns:
        if key not in valid:
            raise UserError(f"{source}: data.columns.{key}: " + (
                f"task {recipe.data.task!r} maps no columns" if not valid else
                f"not a column of task {recipe.data.task!r}{_suggest(key, valid)}; valid: {', '.join(valid)}"))
    prompts = getattr(task, "PROMPTS", {"default": None})
    if getattr(task, "CUSTOM_PROMPTS", False):
        try:
            resolve_prompt(task, recipe.data.prompt)
        except UserError as e:
            raise UserError(f"{source}: {e}") from None
    elif recipe.data.prompt not in prompts:
        raise UserError(f"{source}: data.prompt: task {recipe.data.task!r} has no prompt {recipe.data.prompt!r}"
                        f"{_suggest(recipe.data.prompt, prompts)}; valid: {', '.join(prompts)}")


def _check_env(recipe: Recipe, source: str) -> None:
    if recipe.env is None:
        if recipe.retrieval is not None:
            raise UserError(f"{source}: retrieval: is read by a tool environment; add `env: {{name: retrieval}}` "
                            "or remove it")
        return
    from rlkit.envs import ENVS, check_env_args

    if recipe.algorithm not in ("grpo", "sft"):
        raise UserError(f"{source}: env: tool environments train with grpo (and sft recipes use them for eval); "
                        f"not {recipe.algorithm}")
    if recipe.env.name not in ENVS:
        raise UserError(f"{source}: env.name: unknown environment {recipe.env.name!r}"
                        f"{_suggest(recipe.env.name, ENVS)}; valid: {', '.join(sorted(ENVS))}")
    if recipe.env.name == "retrieval" and recipe.retrieval is None:
        raise UserError(f"{source}: env retrieval needs a `retrieval:` section (corpus, chunking, top_k)")
    try:
        check_env_args(recipe.env.name, recipe.env.args)
    except UserError as e:
        raise UserError(f"{source}: {e}") from None


def _check_finite(value: Any, source: str, key: str = "") -> None:
    """A NaN or infinite number (`.inf`, `1e999`) anywhere in a recipe trains garbage: refuse it at load."""
    import math

    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, source, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, source, f"{key}.{i}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{source}: {key}: {value} is not a finite number")


def _floats_in(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _floats_in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats_in(v) for v in value]
    return _yaml_float(value)


def _describe(error: ValidationError, data: dict[str, Any]) -> str:
    err = error.errors()[0]
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        valid = _valid_keys(loc[:-1])
        return f"{key}: unknown key{_suggest(loc[-1], valid)}; valid keys here: {', '.join(sorted(valid))}"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    return f"{key}: {msg}{shown}"


def _valid_keys(loc: list[str]) -> list[str]:
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if model is None or part.isdigit():
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field else None
    return list(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None


def _suggest(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ---------------------------------------------------------------------------------------------
# The trainer block -> TRL config

CONFIG_CLASSES = {
    "sft": "trl:SFTConfig",
    "dpo": "trl:DPOConfig",
    "reward": "trl:RewardConfig",
    "ppo": "trl.experimental.ppo:PPOConfig",  # experimental in TRL 1.12, removed in 1.13 (hence the pin)
    "grpo": "trl:GRPOConfig",
}


def config_class(algorithm: str) -> type:
    import importlib
    import os

    module, _, name = CONFIG_CLASSES[algorithm].partition(":")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rlkit pins TRL; the warning says nothing new
    return getattr(importlib.import_module(module), name)


def backend_request(recipe: Recipe) -> str:
    """The backend to ask for: the recipe's, except that reward and PPO runs always use hf.

    Unsloth patches SFT, DPO and GRPO; TRL's RewardTrainer and experimental PPOTrainer take plain
    transformers models (sequence-classification heads for reward and value), so ``auto`` means hf.
    """
    if recipe.algorithm in ("reward", "ppo"):
        if recipe.model.backend == "unsloth":
            raise UserError(f"model.backend: unsloth does not support {recipe.algorithm} training; "
                            "use `backend: hf` or `auto`")
        return "hf"
    from rlkit.vllm_serve import server_mode

    if server_mode(recipe) and recipe.model.backend == "auto":
        return "hf"  # Unsloth generates with its own colocated engine, never a vLLM server
    return recipe.model.backend


def trainer_config(recipe: Recipe, output_dir: str, source: str = "<recipe>", backend: str | None = None) -> Any:
    """Build the TRL config for ``recipe``: its ``trainer:`` block plus the fields rlkit decides.

    Device-dependent defaults are filled for this machine (see :func:`device_defaults`), so a GPU
    recipe validates on a laptop without a GPU. Where a backend replaced TRL's config class (Unsloth),
    unset fields keep TRL's defaults and ``backend`` names it in the check of what it changed
    (:mod:`rlkit.backends.trl_config`).
    """
    import dataclasses

    from pydantic import TypeAdapter

    cls = config_class(recipe.algorithm)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in recipe.trainer.items():
        if key not in fields:
            raise UserError(f"{source}: trainer.{key}: not a {cls.__name__} field{_suggest(key, fields)}")
        kwargs[key] = _coerce(cls, key, value, source, TypeAdapter)
    kwargs.update(device_defaults(recipe))
    from rlkit.trainers import builder

    algo = builder(recipe.algorithm)
    if hasattr(algo, "rlkit_fields"):
        kwargs.update(algo.rlkit_fields(recipe))
    from rlkit.backends.trl_config import check_backend_changes, with_trl_defaults

    kwargs = with_trl_defaults(cls, kwargs)
    try:
        config = cls(output_dir=output_dir, **kwargs)
    except (ValueError, TypeError) as e:
        raise UserError(f"{source}: trainer: {cls.__name__} rejected the settings: {str(e).splitlines()[0]}") from None
    check_backend_changes(config, {"output_dir": output_dir, **kwargs}, backend or "current")
    if hasattr(algo, "check_config"):  # what the trainer, not the config class, would reject
        algo.check_config(config, source)
    from rlkit.tracking import check as check_trackers

    check_trackers(config.report_to or [], source)
    return config


def _coerce(cls: type, key: str, value: Any, source: str, adapter: Any) -> Any:
    import typing

    try:
        annotation = typing.get_type_hints(cls)[key]
    except Exception:  # an annotation TRL's module cannot resolve at runtime: let TRL judge the value
        return value
    try:
        return adapter(annotation).validate_python(value)
    except ValidationError as e:
        msg = e.errors()[0]["msg"]
        raise UserError(f"{source}: trainer.{key}: {msg} (got {value!r})") from None
    except Exception:  # pydantic cannot build a validator for this annotation: let TRL judge it
        return value


def device_defaults(recipe: Recipe, cuda: bool | None = None, bf16_supported: bool | None = None) -> dict[str, Any]:
    """Fields that depend on the machine: TRL defaults to bf16, which a CPU-only machine and pre-Ampere
    GPUs (T4, V100) lack; there TRL's config raises, so rlkit trains in fp16 mixed precision instead."""
    if cuda is None:
        cuda = cuda_available()
    if not cuda:
        out: dict[str, Any] = {"use_cpu": True}
        if "bf16" not in recipe.trainer:
            out["bf16"] = False
        return out
    if bf16_supported is None:
        import torch

        bf16_supported = torch.cuda.is_bf16_supported()
    if bf16_supported or "bf16" in recipe.trainer:
        return {}
    return {"bf16": False, **({} if "fp16" in recipe.trainer else {"fp16": True})}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------
# Shipped recipes


def recipes_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "recipes"


def shipped_recipes() -> list[Path]:
    return sorted(recipes_dir().glob("*.yaml"))


def find_recipe(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for candidate in (recipes_dir() / name_or_path, recipes_dir() / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    names = [p.stem for p in shipped_recipes()]
    raise UserError(f"{name_or_path}: no such recipe file or shipped recipe{_suggest(name_or_path, names)}; "
                    f"shipped: {', '.join(names)}")


def recipe_header(path: Path) -> str:
    """The recipe's leading comment block (purpose, hardware, command)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return "\n".join(lines)
