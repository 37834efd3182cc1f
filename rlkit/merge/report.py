"""The merge report (``DIR/merge_report.json``): what was merged, how, and how faithfully."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlkit.merge.source import Source

log = logging.getLogger("rlkit")
REPORT = "merge_report.json"


def build_report(src: Source, out: Path, mode: str, dtype: str, checks: dict[str, Any],
                 seconds: dict[str, float]) -> dict[str, Any]:
    """The report: sources, base mode and its note, the verification metrics, timings and versions."""
    from importlib import metadata

    from rlkit.backends import hf
    from rlkit.tiny import resolve_model_id

    spec = src.spec
    if not spec.load_in_4bit:
        note = "the adapter was trained on a 16-bit base: 'dequantized' and 'original' are the same merge"
    elif mode == "dequantized":
        note = "faithful: nf4 base loaded as in training, dequantized, merged in float32"
    else:
        note = ("original 16-bit weights: the adapter was trained on nf4-dequantized weights, so this merge "
                "drifts from the trained model; --base dequantized is faithful")
    prompts = checks.pop("prompts")
    return {
        "source": str(src.adapter if src.run_dir is None else src.run_dir),
        "adapter": str(src.adapter),
        "out": str(out),
        "base_model": spec.name_or_path,
        "base_model_loaded": resolve_model_id(spec.name_or_path),
        "base_quantization": src.quantization,
        "recipe_model": src.recipe_model,
        "trained_in_4bit": spec.load_in_4bit,
        "reference": f"adapter on the {'nf4' if spec.load_in_4bit else '16-bit'} base, "
                     f"{str(hf.torch_dtype(spec.dtype)).removeprefix('torch.')} compute",
        "base_mode": mode,
        "base_mode_note": "; ".join([note, *src.notes]),
        "dtype": dtype,
        "metrics": checks,
        "prompts": prompts,
        "seconds": seconds,
        "versions": {name: metadata.version(name) for name in ("torch", "transformers", "peft", "bitsandbytes")},
    }


def warn_if_unfaithful(report: dict[str, Any]) -> None:
    """Warn when the merged model differs from the adapter by more than its dtype's rounding, or its tokenizer
    differs. Greedy decodes and top-1 changes at near-ties are not enough: a correct bf16 merge breaks the
    reference's exact ties either way (verification.beyond_rounding and docs/merging.md)."""
    m = report["metrics"]
    if report["base_mode"] == "dequantized" and m["beyond_rounding"]:
        log.warning("merged model differs from the adapter by more than %s rounding: %s (top-1 agreement %.4f, "
                    "greedy match %.2f); see %s", report["dtype"], "; ".join(m["beyond_rounding"]),
                    m["top1_agreement"], m["greedy_match"], report["path"])
    if not all(m["tokenizer"].values()):
        log.warning("the saved tokenizer differs from the adapter's: %s", m["tokenizer"])


def print_merge_report(report: dict[str, Any]) -> None:
    """The report's headline numbers as a table, and where the report is."""
    from rich.console import Console
    from rich.table import Table

    m = report["metrics"]
    table = Table(title=f"merge: {report['source']} -> {report['out']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("base model", report["base_model"]),
        ("base mode", report["base_mode"]),
        ("dtype", report["dtype"]),
        ("max |Δlogits|", f"{m['max_abs_logit_diff']:.3g}"),
        ("mean |Δlogits|", f"{m['mean_abs_logit_diff']:.3g}"),
        ("top-1 agreement", f"{m['top1_agreement']:.4f}"),
        ("largest ref margin at a top-1 flip", f"{m['top1_flip_max_ref_margin']:.3g} "
                                               f"({m['top1_flip_max_ref_margin_units']:.3g} rounding units)"),
        ("top-1 flips where the ref was decided", str(m["decided_flips"])),
        ("mean KL(ref||merged)", f"{m['mean_kl']:.3g} ({m['mean_kl_units']:.3g} rounding units²)"),
        ("greedy decode match", f"{m['greedy_match']:.3f}"),
        ("adapter effect max |Δlogits|", f"{m['adapter_effect_max_abs_logit']:.3g}"),
        ("within rounding", "yes" if not m["beyond_rounding"] else "NO"),
        ("tokenizer + chat template", "same" if all(m["tokenizer"].values()) else "DIFFERENT"),
        ("seconds", f"{report['seconds']['total']:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console = Console()
    console.print(table)
    console.print(f"[dim]{report['base_mode_note']}[/]", highlight=False)
    console.print(f"report: {report['path']}")
