"""``rlkit demo``: the offline demos. SmolLM2-135M-Instruct with GRPO (the default), the calculator agent
(``--calc``), the search agent (``--search``) and the random-initialised tiny model (``--tiny``)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.cli.options import SetOpt
from rlkit.errors import UserError


def demo(
    output_dir: Path = typer.Option(None, "--output-dir", help="Where the demo's runs go (default runs/demo, "
                                                              "runs/demo-calc, runs/demo-search or runs/demo-tiny)."),
    tiny: bool = typer.Option(False, "--tiny", help="The old demo: a random-initialised tiny Qwen3, SFT then GRPO."),
    calc: bool = typer.Option(False, "--calc", help="The calculator agent on SmolLM2: base -> SFT warm-up -> GRPO "
                                                    "with the tool, each evaluated (45-57 min on 2 cores)."),
    search: bool = typer.Option(False, "--search", help="The search agent on SmolLM2: base -> oracle teacher -> SFT "
                                                        "-> GRPO with the retrieval tool, each evaluated."),
    gsm8k_test: Path = typer.Option(Path("../shared/data/gsm8k/test.jsonl"), "--gsm8k-test",
                                    help="GSM8K test JSONL for the easiest-items row (skipped when absent)."),
    set_: list[str] = SetOpt,
) -> None:
    """Offline demo: SmolLM2-135M-Instruct evaluated, fine-tuned (SFT), trained with GRPO on a CPU, evaluated after
    each stage on sets outside its training box.

    Each --set applies to both the SFT and the GRPO recipe (and to every eval). Stopped (Ctrl-C, SIGTERM) in any
    stage, it says which in one line and exits 130 or 143; a training stage also says how to resume.
    """
    from rlkit.demos.stages import stops_named

    picked = [flag for flag, on in (("--tiny", tiny), ("--calc", calc), ("--search", search)) if on]
    if len(picked) > 1:
        raise UserError(f"{' and '.join(picked)} name different demos: pick one")
    with stops_named("demo"):  # a signal between two stages (each stage names itself)
        if tiny:
            from rlkit.demos.tiny import run_demo as run_tiny_demo

            run_tiny_demo(output_dir or Path("runs/demo-tiny"))
        elif calc:
            from rlkit.demos.calc import run_calc_demo

            run_calc_demo(output_dir or Path("runs/demo-calc"), set_ or [])
        elif search:
            from rlkit.demos.search import run_search_demo

            run_search_demo(output_dir or Path("runs/demo-search"), set_ or [])
        else:
            from rlkit.demos.arith import run_demo

            run_demo(output_dir or Path("runs/demo"), gsm8k_test, set_ or [])
