"""The recipe schema: one YAML file per experiment, as strict pydantic models (nothing else imported).

rlkit's own sections are strict (an unknown key is an error naming the closest valid key). The
``trainer:`` block uses TRL's field names verbatim and is checked against the TRL config class of the
recipe's algorithm when that config is built (:func:`rlkit.trainers.trainer_config`): rlkit never
re-declares TRL's fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

ALGORITHMS = ("sft", "dpo", "reward", "ppo", "grpo")
# Algorithms whose rewards come from rlkit's reward functions (`rewards:`).
REWARD_FUNCTION_ALGORITHMS = ("grpo", "ppo", "dpo")
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
    # for gsm8k, qa and multihop_rag also a file holding the system prompt, or the text itself.
    prompt: str = "default"
    # gsm8k: whose worked turns follow the system prompt (a prompt variant with them: short, alt); default the
    # prompt variant's own, none for a prompt file or text. `rlkit optimize-prompt` keeps a recipe's this way.
    shots: str | None = None
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


class McpServerSpec(Strict):
    """An MCP server for ``env: {name: mcp}``: a command rlkit starts (stdio), or the URL of a running one."""

    command: str | None = Field(None, description="the executable; rlkit starts it once per run and stops it")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for the server (the MCP "
                                "SDK passes only HOME, PATH, SHELL, TERM, USER and LOGNAME otherwise)")
    cwd: str | None = None
    url: str | None = Field(None, description="a streamable-HTTP endpoint, e.g. http://127.0.0.1:8765/mcp")
    startup_timeout: float = Field(60.0, gt=0, description="seconds to connect and list the tools")

    @model_validator(mode="after")
    def _one_server(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (rlkit starts the server) or `url` (a running server)")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("`args`, `env` and `cwd` go with `command`; a `url` server is already running")
        return self


class EnvSpec(Strict):
    """A tool environment (``rlkit.envs.ENVS``) for GRPO training, rollouts, eval and chat."""

    name: str
    max_turns: int = Field(6, gt=0, description="tool-calling rounds per episode (TRL max_tool_calling_iterations)")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the environment")
    # env mcp only: the server, which of its tools the model gets (default all), seconds per call.
    server: McpServerSpec | None = None
    tools: list[str] | None = Field(None, min_length=1)
    timeout: float | None = Field(None, gt=0, description="env mcp: seconds a tool call may take (default 30)")

    @model_validator(mode="after")
    def _mcp_keys(self) -> EnvSpec:
        if self.name == "mcp":
            if self.server is None:
                raise ValueError("env mcp needs `server:` ({command: ..., args: [...]} or {url: ...})")
            self.timeout = 30.0 if self.timeout is None else self.timeout
        else:
            for key in ("server", "tools", "timeout"):
                if getattr(self, key) is not None:
                    raise ValueError(f"`env.{key}` is for `name: mcp` environments; remove it")
        return self


class IFEvalSpec(Strict):
    """``rlkit eval --ifeval FILE`` and the demos' IFEval check: how many prompts, how long a reply, and how
    far the trained model's prompt-strict accuracy may fall below its base's before it is flagged."""

    limit: int | None = Field(None, gt=0, description="the first N prompts of the file (default: all 541)")
    max_new_tokens: int = Field(1280, gt=0, description="per reply; lm-eval's IFEval task generates up to 1280")
    tolerance: float = Field(0.05, ge=0, le=1, description="flag a drop in prompt-strict accuracy larger than this")


class EvalSpec(Strict):
    max_new_tokens: int = Field(512, gt=0)
    batch_size: int = Field(32, gt=0)
    agent_every: int | None = Field(None, gt=0, description="GRPO with an env: score the agent on held-out "
                                    "questions every N steps, keep the best adapter (rlkit.evaluate.during)")
    agent_limit: int = Field(20, gt=0, description="held-out questions per agent eval during training")
    ifeval: IFEvalSpec = Field(default_factory=IFEvalSpec)


class PoolSpec(Strict):
    """GRPO's prompt pool: the starting model's pass rate on each train prompt, measured before training."""

    keep: Literal["learnable", "all"] = Field("learnable", description="learnable: train only on prompts whose "
                                              "pass rate is strictly between 0 and 1; all: measure, keep every prompt")
    samples: int = Field(8, ge=2, description="completions sampled per prompt at the trainer's temperature")
    limit: int = Field(256, gt=0, description="probe the first N train prompts (with keep: learnable, the others "
                       "are not trained on)")


class SamplingSpec(Strict):
    """GRPO only: which prompts and groups reach the loss (rlkit's hooks around TRL's GRPOTrainer)."""

    dynamic: bool = Field(False, description="drop groups whose rewards are all equal and refill the batch with "
                          "groups of new prompts (DAPO's dynamic sampling)")
    max_rounds: int = Field(2, gt=0, description="extra generation rounds per batch at most; a batch still short "
                            "after them is filled with dropped groups")
    refill: bool = Field(True, description="false: no new prompts; the loss is computed on the groups with signal "
                         "alone (a smaller batch, a cheaper step; padded to a multiple of steps_per_generation)")
    pool: PoolSpec | None = None


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
    sampling: SamplingSpec | None = None
    trainer: dict[str, Any] = Field(default_factory=dict)
    # `rlkit train --num-processes N` launches through accelerate with this config unless
    # --accelerate-config names another: single_gpu | multi_gpu | zero2 | zero3 | fsdp | a YAML path.
    accelerate_config: str | None = None
    # What --smoke changed, for the log and the run's provenance (not part of the recipe itself).
    _smoke_changes: list[str] = PrivateAttr(default_factory=list)

    @property
    def smoke_changes(self) -> list[str]:
        return list(self._smoke_changes)

    @property
    def vllm_server_mode(self) -> bool:
        """The recipe generates through a separate vLLM server (``use_vllm: true, vllm_mode: server``)."""
        return bool(self.trainer.get("use_vllm")) and self.trainer.get("vllm_mode", "colocate") == "server"

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
        if algo not in REWARD_FUNCTION_ALGORITHMS and self.rewards:
            raise ValueError(f"`rewards:` is not used by {algo} recipes; remove it")
        for key in ("reward_model", "value_model"):
            if algo != "ppo" and getattr(self, key) is not None:
                raise ValueError(f"`{key}:` is only used by ppo recipes; remove it")
        if algo != "grpo" and self.sampling is not None:
            raise ValueError(f"`sampling:` (dynamic sampling, the prompt pool) is only used by grpo recipes; remove it "
                             f"from this {algo} recipe")
        if algo != "dpo" and self.pairs is not None:
            raise ValueError("`pairs:` is only used by dpo recipes (`rlkit pairs`); remove it")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
