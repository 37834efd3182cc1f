"""``rlkit eval TARGET --suite FILE|NAME``: one model, and its base, on several eval sets at once.

A suite is a YAML file (shipped ones live in ``recipes/suites/``; ``--suite arith`` finds
``recipes/suites/arith.yaml``)::

    name: arith
    recipe: smol_arith_grpo          # whose prompt, rewards, tool and eval settings the sets use when TARGET
                                     # is a model (adapter, merged model, Hub id, endpoint URL) rather than a
                                     # run or a recipe
    sets:
      - name: two-digit              # a column of the table
        about: sums and differences of two-digit numbers
        eval: {synthetic: 100, seed: 901, generator: {min_value: 10, max_value: 99, max_steps: 1}}
      - name: my-questions
        eval: {path: data/my_questions.jsonl, columns: {question: q, answer: gold}}   # your data, your columns
        prompt: short                # data.prompt for this set (default: the recipe's)
        retrieval: {corpus: data/my_corpus.json, fields: {id: doc_id, text: body}}    # its own corpus
        max_new_tokens: 64           # eval.max_new_tokens for this set
        set: ["env.max_turns=3"]     # any other recipe overrides, as with --set

Every set is evaluated by ``rlkit eval``'s own code (:func:`rlkit.evaluate.evaluate`) with the set turned into
recipe overrides, so the prompt, the tool and the answer rule are the training run's. Relative paths are read
from the current directory, like a recipe's. Each set's results JSON (with every prediction) is written under
the output folder; ``suite.json`` there holds the table: per model and set ``correct``, ``n``, ``accuracy`` and
its 95% ``interval`` (:func:`rlkit.stats.interval`: Wilson for right/wrong scores), and with a base and a trained
model, per set the paired ``gain`` on the same problems (:func:`rlkit.evaluate.results.gain`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlkit import runs, safety
from rlkit.errors import UserError
from rlkit.evaluate.served import Served
from rlkit.recipe.catalogue import recipes_dir


class SuiteSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    about: str = ""
    eval: dict[str, Any]
    prompt: str | None = None
    retrieval: dict[str, Any] | None = None
    max_new_tokens: int | None = Field(None, gt=0)
    set: list[str] = Field(default_factory=list)

    def overrides(self) -> list[str]:
        """This set as ``--set`` overrides of the recipe (values as JSON, which YAML reads as it is)."""
        out = [f"data.eval={json.dumps(self.eval)}"]
        if self.prompt is not None:
            out.append(f"data.prompt={json.dumps(self.prompt)}")
        if self.max_new_tokens is not None:
            out.append(f"eval.max_new_tokens={self.max_new_tokens}")
        out += [f"retrieval.{key}={json.dumps(value)}" for key, value in (self.retrieval or {}).items()]
        return out + self.set


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    recipe: str | None = None
    pooled: str | None = Field(None, description="the label of a row that joins every set's problems")
    sets: list[SuiteSet] = Field(min_length=1)


def suites_dir() -> Path:
    return recipes_dir() / "suites"


def load_suite(name_or_path: str | Path) -> Suite:
    """A suite file, or the name of a shipped one; a mistake in it is one line."""
    path = Path(name_or_path)
    if not path.is_file():
        shipped = suites_dir() / f"{name_or_path}.yaml"
        if not shipped.is_file():
            names = ", ".join(sorted(p.stem for p in suites_dir().glob("*.yaml")))
            raise UserError(f"--suite {name_or_path}: no such file, nor a shipped suite (shipped: {names})")
        path = shipped
    try:
        suite = Suite.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({e})") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{path}: {where}: {first['msg']}") from None
    names = [s.name for s in suite.sets] + ([suite.pooled] if suite.pooled else [])
    if len(set(names)) != len(names):
        raise UserError(f"{path}: two sets share a name; give each set its own `name:`")
    return suite


def plan(target: str, suite: Suite, model: str | None, base: str | None,
         no_base: bool) -> tuple[str, list[tuple[str, str | None]]]:
    """(what to evaluate from: a run dir or recipe file, [(role, model argument), ...]).

    A run directory: its adapter, beside the base it recorded. A recipe: ``--model`` beside the recipe's base
    (or the base alone). Anything else is a model evaluated with the suite's ``recipe:``.
    """
    from rlkit.recipe import find_recipe, load_recipe

    source = Path(target)
    if runs.is_run_dir(source):
        recipe_base, trained = runs.read_resolved(source)["model"]["name_or_path"], [("trained", model)]
    elif source.suffix in (".yaml", ".yml") and source.is_file():
        recipe_base = load_recipe(source).model.name_or_path
        trained = [("trained", model)] if model is not None else []
    else:
        if suite.recipe is None:
            raise UserError(f"{target}: not a run directory or a recipe, and suite {suite.name!r} names no "
                            "`recipe:` to evaluate a model with; give a run directory or a recipe")
        if model is not None:
            raise UserError("--model: give the model as TARGET, or a run/recipe as TARGET and the model here")
        target, trained = str(find_recipe(suite.recipe)), [("trained", target)]
        recipe_base = load_recipe(target).model.name_or_path
    models = ([] if no_base else [("base", base or recipe_base)]) + trained
    if not models:
        raise UserError("--no-base with nothing else to evaluate: give --model, or a run directory")
    return str(target), models


def run_suite(target: str, suite: Suite, *, model: str | None = None, base: str | None = None,
              no_base: bool = False, limit: int | None = None, out: Path | None = None,
              overrides: list[str] | None = None, show_progress: bool = True,
              served: Served | None = None) -> dict[str, Any]:
    """Evaluate each model on each set; write and return the summary (``rows``: one per model; ``gain``: per set,
    the second model minus the first on the same problems, when there are two)."""
    from rlkit.evaluate import evaluate
    from rlkit.evaluate.results import gain, per_problem
    from rlkit.inference.reference import model_tag
    from rlkit.stats import interval, paired

    source, models = plan(target, suite, model, base, no_base)
    if out is None:
        out = (Path(source) / "eval" if runs.is_run_dir(Path(source)) else Path("evals")) / f"suite-{suite.name}"
    safety.check_target(out, "--out")
    summary_path = Path(out) / "suite.json"
    safety.check_replaceable_file(summary_path, "--out", ("suite", "rows"))
    rows, results = [], []
    for role, ref in models:
        cells: dict[str, Any] = {}
        results.append({})
        label, tag = None, model_tag(ref if ref is not None else Path(source).name)
        for s in suite.sets:
            res = evaluate(source, ref, limit=limit, out=Path(out) / f"{role}-{tag}" / f"{s.name}.json",
                           overrides=(overrides or []) + s.overrides(), show_progress=show_progress, served=served)
            label = res["model"]
            n = res["n"]
            correct = (sum(bool(e["correct"]) for e in res["examples"]) if "examples" in res
                       else round(res["accuracy"] * n))
            cells[s.name] = {"correct": correct, "n": n, "accuracy": correct / n,
                             "interval": list(interval(per_problem(res))), "results": res["path"],
                             **{k: res[k] for k in SHARES if k in res}}
            results[-1][s.name] = res
        if suite.pooled:
            scores = [x for s in suite.sets for x in per_problem(results[-1][s.name])]
            cells[suite.pooled] = {"correct": round(sum(scores)), "n": len(scores),
                                   "accuracy": sum(scores) / len(scores), "interval": list(interval(scores))}
            for k in SHARES:
                if all(k in cells[s.name] for s in suite.sets):
                    shares = (cells[s.name][k] * cells[s.name]["n"] for s in suite.sets)
                    cells[suite.pooled][k] = sum(shares) / len(scores)
        rows.append({"role": role, "model": label, "sets": cells})
    sets = [{"name": s.name, "about": s.about} for s in suite.sets]
    if suite.pooled:
        sets.append({"name": suite.pooled, "about": f"the {len(suite.sets)} sets above together"})
    summary = {"suite": suite.name, "target": str(target), "sets": sets, "rows": rows}
    if len(results) == 2:
        summary["gain"] = {s.name: gain(results[0][s.name], results[1][s.name]) for s in suite.sets}
        if suite.pooled:
            summary["gain"][suite.pooled] = paired(*([x for s in suite.sets for x in per_problem(r[s.name])]
                                                     for r in results))
    safety.make_parent(summary_path, "eval")
    safety.write_text(summary_path, safety.dumps(summary, indent=2))
    summary["path"] = str(summary_path)
    return summary


ROLES = ("base", "trained")
# Shares of a set's replies a suite cell keeps from its results: degenerate, and cut by the token limit.
SHARES = ("degenerate", "cut")


def find_summary(path: Path) -> Path:
    """The ``suite.json`` meant by a path: the file, its folder, or a run directory holding one suite eval."""
    if not path.exists():
        raise UserError(f"{path}: no such file or folder; give an `rlkit eval --suite` folder or a run directory")
    if path.is_file():
        return path
    if (path / "suite.json").is_file():
        return path / "suite.json"
    if runs.is_run_dir(path):
        found = sorted((path / "eval").glob("suite-*/suite.json"))
        if len(found) == 1:
            return found[0]
        if found:
            raise UserError(f"{path}: holds {len(found)} suite evals ({', '.join(str(f.parent) for f in found)}); "
                            "give the one to compare")
        raise UserError(f"{path}: no suite eval in {path / 'eval'}; run `rlkit eval {path} --suite NAME` first")
    raise UserError(f"{path}: not an `rlkit eval --suite` folder (no suite.json) nor a run directory")


def suite_scores(spec: str) -> dict[str, Any]:
    """One model's per-problem scores on every set of a suite eval already written, from ``[NAME=]PATH[:ROLE]``
    (ROLE: the folder's ``base`` or ``trained`` row; default its trained row, else its only one)."""
    from rlkit.evaluate.results import per_problem, problems

    name, sep, rest = spec.partition("=")
    if not sep or not name or Path(spec).exists():  # a path with "=" in it is a path
        name, rest = spec, spec
    role = None if Path(rest).exists() else next((r for r in ROLES if rest.endswith(f":{r}")), None)
    path = find_summary(Path(rest.removesuffix(f":{role}") if role else rest))
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{path}: not readable as JSON ({e})") from None
    if not (isinstance(summary, dict) and {"suite", "sets", "rows"} <= set(summary) and summary["rows"]):
        raise UserError(f"{path}: not the suite.json of an `rlkit eval --suite`")
    rows = {r["role"]: r for r in summary["rows"]}
    role = role or ("trained" if "trained" in rows else next(iter(rows)))
    if role not in rows:
        raise UserError(f"{spec}: {path} has no {role} row (it has {', '.join(rows)}); drop :{role} or take "
                        f":{next(iter(rows))}")
    sets: dict[str, tuple[list[Any], list[float]]] = {}
    pooled = None
    for s in summary["sets"]:
        cell = rows[role]["sets"][s["name"]]
        if "results" not in cell:  # the suite's pooled row: joined again from the sets
            pooled = s["name"]
            continue
        recorded = Path(cell["results"])
        results_path = path.parent / recorded.parent.name / recorded.name  # found wherever the folder now is
        try:
            results = json.loads(results_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise UserError(f"{results_path}: set {s['name']}'s results are missing or unreadable ({e}); "
                            f"evaluate {path.parent} again") from None
        if "trajectories" in results:  # an agent eval's episodes, beside its results
            results["trajectories"] = str(results_path.parent / Path(results["trajectories"]).name)
        sets[s["name"]] = (problems(results), per_problem(results))
        if not sets[s["name"]][1]:
            raise UserError(f"{results_path}: set {s['name']} has no problems; evaluate {path.parent} again")
    return {"name": name, "summary": str(path), "suite": summary["suite"], "role": role,
            "model": rows[role]["model"], "pooled": pooled, "sets": sets}


def compare_suites(specs: list[str]) -> dict[str, Any]:
    """Models already evaluated on the same suite, side by side: per set and pooled, each model's accuracy and
    95% interval, and each later model minus the first on the same problems (:func:`rlkit.stats.paired`)."""
    from rlkit.stats import interval, paired

    if len(specs) < 2:
        raise UserError("give two or more suite evals to compare ([NAME=]PATH[:base])")
    models = [suite_scores(spec) for spec in specs]
    names = [m["name"] for m in models]
    if len(set(names)) < len(names):
        raise UserError(f"two evals are both {max(names, key=names.count)!r}; name each one NAME=PATH")
    first = models[0]
    for m in models[1:]:
        if (m["suite"], list(m["sets"])) != (first["suite"], list(first["sets"])):
            raise UserError(f"{m['name']} is suite {m['suite']} with sets {', '.join(m['sets'])}, {first['name']} "
                            f"suite {first['suite']} with sets {', '.join(first['sets'])}; compare evals of one suite")
        for s, (asked, _) in m["sets"].items():
            theirs = first["sets"][s][0]
            if asked != theirs:
                differs = [i for i, (a, b) in enumerate(zip(asked, theirs, strict=False)) if a != b]
                where = f"problem {differs[0] + 1} differs" if differs else f"{len(asked)} against {len(theirs)}"
                raise UserError(f"set {s}: {m['name']} and {first['name']} were not asked the same problems "
                                f"({where}); evaluate both with the same suite and --limit")
    groups = [(s, [s]) for s in first["sets"]]
    if len(groups) > 1:
        groups.append((next((m["pooled"] for m in models if m["pooled"]), "pooled"), list(first["sets"])))
    rows = []
    for label, members in groups:
        scores = {m["name"]: [x for s in members for x in m["sets"][s][1]] for m in models}
        rows.append({"set": label, "n": len(scores[first["name"]]),
                     "accuracy": {k: {"accuracy": sum(v) / len(v), "interval": list(interval(v))}
                                  for k, v in scores.items()},
                     "diff": {f"{k} - {first['name']}": paired(scores[first["name"]], v)
                              for k, v in list(scores.items())[1:]}})
    return {"suite": first["suite"],
            "models": [{k: m[k] for k in ("name", "summary", "role", "model")} for m in models], "rows": rows}
