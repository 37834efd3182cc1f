"""Installed packages against the ranges rlkit declares (its package metadata, i.e. pyproject.toml), and
the CUDA runtime and driver where there is a GPU.

A package outside its range fails, and so does a missing one, except: unsloth and vllm are checked only where the
recipe needs them, and bitsandbytes missing is a warning unless the recipe loads 4-bit weights (``model.load_in_4bit``
or a checkpoint saved in 4-bit). Where rlkit runs from a checkout that was never installed there is no metadata and
so no ranges: every installed package is listed as it is.
"""

from __future__ import annotations

import shutil
import subprocess
from importlib import metadata

from rlkit.doctor import Check, Context
from rlkit.vllm_serve import prequantized

F = "versions"
PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes", "unsloth", "vllm")


def declared() -> dict[str, str]:
    """package -> specifier from rlkit's own metadata (base dependencies and the `gpu` extra); none when rlkit runs
    from a checkout that was never installed (a GPU machine given the source tree and its dependencies)."""
    from packaging.requirements import Requirement

    try:
        required = metadata.requires("rlkit") or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, str] = {}
    for line in required:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker) and "gpu" not in str(req.marker):
            continue  # dev/dense extras are not part of the supported stack
        out.setdefault(req.name.lower(), str(req.specifier))
    return out


def checks(ctx: Context) -> list[Check]:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    ranges = declared()
    needs = _needed_extras(ctx)
    out = []
    for name in PACKAGES:
        spec = ranges.get(name, "")
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name in needs:
                out.append(Check(F, name, "fail", f"not installed; the recipe needs it ({needs[name]})",
                                 "pip install 'rlkit[gpu]'"))
            elif name == "bitsandbytes":  # a dependency of rlkit's, but only 4-bit recipes load it
                out.append(Check(F, name, "warn", "not installed; a 4-bit recipe (model.load_in_4bit) would need it",
                                 f"pip install '{name}{spec}'"))
            elif name not in ("unsloth", "vllm"):
                out.append(Check(F, name, "fail", "not installed", f"pip install '{name}{spec}'"))
            continue
        # A local build tag (2.13.0+cu130) is not part of the release the range speaks of.
        release = Version(installed).public
        if spec and Version(release) not in SpecifierSet(spec, prereleases=True):
            out.append(Check(F, name, "fail", f"{installed} is outside rlkit's supported range {spec}",
                             f"pip install '{name}{spec}'", data={"installed": installed, "range": spec}))
        else:
            out.append(Check(F, name, "ok", f"{installed} (supported: {spec or 'any'})",
                             data={"installed": installed, "range": spec}))
    out.append(_cuda())
    return out


def _needed_extras(ctx: Context) -> dict[str, str]:
    needs = {}
    if ctx.recipe.model.backend == "unsloth":
        needs["unsloth"] = "model.backend: unsloth"
    if ctx.recipe.model.load_in_4bit:
        needs["bitsandbytes"] = "model.load_in_4bit: true"
    elif prequantized(ctx.recipe.model.name_or_path):
        needs["bitsandbytes"] = f"{ctx.recipe.model.name_or_path} is saved in 4-bit"
    if bool(ctx.setting("use_vllm", False)):
        needs["vllm"] = "trainer.use_vllm: true"
    return needs


def _cuda() -> Check:
    import torch

    runtime = torch.version.cuda
    if not torch.cuda.is_available():
        return Check(F, "cuda", "skip", f"no CUDA device here (torch built for CUDA {runtime or 'none: CPU build'})")
    driver = None
    if shutil.which("nvidia-smi"):
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        driver = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else None
    name = torch.cuda.get_device_name(0)
    capability = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return Check(F, "cuda", "ok",
                 f"{name} (compute {capability}), CUDA runtime {runtime}, driver {driver or 'unknown'}",
                 data={"device": name, "runtime": runtime, "driver": driver})
