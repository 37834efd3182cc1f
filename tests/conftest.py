"""Tests run offline on CPU: no Hub, no Unsloth CPU fallback, no W&B, tiny models only."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("UNSLOTH_DISABLE_CPU_FALLBACK", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# What the rlkit CLI does first (huge pages for large CPU tensors), before any test allocates a tensor.
from rlkit.compat import torch_huge_pages  # noqa: E402  (imports nothing heavy)

torch_huge_pages()
# The end-of-run report costs a second or more per training; the tests marked `report` (and test_report.py,
# which calls write_report itself) check it, every other training skips it.
os.environ["RLKIT_NO_REPORT"] = "1"
# Under pytest-xdist each worker (and every process it starts) computes on its share of the cores: two workers
# with a thread per core each would fight over the same cores.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    import importlib.util

    cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        cuda = torch.cuda.is_available()
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_on_cuda = pytest.mark.skip(reason="asserts what rlkit does on a machine without CUDA")
    ppo = importlib.util.find_spec("trl") is not None and importlib.util.find_spec("trl.experimental.ppo") is not None
    no_ppo = pytest.mark.skip(reason="needs TRL's PPOTrainer (TRL 1.12: trl/experimental/ppo/ppo_trainer.py:297); "
                                     "TRL >= 1.13 no longer ships trl/experimental/ppo/")
    # TRL's version from its metadata: importing trl here would load the training stack into every test process.
    from importlib.metadata import PackageNotFoundError, version

    from rlkit import compat

    try:
        trains = not compat.trainers_need_missing_triton(version("trl"))
    except PackageNotFoundError:
        trains = False
    no_training = pytest.mark.skip(reason="trains with TRL's SFT/DPO/GRPO trainer, which from TRL 1.15 needs Triton "
                                          "(trl/trainer/utils.py:1638; no CPU path): `make test-trl-top` skips it")
    for item in items:
        if item.get_closest_marker("ppo") is not None and not ppo:
            item.add_marker(no_ppo)
        if item.get_closest_marker("trains") is not None and not trains:
            item.add_marker(no_training)
        # The marker, not `"gpu" in item.keywords`: keywords hold every node name too, so a checkout in a
        # directory called `gpu` (or a test named *gpu*) would skip every test.
        if item.get_closest_marker("gpu") is not None and not cuda:
            item.add_marker(skip)
        if item.get_closest_marker("cpu_only") is not None and cuda:
            item.add_marker(skip_on_cuda)


@pytest.fixture(autouse=True)
def _end_of_run_report(request, monkeypatch):
    """A test marked `report` gets the end-of-run report of the trainings it starts (in-process or not)."""
    if request.node.get_closest_marker("report") is not None:
        monkeypatch.delenv("RLKIT_NO_REPORT")


@pytest.fixture(scope="session")
def sft_run(tmp_path_factory):
    """One finished 2-step smoke SFT run of gsm8k_sft (lr 5e-2, so its adapter visibly moves the logits), shared
    by every test that only reads a run: use it read-only, and copy it to tmp_path first to change anything."""
    from rlkit.recipe import recipes_dir
    from rlkit.train import train

    out = tmp_path_factory.mktemp("shared") / "sft"
    return train(recipes_dir() / "gsm8k_sft.yaml", ["trainer.learning_rate=5e-2"], smoke=True, output_dir=out)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny model, built once per session into a private cache."""
    from rlkit.tiny import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real SmolLM2-135M-Instruct build, shared by every test (built once into the rlkit cache)."""
    from rlkit.smollm2 import WHEEL, find_wheel, smollm2_path

    if find_wheel() is None:
        pytest.skip(f"{WHEEL} is not on this machine (`make install` fetches it from the package index)")
    return smollm2_path()


@pytest.fixture()
def mount(tmp_path):
    """``mount(name, options)``: a real tmpfs at ``tmp_path/name`` (``size=64k``, ``ro,size=64k``) for the tests of full
    and read-only file systems; the test is skipped where mounting is refused (not root)."""
    import subprocess

    mounted = []

    def make(name: str, options: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or done.returncode})")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)
