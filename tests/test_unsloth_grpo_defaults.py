"""Unsloth's GRPOConfig resolves its ``None`` sentinels with code it generates (unsloth/models/rl.py,
2026.10.9, lines 3522-3581). That code is reproduced here verbatim and run inside a stand-in for the
generated class (Unsloth cannot be imported without a GPU); when the Unsloth wheel's source is at hand
(installed, or unzipped under ``$RLKIT_UNSLOTH_SRC``) a test checks every reproduced line against it.
"""

import importlib.util
import os
from pathlib import Path

import pytest

# The generated lines, in order, for TRL >= 0.22 (``_default_loss_type = "dapo"``), as rl.py emits them.
UNSLOTH_GRPO_RESOLVE = [
    "_unsloth_default_loss_type = loss_type is None",
    "if _unsloth_default_loss_type:",
    "    loss_type = 'dapo'",
    "if beta is None:",
    "    beta = 0.0 if str(loss_type).lower() in ('dapo', 'dr_grpo') else 0.001",
    "if loss_type.lower() == 'dr_grpo':",
    "    loss_type = 'dr_grpo'",
    "elif loss_type.lower() == 'dapo':",
    "    loss_type = 'dapo'",
    "if loss_type.lower() == 'dr_grpo':",
    "    if scale_rewards == None:",
    "        scale_rewards = True",
    "    elif scale_rewards == True or scale_rewards == 'group':",
    "        scale_rewards = False",
    "elif loss_type.lower() == 'dapo' and not _unsloth_default_loss_type:",
    "    if mask_truncated_completions is None:",
    "        mask_truncated_completions = True",
    "    if epsilon_high is None:",
    "        epsilon_high = 0.28",
    "elif loss_type.lower() == 'cispo':",
    "    loss_type = 'cispo'",
    "    if epsilon_high is None:",
    "        epsilon_high = 5.0",
    "if mask_truncated_completions is None:",
    "    mask_truncated_completions = False",
]
# The one line rl.py writes with an f-string (rl.py:3527), as it stands in the source.
_SOURCE_FORM = {"    loss_type = 'dapo'": "    loss_type = '{_default_loss_type}'"}


def unsloth_rl_source() -> Path | None:
    root = os.environ.get("RLKIT_UNSLOTH_SRC")
    if root:
        path = Path(root) / "unsloth" / "models" / "rl.py"
        return path if path.exists() else None
    spec = importlib.util.find_spec("unsloth")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "rl.py"
    return path if path.exists() else None


def unsloth_grpo_config(base):
    """A GRPOConfig replaced as Unsloth 2026.10.9 replaces it: ``loss_type``, ``beta``,
    ``mask_truncated_completions`` default to ``None`` (rl.py:3354-3366) and the generated code resolves them."""
    code = "\n".join(UNSLOTH_GRPO_RESOLVE) + "\n"
    names = ("loss_type", "beta", "epsilon_high", "mask_truncated_completions", "scale_rewards")

    class Replaced(base):
        def __init__(self, *args, loss_type=None, beta=None, epsilon_high=None, mask_truncated_completions=None,
                     scale_rewards="group", **kwargs):
            ns = {"loss_type": loss_type, "beta": beta, "epsilon_high": epsilon_high,
                  "mask_truncated_completions": mask_truncated_completions, "scale_rewards": scale_rewards}
            exec(code, {}, ns)  # noqa: S102 - Unsloth's own generated lines, reproduced above
            super().__init__(*args, **{k: ns[k] for k in names}, **kwargs)

    Replaced.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    return Replaced


def clip_high(config) -> float:
    """The upper clip TRL's GRPOTrainer uses (trl/trainer/grpo_trainer.py:934)."""
    return config.epsilon_high if config.epsilon_high is not None else config.epsilon


def test_the_reproduced_lines_are_unsloths():
    path = unsloth_rl_source()
    if path is None:
        pytest.skip("the Unsloth wheel's source is not here (set RLKIT_UNSLOTH_SRC to an unzipped wheel)")
    text = path.read_text()
    missing = [line for line in UNSLOTH_GRPO_RESOLVE if f"{_SOURCE_FORM.get(line, line)}\\n" not in text]
    assert missing == []
    assert '_default_loss_type = "dapo" if trl_version >= Version("0.22.0")' in text


@pytest.mark.parametrize("asked", [{}, {"loss_type": "dapo"}, {"epsilon": 0.1}, {"loss_type": "dapo", "epsilon": 0.3}])
def test_unsloth_grpo_clips_where_trl_does(asked):
    from trl import GRPOConfig

    from rlkit.backends.trl_config import check_backend_changes, with_trl_defaults

    Replaced = unsloth_grpo_config(GRPOConfig)
    # The stand-in is Unsloth's logic: left alone, an explicit dapo gets DAPO's 0.28.
    assert Replaced(output_dir="/tmp/x", use_cpu=True, loss_type="dapo").epsilon_high == 0.28
    assert Replaced(output_dir="/tmp/x", use_cpu=True).epsilon_high is None
    base = {"use_cpu": True, "bf16": False, "per_device_train_batch_size": 8, "num_generations": 8}
    kwargs = with_trl_defaults(Replaced, base | asked)
    ours, trl = Replaced(output_dir="/tmp/x", **kwargs), GRPOConfig(output_dir="/tmp/x", **base, **asked)
    assert clip_high(ours) == clip_high(trl) == asked.get("epsilon", 0.2)
    assert (ours.loss_type, ours.beta, ours.mask_truncated_completions) == \
        (trl.loss_type, trl.beta, trl.mask_truncated_completions) == ("dapo", 0.0, False)
    check_backend_changes(ours, {"output_dir": "/tmp/x", **kwargs}, "unsloth")  # no batch change: no error


def test_a_recipe_epsilon_high_is_kept():
    from trl import GRPOConfig

    from rlkit.backends.trl_config import with_trl_defaults

    kwargs = with_trl_defaults(unsloth_grpo_config(GRPOConfig), {"epsilon_high": 0.28, "epsilon": 0.2})
    assert kwargs["epsilon_high"] == 0.28
    assert with_trl_defaults(GRPOConfig, {"use_cpu": True}) == {"use_cpu": True}  # TRL's own class: untouched
