"""Bad input, as a matrix: each row is one mistake a user makes, and what rlkit does about it.

Through the real CLI entry point: exit code 2 and one line on stderr naming the problem and the fix,
no traceback, and no run directory left behind to block the retry. Mistakes inside one example
(a malformed tool call, a failing endpoint request, a too-long prompt among good ones, garbage
text given to a reward) are recorded for that example instead, and the run goes on.
"""

import json
import re
import sys

import pytest
import transformers  # noqa: F401  (its log handler keeps the sys.stderr of its import: import it before capsys swaps it)
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.recipe import recipes_dir

SFT = recipes_dir() / "tiny_arith_sft.yaml"
GRPO = recipes_dir() / "tiny_arith_grpo.yaml"
AGENT = recipes_dir() / "gsm8k_calculator_grpo.yaml"


def run_main(capsys, *args):
    """``rlkit ARGS`` in this process: its exit code and everything it printed (capsys's out and err)."""
    import logging

    import rlkit.cli

    logging.getLogger().handlers.clear()  # log to this test's captured stderr
    argv = sys.argv
    sys.argv = ["rlkit", *map(str, args)]
    try:
        rlkit.cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
    return code, capsys.readouterr()


def run_cli(capsys, *args):
    """``rlkit ARGS`` in this process: its exit code and its stderr."""
    code, captured = run_main(capsys, *args)
    return code, captured.err


def _files(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: x\nmodel: {name_or_path: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "nocols.jsonl").write_text('{"foo": 1}\n')
    (tmp_path / "broken.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    long = "what is " + " 1 +" * 400 + " 1?"
    (tmp_path / "long.jsonl").write_text(json.dumps({"question": long, "answer": "#### 401"}) + "\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    laughs = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
    (tmp_path / "bomb.yaml").write_text("\n".join(laughs) + "\n")  # 9**9 strings from ~600 bytes
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "big.yaml").write_text("# " + "x" * (1 << 20) + "\nname: big\n")
    (tmp_path / "hugeint.jsonl").write_text('{"question": "q", "answer": ' + "9" * 5000 + "}\n")
    (tmp_path / "deep.jsonl").write_text('{"question": ' + "[" * 100000 + "]" * 100000 + ', "answer": "1"}\n')
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "demo.json").write_text('{"my": "results"}\n')
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "adapter_config.json").write_text("{}")
    (tmp_path / "runs" / "other-run").mkdir(parents=True)
    (tmp_path / "runs" / "other-run" / "recipe.resolved.yaml").write_text("name: other\n")


