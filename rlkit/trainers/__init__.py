"""One builder per algorithm (:mod:`~rlkit.trainers.builders`) and the TRL config built from the recipe's
``trainer:`` block (:mod:`~rlkit.trainers.config`). No training loops here: TRL's trainers run them."""

from rlkit.trainers.builders import BUILDERS, TrainerBuilder
from rlkit.trainers.config import check_trainer, config_class, device_defaults, trainer_config

__all__ = ["BUILDERS", "TrainerBuilder", "check_trainer", "config_class", "device_defaults", "trainer_config"]
