"""Recipes: one YAML file per experiment, validated before any model loads.

:mod:`~rlkit.recipe.schema` is the schema (pydantic models only), :mod:`~rlkit.recipe.load` reads a file
(YAML, ``--smoke`` from :mod:`~rlkit.recipe.smoke`, ``--set``) and checks the names it uses against the
task, environment and reward registries, and :mod:`~rlkit.recipe.catalogue` finds the shipped recipes.
Nothing here imports torch, transformers or trl.
"""

from rlkit.recipe.catalogue import find_recipe, recipe_header, recipes_dir, shipped_recipes
from rlkit.recipe.load import apply_overrides, load_recipe, read_yaml, validate
from rlkit.recipe.schema import (
    ALGORITHMS,
    RLKIT_OWNED_TRAINER_KEYS,
    CorpusFields,
    DataSource,
    DataSpec,
    EnvSpec,
    EvalSpec,
    LoraSpec,
    ModelSpec,
    PairsSpec,
    Recipe,
    RetrievalSpec,
    RewardSpec,
)

__all__ = ["ALGORITHMS", "RLKIT_OWNED_TRAINER_KEYS", "CorpusFields", "DataSource", "DataSpec", "EnvSpec", "EvalSpec",
           "LoraSpec", "ModelSpec", "PairsSpec", "Recipe", "RetrievalSpec", "RewardSpec", "apply_overrides",
           "find_recipe", "load_recipe", "read_yaml", "recipe_header", "recipes_dir", "shipped_recipes", "validate"]