# (case, argv after `rlkit`, the one-line message: a substring of it)
MATRIX = [
    ("malformed YAML", ["train", "{tmp}/bad.yaml", "--smoke"], "{tmp}/bad.yaml: line 3, column 1 malformed YAML"),
    ("recipe not a mapping", ["train", "{tmp}/list.yaml", "--smoke"], "{tmp}/list.yaml: a recipe is a YAML mapping"),
    ("missing recipe file", ["train", "{tmp}/nope.yaml"], "{tmp}/nope.yaml: no such recipe file"),
    ("wrong type", ["train", SFT, "--smoke", "--set", "trainer.learning_rate=fast"],
     "trainer.learning_rate: Input should be a valid number"),
    ("unknown key", ["train", SFT, "--smoke", "--set", "model.backnd=hf"],
     "model.backnd: unknown key (did you mean 'backend'?)"),
    ("unknown TRL field", ["train", SFT, "--smoke", "--set", "trainer.learnin_rate=1e-5"],
     "trainer.learnin_rate: not a SFTConfig field (did you mean 'learning_rate'?)"),
    ("--set without =", ["train", SFT, "--smoke", "--set", "trainer.learning_rate"], "--set 'trainer.learning_rate': expected KEY=VALUE"),
    ("missing data file", ["train", SFT, "--smoke", "--set", "data.train={path: {tmp}/nope.jsonl}"],
     "{tmp}/nope.jsonl: no such data file"),
    ("Hub dataset while offline", ["train", SFT, "--smoke", "--set", "data.train={path: openai/gsm8k, name: main}"],
     "openai/gsm8k: cannot reach the Hugging Face Hub"),
    ("Hub model while offline", ["train", SFT, "--smoke", "--set", "model.name_or_path=Qwen/Qwen3-0.6B"],
     "model.name_or_path: cannot load 'Qwen/Qwen3-0.6B'"),
    ("missing model folder", ["train", SFT, "--smoke", "--set", "model.name_or_path={tmp}/nomodel"],
     "model.name_or_path: {tmp}/nomodel: no such folder; give a model folder"),
    ("missing columns", ["train", SFT, "--smoke", "--set", "data.train={path: {tmp}/nocols.jsonl}"],
     "{tmp}/nocols.jsonl: missing column(s) question, answer; found foo"),
    ("empty dataset", ["train", SFT, "--smoke", "--set", "data.train={path: {tmp}/empty.jsonl}"],
     "{tmp}/empty.jsonl: the dataset is empty"),
    ("malformed JSONL", ["train", SFT, "--smoke", "--set", "data.train={path: {tmp}/broken.jsonl}"],
     "{tmp}/broken.jsonl: line 2 is not valid JSON (Expecting property name enclosed in double quotes"),
    ("every prompt longer than the context", ["train", GRPO, "--smoke", "--set", "data.train={path: {tmp}/long.jsonl}"],
     "data.train: every prompt is longer than 488 tokens (model.max_seq_length 512 - trainer.max_completion_length 24)"),
    ("unknown reward", ["train", GRPO, "--smoke", "--set", "rewards=[{name: gsm8k_corect}]"],
     "rewards.0: unknown reward 'gsm8k_corect' (did you mean 'gsm8k_correct'?)"),
    ("bad reward setting", ["train", GRPO, "--smoke", "--set", "rewards=[{name: qa_correct, args: {metric: em2}}]"],
     "rewards.0: args: qa_correct: unknown metric 'em2'; valid: em, f1"),
    ("unknown tracker", ["train", SFT, "--smoke", "--set", "trainer.report_to=[wandbb]"],
     "trainer.report_to: unknown tracker 'wandbb'"),
    ("output dir not empty", ["train", SFT, "--smoke", "--output-dir", "{tmp}/full"],
     "{tmp}/full: run directory is not empty; pass --overwrite"),
    ("--resume with no run", ["train", SFT, "--smoke", "--resume", "--output-dir", "{tmp}/none"],
     "{tmp}/none: no run to resume there; drop --resume"),
    ("--resume with --overwrite", ["train", SFT, "--smoke", "--resume", "--overwrite"], "choose one"),
    ("unknown environment", ["rollout", AGENT, "--smoke", "--set", "env.name=calculater"],
     "env.name: unknown environment 'calculater' (did you mean 'calculator'?)"),
    ("rollout without env", ["rollout", SFT, "--smoke"], "the recipe has no `env:`"),
    ("bad --split", ["rollout", AGENT, "--smoke", "--split", "test"], "--split 'test': use eval or train"),
    ("not a run directory", ["report", "{tmp}"], "{tmp}: not a run directory"),
    ("DeepSpeed on a CPU machine", ["train", SFT, "--smoke", "--num-processes", "2", "--accelerate-config", "zero3"],
     "--accelerate-config zero3: DeepSpeed and FSDP need CUDA GPUs and this machine has none"),
    ("bad recipe under --num-processes", ["train", SFT, "--smoke", "--num-processes", "2", "--set",
                                          "trainer.learning_rate=fast"],
     "trainer.learning_rate: Input should be a valid number"),
    ("unknown accelerate config", ["train", SFT, "--smoke", "--num-processes", "2", "--accelerate-config", "zero9"],
     "--accelerate-config 'zero9': not a shipped config"),
    ("vllm-serve without server mode", ["vllm-serve", GRPO], "the recipe does not generate with a vLLM server"),
    ("vllm-serve without vLLM", ["vllm-serve", GRPO, "--set", "trainer.use_vllm=true", "--set",
                                 "trainer.vllm_mode=server"], "vllm-serve: vLLM is not installed"),
    ("vLLM server mode from a 4-bit base", ["vllm-serve", recipes_dir() / "gsm8k_grpo.yaml", "--set",
                                            "trainer.vllm_mode=server"], "TRL cannot do from a 4-bit base"),
    ("missing trajectories", ["analyze", "{tmp}/nope.jsonl"], "{tmp}/nope.jsonl"),
    ("merge of a non-adapter", ["merge", "{tmp}/full", "--out", "{tmp}/merged"], "{tmp}/full"),
    # Bounded inputs (issue 16): refused before anything is expanded or loaded.
    ("non-UTF-8 recipe (validate)", ["recipes", "validate", "{tmp}/latin1.yaml"], None),
    ("YAML alias bomb", ["train", "{tmp}/bomb.yaml", "--smoke"], "{tmp}/bomb.yaml: YAML aliases expand to more than"),
    ("YAML nested too deeply", ["train", "{tmp}/deep.yaml"], "{tmp}/deep.yaml: nested too deeply"),
    ("recipe over 1 MiB", ["train", "{tmp}/big.yaml"], "bytes; a recipe is at most 1048576 bytes"),
    ("non-UTF-8 recipe (train)", ["train", "{tmp}/latin1.yaml"], "{tmp}/latin1.yaml: not UTF-8 text (byte 9"),
    ("huge integer in JSONL", ["train", SFT, "--smoke", "--set", "data.train={path: {tmp}/hugeint.jsonl}"],
     "{tmp}/hugeint.jsonl: line 1: Exceeds the limit (4300 digits) for integer string conversion"),
    ("JSONL nested too deeply", ["train", SFT, "--smoke", "--set", "data.train={path: {tmp}/deep.jsonl}"],
     "{tmp}/deep.jsonl: line 1 is nested too deeply"),
    # Numerical garbage refused at load.
    ("infinite learning rate", ["train", SFT, "--smoke", "--set", "trainer.learning_rate=.inf"],
     "trainer.learning_rate: inf is not a finite number"),
    ("NaN hyperparameter", ["train", GRPO, "--smoke", "--set", "trainer.beta=.nan"], "trainer.beta: nan is not a finite"),
    ("overflowing reward weight", ["train", GRPO, "--smoke", "--set", "rewards=[{name: gsm8k_correct, weight: 1e999}]"],
     "rewards.0.weight: inf is not a finite number"),
    # Outputs rlkit must not delete or replace (the destructive matrix in test_destructive.py has the rest).
    ("output dir is a file", ["train", SFT, "--smoke", "--output-dir", "{tmp}/afile"],
     "--output-dir {tmp}/afile: exists and is not a directory"),
    ("--overwrite a folder of the user's files", ["train", SFT, "--smoke", "--output-dir", "{tmp}/full", "--overwrite"],
     "--output-dir {tmp}/full: holds files rlkit did not write (notes.txt)"),
    ("--output-dir . --overwrite", ["train", SFT, "--smoke", "--output-dir", ".", "--overwrite"],
     "--output-dir .: is the current directory or one of its parents"),
    ("--set name=. (the run dir would be runs/)", ["train", SFT, "--set", "name=.", "--overwrite"],
     "name '.': the run directory is runs/<name>, so the name must be a plain file name"),
    ("--set name=.. (the run dir would be the cwd)", ["train", SFT, "--smoke", "--set", "name=..", "--overwrite"],
     "name '..': the run directory is runs/<name>"),
    ("--output-dir is the init_from run", ["train", GRPO, "--smoke", "--set", "init_from={tmp}/src",
                                            "--output-dir", "{tmp}/src", "--overwrite"],
     "--output-dir {tmp}/src: overlaps the input directory"),
    ("pairs --overwrite a directory", ["pairs", recipes_dir() / "gsm8k_dpo.yaml", "--smoke", "--model",
                                       "rlkit/tiny-qwen3", "--out", "{tmp}/full", "--overwrite"],
     "--out {tmp}/full: is a directory"),
    ("pairs --overwrite a foreign file", ["pairs", recipes_dir() / "gsm8k_dpo.yaml", "--smoke", "--model",
                                          "rlkit/tiny-qwen3", "--out", "{tmp}/afile", "--overwrite"],
     "--out {tmp}/afile: is not a file rlkit wrote"),
    ("eval --out a foreign file", ["eval", SFT, "--smoke", "--out", "{tmp}/full/notes.txt"],
     "--out {tmp}/full/notes.txt: is not a file rlkit wrote"),
    ("rollout --resume without --out", ["rollout", AGENT, "--smoke", "--resume"], "--resume continues the trajectories"),
    ("two demos at once", ["demo", "--tiny", "--calc"], "--tiny and --calc ask for different things: pick one"),
    ("demo over a foreign demo.json", ["demo", "--output-dir", "{tmp}/theirs"],
     "--output-dir {tmp}/theirs/demo.json: is not a file rlkit wrote"),
    ("demo into the current directory", ["demo", "--calc", "--output-dir", "."], "is the current directory"),
    ("calc demo with a GRPO-only --set", ["demo", "--calc", "--output-dir", "{tmp}/calc", "--set",
                                          "trainer.num_generations=2"],
     "smol_calc_sft.yaml: trainer.num_generations: not a SFTConfig field"),
    ("search demo with a GRPO-only --set", ["demo", "--search", "--output-dir", "{tmp}/search", "--set",
                                            "trainer.cache_implementation=static"],
     "smol_search_sft.yaml: trainer.cache_implementation: not a SFTConfig field"),
    ("generation_kwargs not a mapping", ["train", GRPO, "--smoke", "--set", "trainer.generation_kwargs=max_new_tokens=64"],
     "trainer.generation_kwargs: 'max_new_tokens=64' is not a mapping"),
]


