"""``rlkit doctor RECIPE``: what would go wrong, found before the GPU-hours are spent.

Each check family is one module and returns :class:`Check` rows (a verdict, the evidence and the fix):

- :mod:`.template`   chat template: prefix preservation, think blocks, tool-call round trip, loss masks
                     on real rows, the end-of-turn token, truncation
- :mod:`.rewards`    the reward card: gold answers and adversarial completions through every reward
- :mod:`.learn`      learnability: K samples per prompt, pass@1/pass@K, groups with zero reward variance
- :mod:`.memory`     memory plan for a GPU (weights, LoRA + optimizer, activations, reference, vLLM KV cache)
- :mod:`.cpu_plan`   without a GPU: peak RSS of a GRPO step on CPU against this machine's RAM, from measured costs
- :mod:`.arith`      TRL's batch arithmetic, steps per epoch, tokens per step, time per step from bench figures
- :mod:`.versions`   installed packages against rlkit's supported ranges; CUDA and the driver

A ``fail`` blocks the launch (``rlkit doctor`` exits 1 and ``rlkit train`` refuses); ``warn`` is worth
reading; ``skip`` says what was not checked and why. ``rlkit train`` runs the cheap families (template,
rewards, arithmetic, versions) before it loads the model.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlkit.recipe import Recipe

VERDICTS = ("ok", "warn", "fail", "skip")
FAMILIES = ("template", "rewards", "learnability", "memory", "config", "versions")
CHEAP = ("template", "rewards", "config", "versions")


class Refused(Exception):
    """``rlkit train`` stops here: a blocking check failed (exit 1, one line)."""


@dataclasses.dataclass
class Check:
    family: str
    name: str
    verdict: str
    evidence: str
    fix: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")


@dataclasses.dataclass
class Report:
    recipe: str
    checks: list[Check]
    tables: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def blocking(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == "fail"]

    @property
    def go(self) -> bool:
        return not self.blocking

    def summary(self) -> str:
        """One line: the verdict and the first blocking checks."""
        if self.go:
            warns = sum(c.verdict == "warn" for c in self.checks)
            return f"go: {len(self.checks)} checks, {warns} warnings"
        first = "; ".join(f"{c.family}/{c.name}: {c.evidence}" for c in self.blocking[:2])
        more = f" (+{len(self.blocking) - 2} more)" if len(self.blocking) > 2 else ""
        return f"no-go: {first}{more}"

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "go": self.go, "summary": self.summary(),
                "checks": [dataclasses.asdict(c) for c in self.checks], "tables": self.tables,
                "seconds": self.seconds}


class Context:
    """What the checks share: the recipe, its TRL config (or why it failed), the tokenizer and data rows.

    Everything is loaded lazily and once, so the cheap checks that ``rlkit train`` runs cost only what
    they read.
    """

    def __init__(self, recipe: Recipe, source: str, *, limit: int = 8, smoke: bool = False,
                 before_training: bool = False) -> None:
        self.recipe, self.source, self.limit, self.smoke = recipe, source, limit, smoke
        # Inside `rlkit train`: what rlkit's trainer builders refuse or fix themselves is left to them.
        self.before_training = before_training
        self._cache: dict[str, Any] = {}

    def _once(self, key: str, build: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    @property
    def config(self) -> tuple[Any, str | None]:
        """(TRL config, None) or (None, the one-line reason TRL refused it)."""
        from rlkit.errors import UserError
        from rlkit.trainers import trainer_config

        def build():
            try:
                return trainer_config(self.recipe, output_dir="/tmp/rlkit-doctor", source=self.source), None
            except UserError as e:
                return None, str(e).removeprefix(f"{self.source}: ")

        return self._once("config", build)

    def setting(self, key: str, default: Any = None) -> Any:
        """A trainer setting: from the built TRL config, else the recipe's value, else TRL's default."""
        cfg, _ = self.config
        if cfg is not None:
            return getattr(cfg, key, default)
        if key in self.recipe.trainer:
            return self.recipe.trainer[key]
        from rlkit.trainers import config_class

        fields = {f.name: f for f in dataclasses.fields(config_class(self.recipe.algorithm))}
        field = fields.get(key)
        if field is None:
            return default
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return default

    @property
    def tokenizer(self) -> Any:
        from rlkit.backends.hf import load_tokenizer
        from rlkit.tiny import resolve_model_id

        return self._once("tokenizer", lambda: load_tokenizer(resolve_model_id(self.recipe.model.name_or_path)))

    @property
    def raw_rows(self) -> Any:
        """The train split as the task loads it (the form ``--write-filtered`` writes back)."""
        from rlkit.data import load_rows

        return self._once("raw_rows", lambda: load_rows(self.recipe.data.task, self.recipe.data.train))

    @property
    def train_rows(self) -> Any:
        """Trainer-ready rows of the train split (the first ``limit`` of them); None for pairwise data."""
        def build():
            from rlkit.data import load_preference_rows, task_rows

            algo = self.recipe.algorithm
            if algo in ("dpo", "reward"):
                if algo == "dpo" and self.recipe.pairs is not None and self.recipe.data.train.synthetic is None:
                    return None  # pairs are sampled later by `rlkit pairs`
                return _head(load_preference_rows(self.recipe.data.task, self.recipe.data.train), self.limit)
            kind = {"sft": "sft", "grpo": "grpo", "ppo": "prompt"}[algo]
            raw = _head(self.raw_rows, self.limit)
            if kind == "prompt":
                from rlkit.data import Sampled, get_task

                task = get_task(self.recipe.data.task)
                return task.prompt_rows(raw) if isinstance(task, Sampled) else None
            return task_rows(self.recipe, kind, raw)

        return self._once("train_rows", build)

    @property
    def scored_rows(self) -> Any:
        """Rows with prompts and the columns rewards read (grpo rows, or prompt rows for ppo/dpo)."""
        def build():
            if self.recipe.algorithm == "grpo":
                return self.train_rows
            from rlkit.data import Sampled, get_task

            task = get_task(self.recipe.data.task)
            if not isinstance(task, Sampled):
                return None
            source = self.recipe.pairs.prompts if self.recipe.pairs is not None else self.recipe.data.train
            from rlkit.data import load_rows

            return task.prompt_rows(_head(load_rows(self.recipe.data.task, source), self.limit))

        return self._once("scored_rows", build)


def _head(ds: Any, n: int) -> Any:
    return ds.select(range(min(n, len(ds))))


def run(recipe_path: str | Path, overrides: list[str] | None = None, *, smoke: bool = False,
        families: tuple[str, ...] = FAMILIES, samples: int | None = None, limit: int = 8,
        gpu: str | None = None, endpoint: str | None = None, api_key: str | None = None,
        write_filtered: str | Path | None = None, recipe: Recipe = None, before_training: bool = False) -> Report:
    """Run the check ``families`` on a recipe and return the report (nothing is written here).

    ``before_training``: called by ``rlkit train``, where data or model files that cannot be read stay
    user errors (exit 2, the message training would give) instead of becoming a failed check.
    """
    from rlkit.errors import UserError
    from rlkit.recipe import load_recipe

    source = str(recipe_path)
    if recipe is None:
        recipe = load_recipe(recipe_path, overrides, smoke=smoke)
    ctx = Context(recipe, source, limit=limit, smoke=smoke, before_training=before_training)
    report = Report(recipe=source, checks=[])
    for family in families:
        started = time.perf_counter()
        try:
            checks, tables = _family(family, ctx, samples=samples, gpu=gpu, endpoint=endpoint, api_key=api_key,
                                     write_filtered=write_filtered)
        except UserError as e:
            if before_training or (family == "learnability" and endpoint):
                raise  # the user's input (a wrong --endpoint, unreadable data), not the recipe's fitness
            # The data (or the model's files) cannot be read: training would stop at the same place.
            checks, tables = [Check(family, "inputs", "fail", str(e), "fix the recipe's data or model entry")], {}
            if any(c.evidence == str(e) for c in report.checks):
                checks = [Check(family, "inputs", "skip", "not checked: its inputs failed above")]
        report.checks.extend(checks)
        report.tables.update(tables)
        report.seconds[family] = round(time.perf_counter() - started, 3)
    return report


def _family(family: str, ctx: Context, **options: Any) -> tuple[list[Check], dict[str, list[dict[str, Any]]]]:
    if family == "template":
        from rlkit.doctor import template, tools

        env_tools = tools.checks(ctx)
        if any(c.verdict == "fail" for c in env_tools):  # the template checks render those tools
            return env_tools, {}
        return env_tools + template.checks(ctx), {}
    if family == "rewards":
        from rlkit.doctor import rewards

        return rewards.checks(ctx)
    if family == "learnability":
        from rlkit.doctor import learn

        return learn.checks(ctx, samples=options["samples"], endpoint=options["endpoint"],
                            api_key=options["api_key"], write_filtered=options["write_filtered"])
    if family == "memory":
        from rlkit.backends import cuda_available
        from rlkit.doctor import cpu_plan, memory

        if options["gpu"] is None and not cuda_available():  # no GPU to plan for: this machine's RAM
            return cpu_plan.checks(ctx)
        return memory.checks(ctx, gpu=options["gpu"])
    if family == "config":
        from rlkit.doctor import arith

        return arith.checks(ctx), {}
    if family == "versions":
        from rlkit.doctor import versions

        return versions.checks(ctx), {}
    raise ValueError(f"unknown check family {family!r}")
