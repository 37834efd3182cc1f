"""``rlkit demo``: the offline demos. SmolLM2-135M-Instruct with GRPO (the default), the calculator agent
(``--calc``), the search agent (``--search``) and the random-initialised tiny model (``--tiny``); ``--fetch-data``
caches the public sets they report on (GSM8K, IFEval, HotpotQA's closed set)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlkit.cli.options import SetOpt, console
from rlkit.errors import UserError


def demo(
    output_dir: Path = typer.Option(None, "--output-dir", help="Where the demo's runs go (default runs/demo, "
                                                              "runs/demo-calc, runs/demo-search or runs/demo-tiny)."),
    tiny: bool = typer.Option(False, "--tiny", help="The old demo: a random-initialised tiny Qwen3, SFT then GRPO."),
    calc: bool = typer.Option(False, "--calc", help="The calculator agent on SmolLM2: base -> SFT warm-up -> GRPO "
                                                    "with the tool, each evaluated (45-57 min on 2 cores)."),
    search: bool = typer.Option(False, "--search", help="The search agent on SmolLM2: base -> oracle teacher -> SFT "
                                                        "-> GRPO with the retrieval tool, each evaluated."),
    full: bool = typer.Option(False, "--full", help="The whole table (make demo-full): every set of the arith and "
                                                    "robust eval suites, GSM8K's easiest items and IFEval."),
    control: bool = typer.Option(True, "--control/--no-control", help="Also train the equal-time control (the "
                                 "arithmetic, calculator and search demos): SFT continued from the SFT adapter for as "
                                 "many minutes as GRPO trained."),
    data_dir: Path = typer.Option(None, "--data-dir", help="A folder holding gsm8k/test.jsonl, ifeval/input_data.jsonl "
                                  "and hotpotqa_closed/ (default $RLKIT_DATA_DIR); a set it lacks comes from the Hub "
                                  "(cached), or its row is skipped with a line saying so."),
    fetch_data: bool = typer.Option(False, "--fetch-data", help="Download GSM8K's test set, IFEval's prompts and "
                                    "HotpotQA's closed set at their pinned revisions into datasets' cache (and into "
                                    "--data-dir when given), then stop."),
    set_: list[str] = SetOpt,
) -> None:
    """Offline demo: SmolLM2-135M-Instruct evaluated, fine-tuned (SFT), trained with GRPO on a CPU, evaluated after
    each stage on sets outside its training box.

    Each --set applies to both the SFT and the GRPO recipe (and to every eval). Stopped (Ctrl-C, SIGTERM) in any
    stage, it says which in one line and exits 130 or 143; a training stage also says how to resume.
    """
    from rlkit.demos.stages import stops_named

    picked = [flag for flag, on in (("--tiny", tiny), ("--calc", calc), ("--search", search),
                                    ("--fetch-data", fetch_data)) if on]
    if len(picked) > 1:
        raise UserError(f"{' and '.join(picked)} ask for different things: pick one")
    if picked and full:
        raise UserError(f"--full is an option of the arithmetic demo, not of {picked[0]}")
    if (tiny or fetch_data) and not control:
        raise UserError(f"--no-control: {picked[0]} trains no control")
    if fetch_data:
        _fetch(data_dir)
        return
    from rlkit.data.sources import data_dir as checked

    data_dir = checked(data_dir)  # a wrong folder is one line before anything runs
    with stops_named("demo"):  # a signal between two stages (each stage names itself)
        if tiny:
            from rlkit.demos.tiny import run_demo as run_tiny_demo

            run_tiny_demo(output_dir or Path("runs/demo-tiny"))
        elif calc:
            from rlkit.demos.calc import run_calc_demo

            run_calc_demo(output_dir or Path("runs/demo-calc"), set_ or [], data_dir=data_dir, control=control)
        elif search:
            from rlkit.demos.search import run_search_demo

            run_search_demo(output_dir or Path("runs/demo-search"), set_ or [], data_dir=data_dir, control=control)
        else:
            from rlkit.demos.arith import run_demo

            run_demo(output_dir or Path("runs/demo-full" if full else "runs/demo"), data_dir, set_ or [], full=full,
                     control=control)


def _fetch(into: Path | None) -> None:
    """Every public set from upstream (datasets caches it), written into ``into`` too when given."""
    import tempfile

    from rlkit.data.sources import PUBLIC_SETS, fetch

    out = console()
    failed = []
    with tempfile.TemporaryDirectory() as scratch:
        for spec in PUBLIC_SETS.values():
            try:
                where = fetch(spec, Path(into or scratch) / spec.folder)
            except ConnectionError as e:
                failed.append(f"{spec.what}: {e}")
                continue
            out.print(f"{spec.what}: {spec.upstream()}, cached" + (f", and in {where}" if into else ""))
    if failed:
        import datasets

        raise UserError("; ".join(failed) + (" (unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE)"
                                             if datasets.config.HF_HUB_OFFLINE else
                                             " (it needs huggingface.co and github.com)"))