@pytest.mark.parametrize("case, argv, message", [
    pytest.param(*m, marks=pytest.mark.cpu_only) if m[0] == "DeepSpeed on a CPU machine" else m for m in MATRIX],
    ids=[m[0] for m in MATRIX])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing_behind(case, argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLKIT_LOG_LEVEL", "WARNING")
    _files(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, err = run_cli(capsys, *[str(a).replace("{tmp}", str(tmp_path)) for a in argv])
    lines = [line for line in err.splitlines() if line.startswith("rlkit: error: ")]
    if message is None:  # `recipes validate` reports each file on stdout and exits 2
        assert code == 2 and "Traceback" not in err
        return
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err and " ERROR " not in err
    assert message.replace("{tmp}", str(tmp_path)) in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no runs/, evals/, rollouts/ or --out left


def test_a_few_too_long_prompts_are_dropped_with_a_warning_not_an_error(tmp_path, caplog):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from rlkit.recipe import load_recipe
    from rlkit.tiny import tiny_model_path
    from rlkit.trainers import trainer_config
    from rlkit.trainers.grpo import fit_context

    recipe = load_recipe(GRPO, smoke=True)
    args = trainer_config(recipe, output_dir=str(tmp_path))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    prompts = [[{"role": "user", "content": text}] for text in ("1 + 1?", "2 + 2? " * 300, "3 + 3?")]
    ds = Dataset.from_dict({"prompt": prompts, "answer": ["2", "4", "6"]})
    with caplog.at_level("WARNING", logger="rlkit"):
        kept = fit_context(recipe, tokenizer, ds, args)
    assert kept["answer"] == ["2", "6"]
    assert "data.train: dropped 1 of 3 prompts longer than 488 tokens" in caplog.text


def test_per_example_failures_are_recorded_and_the_run_goes_on():
    """A tool call with malformed JSON arguments, an endpoint 500 and a timeout: one record each, no exception."""
    from rlkit.agents.endpoint import EndpointPolicy
    from rlkit.agents.engine import run_episodes
    from rlkit.envs.calculator import CalculatorEnv
    from tests.scripted_server import ScriptedServer

    def reply(request):
        question = request["messages"][-1]["content"]
        if question == "slow":
            return {"sleep": 3.0, "content": "late"}
        if question == "broken":
            return {"status": 500}
        if request["messages"][-1]["role"] == "user":
            return {"tool_calls": [{"name": "calculate", "arguments": "{not json"}]}
        return {"content": "#### 4"}

    rows = [{"prompt": [{"role": "user", "content": q}], "answer": "4"} for q in ("slow", "broken", "fine")]
    with ScriptedServer(reply) as server:
        policy = EndpointPolicy(server.url, api_key=None, served_model=None, max_new_tokens=16, timeout=2.0,
                                max_retries=0)
        slow, broken, fine = run_episodes(rows, CalculatorEnv, policy, max_turns=2, show_progress=False)
    assert slow.error == "endpoint error: DeadlineExceeded: no complete response within 2s"
    assert broken.error.startswith("endpoint error: InternalServerError")
    assert fine.error is None and fine.messages[-1]["content"] == "#### 4"
    (call,) = fine.tool_calls  # the model saw the error and answered
    assert call["error"].startswith("tool arguments are not valid JSON: Expecting property name")
    assert call["content"] == f"{{'error': {call['error']!r}}}"


_text = st.one_of(st.text(max_size=200), st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "####",
                                                          "<tool_call>", "\x00", "１２３", "1e309", "NaN"]))
