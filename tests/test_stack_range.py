"""rlkit accepts the TRL range users have (1.12 .. 1.15): installing it keeps the TRL that is there, and PPO,
which TRL 1.13 deleted, says so in one line where it is missing (issue 26)."""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def requirement(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(Requirement(d) for d in deps if Requirement(d).name == name)


def test_the_trl_requirement_admits_the_range_unsloth_allows():
    trl = requirement("trl")
    assert [trl.specifier.contains(v) for v in ("1.11.0", "1.12.0", "1.13.0", "1.14.1", "1.15.0", "1.16.0")] == \
        [False, True, True, True, True, False]
    assert trl.specifier.contains(version("trl"))  # the TRL of this environment (either end in CI)


def test_installing_rlkit_keeps_the_installed_trl(tmp_path):
    """pip's own resolver against this environment: only rlkit would be installed, TRL stays as it is."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--quiet", "--report", str(report), str(ROOT)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    installs = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    import rlkit

    assert installs == {"rlkit": rlkit.__version__}


def test_ppo_without_ppotrainer_is_one_line():
    from rlkit import compat
    from rlkit.errors import UserError

    if compat.has_ppo():
        assert compat.ppo_config_class().__name__ == "PPOConfig"
        pytest.skip(f"TRL {version('trl')} has PPOTrainer; the missing case runs on TRL >= 1.13")
    with pytest.raises(UserError, match=r"PPO needs TRL's PPOTrainer, which TRL 1\.1[3-9].*trl>=1\.12,<1\.13"):
        compat.ppo_config_class()
    proc = subprocess.run([sys.executable, "-m", "rlkit", "recipes", "validate", str(ROOT / "recipes" / "gsm8k_ppo.yaml")],
                          capture_output=True, text=True, timeout=120)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in said and "trl>=1.12,<1.13" in said
    assert "gsm8k_ppo.yaml:PPOneeds" in "".join(said.split())  # which recipe (among the many `validate` lists)


@pytest.mark.parametrize("trl_version,triton,algorithm,refused", [
    ("1.15.0", False, "grpo", True), ("1.15.0", False, "sft", True), ("1.15.0", False, "dpo", True),
    ("1.15.0", True, "grpo", False), ("1.14.1", False, "grpo", False), ("1.12.0", False, "sft", False),
    ("1.15.0", False, "reward", False),
])
def test_a_trl_whose_trainers_need_triton_is_refused_in_one_line_where_there_is_none(
        monkeypatch, trl_version, triton, algorithm, refused):
    """TRL 1.15 runs SFT/DPO/GRPO log-probs through a Triton kernel only (trl/trainer/utils.py:504-509, 1638)."""
    import importlib.util

    import trl

    from rlkit import compat
    from rlkit.errors import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(trl, "__version__", trl_version)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real("json") if triton else None) if name == "triton" else real(name, *a))
    if refused:
        with pytest.raises(UserError, match=rf"TRL {trl_version}'s {algorithm.upper()} trainer needs Triton.*"
                                            r"trl>=1\.12,<1\.15"):
            compat.check_trl_kernels(algorithm)
    else:
        compat.check_trl_kernels(algorithm)


def test_training_on_this_trl_is_refused_in_one_line_where_its_trainers_cannot_run(tmp_path):
    """The real refusal, on the TRL of this environment: `make test-trl-top` runs it on TRL 1.15.0 without Triton.
    (rlkit checks in one place, rlkit/train.py, for every algorithm: the table above covers SFT and DPO.)"""
    from rlkit import compat

    if not compat.trainers_need_missing_triton(version("trl")):
        pytest.skip(f"TRL {version('trl')} trains here; `make test-trl-top` (TRL 1.15.0, no Triton) runs this")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlkit", "train", str(ROOT / "recipes" / "gsm8k_grpo.yaml"), "--smoke",
                           "--output-dir", str(out)], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith("rlkit: error: TRL ") and "trainer needs Triton" in lines[-1], lines
    assert not out.exists()


def test_make_install_installs_the_tested_stack_which_the_ranges_admit():
    """A clean clone gets the TRL the suite passed on, not the newest the range allows (TRL 1.15 cannot train
    on CPU); every constraint lies inside pyproject's ranges, and torch is left to the user."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            pins[req.name.lower()] = str(req.specifier).removeprefix("==")
    assert pins["trl"] == "1.12.0" and "torch" not in pins and "rlkit" not in pins
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in map(Requirement, deps):
        if dep.name.lower() in pins:
            assert dep.specifier.contains(pins[dep.name.lower()]), (dep, pins[dep.name.lower()])
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


# --- the `gpu` extra: vLLM 0.26 for a CUDA torch 2.11, 0.27.1 for 2.13 (issue 47) ---------------------------------

# What each release requires of the packages the `gpu` extra's choice turns on, copied from its wheel's METADATA
# (Requires-Dist; `pip install --dry-run --no-deps --report` reads it without downloading the wheel), 2026-11-27.
GPU_RELEASES = {
    ("torch", "2.11.0"): [], ("torch", "2.12.0"): [], ("torch", "2.13.0"): [],
    ("vllm", "0.25.1"): ["torch==2.11.0"],
    ("vllm", "0.26.0"): ["torch==2.11.0", "transformers>=5.5.3"],
    ("vllm", "0.27.0"): ["torch==2.13.0", "transformers>=5.5.3"],
    ("vllm", "0.27.1"): ["torch==2.13.0", "transformers>=5.5.3"],
    ("vllm", "0.28.0"): ["torch==2.13.0", "transformers>=5.5.3"],
    ("unsloth", "2026.10.9"): ["unsloth_zoo>=2026.10.9", "torch<2.15.0,>=2.4.0", "trl!=0.19.0,<=1.15.0,>=0.18.2",
                               "transformers<=5.17.0,>=4.52.4"],
    ("unsloth_zoo", "2026.10.9"): ["torch<2.15.0,>=2.4.0", "trl!=0.19.0,<=1.15.0,>=0.18.2",
                                   "transformers<=5.17.0,>=4.52.4"],
    ("trl", "1.12.0"): [], ("transformers", "5.17.0"): [],
}


def gpu_extra() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]]


