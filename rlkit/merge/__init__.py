"""``rlkit merge``: fold a LoRA adapter into its base and save a plain transformers model, verified.

Why not just ``merge_and_unload()`` on whatever base is at hand: a QLoRA adapter was trained against
dequant(nf4(W)), not W. Added to the original 16-bit W (what most export tools do) it shifts every
logit (tiny model: mean |Δlogits| ~30x the faithful merge's, top-1 agreement 0.81-0.95); merged into the
4-bit model it is re-quantized. The faithful merge (``--base dequantized``, the default) loads the base
exactly as training did (same ``BitsAndBytesConfig`` and dtype, via :func:`rlkit.backends.hf.load`),
dequantizes it, merges in float32 and casts once to ``--dtype``: float32 reproduces the adapter to ~1e-6,
bf16 to its rounding (positions the adapter itself nearly tied may flip). ``--base original`` merges into
the unquantized weights, for comparison; for an adapter trained on a 16-bit base the two modes are the
same merge. A recipe's ``dtype: auto`` resolves on the merging machine (bf16 on a GPU, float32 on CPU).

Every merge is checked: the saved directory is reloaded with plain ``AutoModelForCausalLM`` and compared
with the adapter on its training base (4-bit stays 4-bit) on fixed chat and plain-text prompts: max and
mean |Δlogits|, top-1 agreement, KL(ref||merged) and greedy decodes, on the prompts and the adapter's greedy
continuation. A warning means more than the dtype's rounding can explain (top-1 changes where the adapter was
decided, or KL; docs/merging.md), not any changed greedy decode. The numbers go to ``DIR/merge_report.json``.
The model is written to a temporary sibling of DIR and renamed into place at the end, so a failure never
leaves a half-written DIR; the adapter is only read.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlkit import safety
from rlkit.errors import UserError
from rlkit.merge.fold import load_base, merge_adapter, save
from rlkit.merge.report import REPORT, build_report, warn_if_unfaithful
from rlkit.merge.source import Source, canonical, read_source
from rlkit.merge.verification import verify

BASE_MODES = ("dequantized", "original")
DTYPES = ("bfloat16", "float16", "float32")

def merge(
    source: str | Path,
    out: str | Path,
    *,
    base: str = "dequantized",
    dtype: str = "bfloat16",
    base_model: str | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Merge the adapter of ``source`` (a run or adapter directory) into ``out``; returns the report."""
    if base not in BASE_MODES:
        raise UserError(f"--base: expected one of {', '.join(BASE_MODES)}, got {base!r}")
    if dtype not in DTYPES:
        raise UserError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    src = read_source(source, base_model)
    out = Path(out)
    inputs = [src.adapter, Path(canonical(src.spec.name_or_path))]
    safety.check_target(out, "--out", inputs)
    with safety.hold(out):  # one merge into --out at a time
        _check_out(out, inputs, overwrite)
        return _merge(src, out, base, dtype, show_progress)


def _merge(src: Source, out: Path, base: str, dtype: str, show_progress: bool) -> dict[str, Any]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from rlkit import progress as progress_

    tmp = _sibling(out, "merging")
    safety.make_dir(tmp, "merge")  # the marker moves into --out with the model
    seconds: dict[str, float] = {}
    started = time.time()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    try:
        with Progress(*columns, disable=not (show_progress and progress_.interactive()), transient=True,
                      console=progress_.console()) as progress:
            with _stage(progress, seconds, "load base"):
                model = load_base(src.spec, base, quantization=src.quantization, original=src.recipe_model)
            with _stage(progress, seconds, "merge"):
                model = merge_adapter(model, src.adapter)
            with _stage(progress, seconds, "save"):
                save(model, src.adapter, tmp, dtype)
                del model
                _release_gpu_memory()
            with _stage(progress, seconds, "verify"):
                checks = verify(src, tmp)
        seconds["total"] = round(time.time() - started, 2)
        report = build_report(src, out, base, dtype, checks, seconds)
        (tmp / REPORT).write_text(json.dumps(report, indent=2))
        _move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["path"] = str(out / REPORT)
    warn_if_unfaithful(report)
    return report


def _release_gpu_memory() -> None:
    """Hand torch's cached GPU blocks back, so the check's free-memory test sees them."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _check_out(out: Path, inputs: list[Path], overwrite: bool) -> None:
    safety.check_target(out, "--out", inputs)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise UserError(f"--out {out}: directory is not empty; pass --overwrite to replace it")
        safety.remove(out, "--out", inputs, delete=False)  # replaced only once the new model is verified


def _sibling(out: Path, tag: str) -> Path:
    path = out.parent / f".{out.name}.{tag}-{uuid.uuid4().hex[:8]}"
    safety.make_parent(path, "merge")
    path.mkdir()  # unlike mkdtemp, honours the umask: the renamed DIR gets the usual permissions
    return path


def _move_into_place(tmp: Path, out: Path) -> None:
    old = _sibling(out, "old") / out.name if out.exists() else None
    if old is not None:
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


@contextmanager
def _stage(progress: Any, seconds: dict[str, float], name: str) -> Iterator[None]:
    task = progress.add_task(name, total=None)
    started = time.time()
    yield
    seconds[name] = round(time.time() - started, 2)
    progress.update(task, total=1, completed=1)