_completion = st.one_of(_text, st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["assistant", "tool", "user"]), "content": st.one_of(_text, st.none())}), max_size=3))


@settings(max_examples=60, deadline=None)
@given(completions=st.lists(_completion, min_size=1, max_size=4), gold=st.one_of(_text, st.none(), st.integers()))
def test_every_registry_reward_takes_arbitrary_text(completions, gold):
    import math

    from rlkit.rewards import REWARDS, resolve_reward

    n = len(completions)
    for name in REWARDS:
        if name in ("judge", "rank"):  # they call an endpoint: garbage text through a real server in test_judge.py
            continue
        scores = resolve_reward(name)(completions=completions, prompts=[[]] * n, answer=[gold] * n,
                                      question_type=["inference_query"] * n)
        assert len(scores) == n, name
        assert all(s is None or (isinstance(s, float) and math.isfinite(s)) for s in scores), (name, scores)


# ---------------------------------------------------------------------------------------------
# Numerical garbage during training, and user rewards that misbehave (issue 16)


def test_a_nan_loss_stops_training_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    # A finite but absurd learning rate: step 1 logs a finite loss, its update blows the weights up.
    code, err = run_cli(capsys, "train", SFT, "--smoke", "--output-dir", run, "--set", "trainer.learning_rate=1e30",
                        "--set", "trainer.max_steps=4", "--set", "trainer.save_steps=1", "--set",
                        "trainer.max_grad_norm=0")
    lines = [line for line in err.splitlines() if line.startswith("rlkit: error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert re.search(r"step \d+: (loss|grad_norm) is (nan|inf); training stopped", lines[0]), lines[0]
    step = int(lines[0].split("step ")[1].split(":")[0])
    from rlkit import runs

    kept = runs.checkpoints(run)
    assert kept and runs._step_of(kept[-1]) == step - 1  # the checkpoint before the bad step
    assert not (run / "adapter").exists()


def _user_rewards(tmp_path, monkeypatch, body):
    (tmp_path / "bad_rewards.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("bad_rewards", None)


@pytest.mark.parametrize("body, message", [
    ("def f(completions, **kw):\n    raise KeyError('gold')\n", "reward bad_rewards:f: raised KeyError: 'gold'"),
    ("def f(completions, **kw):\n    return [1.0]\n", "reward bad_rewards:f: returned 1 values for 2 completions"),
    ("def f(completions, **kw):\n    return 1.0\n", "reward bad_rewards:f: returned 1.0 (a float); a reward returns a list"),
    ("def f(completions, **kw):\n    return [0.5, 'high']\n",
     "reward bad_rewards:f: returned 'high' (a str) for row 1 of the batch (prompt 'q2'); expected a float or None"),
    ("def f(completions, **kw):\n    return [float('nan'), 1.0]\n",
     "reward bad_rewards:f: returned nan for row 0 of the batch (prompt 'q1'); rewards must be finite"),
])
def test_user_reward_mistakes_name_the_function_row_and_value(tmp_path, monkeypatch, body, message):
    from rlkit.errors import UserError
    from rlkit.rewards import resolve_reward

    _user_rewards(tmp_path, monkeypatch, body)
    reward = resolve_reward("bad_rewards:f")
    with pytest.raises(UserError) as e:
        reward(prompts=[[{"role": "user", "content": "q1"}], [{"role": "user", "content": "q2"}]],
               completions=["a", "b"])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_nan_reward_during_grpo_stops_the_run_naming_the_reward_and_step(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _user_rewards(tmp_path, monkeypatch, "def f(completions, trainer_state=None, **kw):\n"
                                         "    bad = trainer_state is not None and trainer_state.global_step >= 1\n"
                                         "    return [float('nan') if bad else 0.5 for _ in completions]\n")
    import os
    import subprocess

    run = tmp_path / "run"
    # Its own process: TRL's loggers keep handlers from earlier in-process tests.
    done = subprocess.run([sys.executable, "-m", "rlkit", "train", str(GRPO), "--smoke", "--output-dir", str(run),
                           "--set", "rewards=[{name: 'bad_rewards:f'}]", "--set", "trainer.save_steps=1",
                           # rlkit doctor would refuse this constant reward before training: the guard under
                           # test is the one inside training
                           "--no-doctor"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    code, err = done.returncode, done.stderr
    lines = [line for line in err.splitlines() if line.startswith("rlkit: error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "reward bad_rewards:f: returned nan for row 0 of the batch at step 1" in lines[0]
    from rlkit import runs

    assert [runs._step_of(c) for c in runs.checkpoints(run)] == [1]  # step 1's checkpoint is kept