def test_the_gpu_extra_admits_the_vllm_built_for_torch_2_11_and_for_2_13_and_each_fits_the_rest():
    vllm = next(r for r in gpu_extra() if r.name == "vllm")
    ends = {"0.26.0": "2.11.0", "0.27.1": "2.13.0"}  # vLLM -> the torch its wheel pins
    assert [v in vllm.specifier for v in ("0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0")] == \
        [False, True, True, True, False]
    assert "torch" not in {r.name for r in gpu_extra()}  # vLLM's own pin decides, so a user's torch can stay
    torch = requirement("torch")
    unsloth_torch = Requirement(GPU_RELEASES[("unsloth", "2026.10.9")][1]).specifier
    for release, torch_version in ends.items():
        pins = [Requirement(r) for r in GPU_RELEASES[("vllm", release)]]
        assert next(r for r in pins if r.name == "torch").specifier == Requirement(f"torch=={torch_version}").specifier
        assert torch_version in torch.specifier and torch_version in unsloth_torch
        vllm_transformers = next(r for r in pins if r.name == "transformers").specifier
        assert all(v in vllm_transformers for v in ("5.5.3", "5.17.0"))  # both ends of rlkit's transformers range
    # TRL 1.12 accepts vLLM 0.19.0-0.27.1 (its `vllm` extra, and trl/import_utils.py warns outside it).
    if version("trl") == "1.12.0":
        from importlib.metadata import requires

        trl_vllm = next(Requirement(r) for r in requires("trl") if r.startswith("vllm"))
        assert all(v in trl_vllm.specifier for v in ends) and "0.28.0" not in trl_vllm.specifier


def fake_wheel(directory: Path, name: str, release: str, requires: list[str]) -> None:
    import zipfile

    dist = f"{name}-{release}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {release}\n" + "".join(f"Requires-Dist: {r}\n"
                                                                                  for r in requires)
    with zipfile.ZipFile(directory / f"{name}-{release}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}/METADATA", meta)
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")


@pytest.mark.parametrize(("torch_pin", "vllm_release"), [("2.11.0", "0.26.0"), ("2.13.0", "0.27.1"), (None, "0.27.1"),
                                                        ("2.12.0", None)])
def test_pip_picks_the_vllm_built_for_the_torch_the_user_keeps(tmp_path, torch_pin, vllm_release):
    """pip's own resolver on the `gpu` extra against an index of stand-in wheels that carry the real releases'
    requirements: naming the torch there is (`pip install 'rlkit[gpu]' torch==X`) keeps it and brings the vLLM built
    for it; without a name pip takes the newest vLLM and its torch; a torch no vLLM in the range is built for fails
    to resolve (it is never swapped silently)."""
    for (name, release), requires in GPU_RELEASES.items():
        fake_wheel(tmp_path, name, release, requires)
    report = tmp_path / "report.json"
    reqs = [str(r) for r in gpu_extra()] + [str(requirement(n)) for n in ("trl", "transformers")]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index",
                           "--find-links", str(tmp_path), "--quiet", "--report", str(report), *reqs,
                           *([f"torch=={torch_pin}"] if torch_pin else [])], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PIP_CONSTRAINT": "", "PIP_FIND_LINKS": "",
                                            "PIP_EXTRA_INDEX_URL": ""})
    if vllm_release is None:
        assert proc.returncode != 0 and "ResolutionImpossible" in proc.stderr + proc.stdout
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert chosen["vllm"] == vllm_release and chosen["torch"] == (torch_pin or "2.13.0")
    assert chosen["unsloth"] == "2026.10.9" and chosen["trl"] == "1.12.0"
