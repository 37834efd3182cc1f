"""Scale-out plumbing: accelerate configs, the `accelerate launch` command, ranks, and the vLLM server command.

Nothing here trains: the commands are checked against accelerate's and TRL's own argument parsers.
"""

import importlib.resources
import importlib.util
import logging
import sys
from pathlib import Path

import pytest

from rlkit import launch
from rlkit.errors import UserError
from rlkit.launch import (
    RankFilter,
    already_launched,
    config_path,
    is_main_process,
    launch_command,
    rank_info,
    strip_launch_flags,
)
from rlkit.recipe import load_recipe, recipes_dir
from rlkit.vllm_serve import check_server_mode, serve, serve_command, server_address

GRPO = recipes_dir() / "gsm8k_grpo.yaml"
# gsm8k_grpo is QLoRA on Unsloth with a colocated engine; server mode needs a 16-bit base on hf.
SERVER = ["model.load_in_4bit=false", "model.backend=hf", "trainer.vllm_mode=server"]
PREFIX = [sys.executable, "-m", "accelerate.commands.launch"]
TRL_CONFIGS = {"single_gpu": "single_gpu", "multi_gpu": "multi_gpu", "zero2": "zero2", "zero3": "zero3",
               "fsdp": "fsdp2"}


# ---------------------------------------------------------------------------------------------
# accelerate configs


@pytest.mark.parametrize("name", launch.NAMED_CONFIGS)
def test_named_configs_are_trl_s_and_load_in_accelerate(name):
    from accelerate.commands.config.config_args import load_config_from_file

    path = config_path(name)
    trl_file = importlib.resources.files("trl.accelerate_configs").joinpath(f"{TRL_CONFIGS[name]}.yaml")
    assert path == Path(str(trl_file)) and path.is_file()
    expected = {"single_gpu": "NO", "multi_gpu": "MULTI_GPU", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED",
                "fsdp": "FSDP"}[name]
    assert load_config_from_file(str(path)).distributed_type.value == expected


def test_config_path_takes_a_file_and_names_the_choices_otherwise(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("distributed_type: MULTI_GPU\n")
    assert config_path(str(own)) == own
    with pytest.raises(UserError) as info:
        config_path("zero4")
    message = str(info.value)
    assert "\n" not in message
    assert "'zero4'" in message and "single_gpu, multi_gpu, zero2, zero3, fsdp" in message


# ---------------------------------------------------------------------------------------------
# accelerate launch


def test_launch_flags_are_stripped_in_both_spellings():
    argv = ["r.yaml", "--num-processes", "2", "--smoke", "--accelerate-config=zero2", "--set", "trainer.seed=1",
            "--num-machines=1", "--machine-rank", "0", "--main-process-ip", "10.0.0.1", "--main-process-port=29500"]
    assert strip_launch_flags(argv) == ["r.yaml", "--smoke", "--set", "trainer.seed=1"]


def test_two_cpu_processes_use_the_torchrun_launcher():
    # accelerate's `--cpu` would start one process (its simple launcher): CPU ranks come from `--multi_gpu`
    # plus the TRL config's use_cpu=True.
    cmd = launch_command(["recipes/tiny_arith_sft.yaml", "--smoke", "--num-processes", "2", "--output-dir", "o"],
                         num_processes=2, cpu=True)
    assert cmd == [*PREFIX, "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no",
                   "-m", "rlkit", "train", "recipes/tiny_arith_sft.yaml", "--smoke", "--output-dir", "o"]


def test_multi_node_command_with_a_named_config():
    cmd = launch_command(["recipes/gsm8k_grpo.yaml", "--accelerate-config", "zero3", "--num-machines", "2",
                          "--machine-rank", "1", "--main-process-ip", "10.0.0.1", "--main-process-port", "29501"],
                         num_processes=16, accelerate_config="zero3", num_machines=2, machine_rank=1,
                         main_process_ip="10.0.0.1", main_process_port=29501, cpu=False)
    assert cmd == [*PREFIX, "--config_file", str(importlib.resources.files("trl.accelerate_configs") / "zero3.yaml"),
                   "--num_processes", "16", "--num_machines", "2", "--machine_rank", "1",
                   "--main_process_ip", "10.0.0.1", "--main_process_port", "29501",
                   "-m", "rlkit", "train", "recipes/gsm8k_grpo.yaml"]


def test_accelerate_reads_the_command_as_meant():
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    cmd = launch_command(["r.yaml", "--smoke", "--set", "trainer.max_steps=3"], num_processes=2, cpu=True)
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(cmd[3:]))
    assert args.multi_gpu and not args.cpu and args.num_processes == 2 and args.num_machines == 1
    assert args.module and args.training_script == "rlkit"
    assert args.training_script_args == ["train", "r.yaml", "--smoke", "--set", "trainer.max_steps=3"]
    assert args.mixed_precision == "no"

    cmd = launch_command(["r.yaml"], num_processes=16, accelerate_config="zero2", num_machines=2, machine_rank=1,
                         main_process_ip="10.0.0.1", main_process_port=29501, cpu=False)
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(cmd[3:]))
    assert args.use_deepspeed and args.zero_stage == 2 and args.num_processes == 16
    assert (args.num_machines, args.machine_rank, args.main_process_ip, args.main_process_port) == (2, 1, "10.0.0.1",
                                                                                                    29501)
    assert args.mixed_precision == "bf16"  # the config's, on GPUs


@pytest.mark.parametrize(("kwargs", "expected"), [
    (dict(num_processes=2, accelerate_config="single_gpu", cpu=False), "single_gpu runs one process"),
    (dict(num_processes=2, accelerate_config="zero3", cpu=True), "DeepSpeed and FSDP need CUDA GPUs"),
    (dict(num_processes=2, accelerate_config="fsdp", cpu=True), "DeepSpeed and FSDP need CUDA GPUs"),
    (dict(num_processes=16, num_machines=2, cpu=False), "needs --main-process-ip"),
    (dict(num_processes=16, num_machines=2, machine_rank=2, main_process_ip="h", cpu=False), "--machine-rank 2"),
    (dict(num_processes=3, num_machines=2, main_process_ip="h", cpu=False), "must be a multiple of --num-machines"),
    (dict(num_processes=0, cpu=True), "at least 1"),
])
def test_launch_mistakes_are_one_line_errors(kwargs, expected):
    with pytest.raises(UserError) as info:
        launch_command(["r.yaml"], **kwargs)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_relaunch_refuses_deepspeed_configs_without_deepspeed(monkeypatch):
    monkeypatch.setattr(launch, "_installed", lambda module: False)
    with pytest.raises(UserError, match="DeepSpeed is not installed"):
        launch.relaunch(["r.yaml"], num_processes=2, accelerate_config="zero2", cpu=False)


# ---------------------------------------------------------------------------------------------
# ranks


def test_rank_info_reads_torchrun_variables():
    assert rank_info({}) == (0, 0, 1)
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
    assert rank_info(env) == (3, 1, 4)
    assert not is_main_process(env) and is_main_process({"RANK": "0", "WORLD_SIZE": "4"}) and is_main_process({})


@pytest.mark.parametrize(("env", "launched"), [
    ({}, False),
    ({"RLKIT_LAUNCHED": "1"}, True),
    ({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2"}, True),  # torchrun
    ({"ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_MIXED_PRECISION": "no"}, True),  # accelerate, one process
])
def test_already_launched(env, launched):
    assert already_launched(env) is launched


def _records(rank, world_size):
    logger = logging.getLogger(f"rlkit.test_launch.{rank}.{world_size}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(self.format(record))

    handler = Keep()
    handler.addFilter(RankFilter(rank=rank, world_size=world_size))
    logger.addHandler(handler)
    logger.info("loaded %d rows", 16)
    logger.warning("slow step")
    logger.info("my share", extra={"all_ranks": True})
    return seen


def test_rank_filter_prefixes_and_quiets_replicas():
    assert _records(0, 1) == ["loaded 16 rows", "slow step", "my share"]
    assert _records(0, 2) == ["[rank 0/2] loaded 16 rows", "[rank 0/2] slow step", "[rank 0/2] my share"]
    assert _records(1, 2) == ["[rank 1/2] slow step", "[rank 1/2] my share"]


# ---------------------------------------------------------------------------------------------
# vLLM server


def _trl_server_args(cmd):
    from trl.scripts.vllm_serve import make_parser

    assert cmd[:3] == [sys.executable, "-m", "trl.scripts.vllm_serve"]
    args, extra = make_parser(prog="trl vllm-serve").parse_args_and_config(args=cmd[3:], return_remaining_strings=True)
    return args, extra


def test_serve_command_for_a_server_recipe():
    recipe = load_recipe(GRPO, [*SERVER, "trainer.vllm_server_host=10.0.0.7", "trainer.vllm_server_port=8011",
                                "trainer.vllm_tensor_parallel_size=2", "trainer.vllm_gpu_memory_utilization=0.85"])
    cmd = serve_command(recipe, ["--enable_prefix_caching", "true", "--max-num-seqs", "64"])
    assert cmd == [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", "Qwen/Qwen3-1.7B",
                   "--host", "10.0.0.7", "--port", "8011", "--dtype", "auto", "--max_model_len", "1024",
                   "--tensor_parallel_size", "2", "--gpu_memory_utilization", "0.85",
                   "--enable_prefix_caching", "true", "--max-num-seqs", "64"]
    args, extra = _trl_server_args(cmd)  # every flag is one `trl vllm-serve` knows, or goes on to `vllm serve`
    assert (args.model, args.host, args.port, args.max_model_len) == ("Qwen/Qwen3-1.7B", "10.0.0.7", 8011, 1024)
    assert (args.tensor_parallel_size, args.gpu_memory_utilization, args.enable_prefix_caching) == (2, 0.85, True)
    assert extra == ["--max-num-seqs", "64"]


def test_serve_command_defaults_and_overrides():
    recipe = load_recipe(GRPO, [*SERVER, "trainer.vllm_max_model_length=1536"])
    args, extra = _trl_server_args(serve_command(recipe, ["--port", "9000"]))
    # TRL's defaults where the recipe is silent: GRPOConfig's 0.0.0.0:8000, the server's TP 1 and 0.9 of the GPU.
    assert (args.host, args.port, args.max_model_len) == ("0.0.0.0", 9000, 1536)  # the last --port wins
    assert (args.tensor_parallel_size, args.gpu_memory_utilization, args.dtype) == (1, 0.9, "auto")
    assert extra == []


@pytest.mark.parametrize(("url", "address"), [
    ("http://gpu-7:8001", ("0.0.0.0", 8001)),
    ("http://gpu-7", ("0.0.0.0", 80)),
    ("https://vllm.example.org/", ("0.0.0.0", 443)),
])
def test_base_url_gives_the_port_and_the_server_listens_everywhere(url, address):
    assert server_address({"vllm_server_base_url": url, "vllm_server_port": 1234}) == address


def test_bad_base_url_is_a_user_error():
    with pytest.raises(UserError, match="expected a URL like"):
        server_address({"vllm_server_base_url": "gpu-7:8001"})


def test_smoke_recipe_serves_the_tiny_model(tiny_model_dir):
    recipe = load_recipe(GRPO, [*SERVER, "trainer.use_vllm=true"], smoke=True)
    args, _ = _trl_server_args(serve_command(recipe))
    assert args.model == str(tiny_model_dir)
    assert args.max_model_len == 512  # smoke's model.max_seq_length


@pytest.mark.parametrize(("overrides", "expected"), [
    (["model.backend=hf"], "does not generate with a vLLM server"),  # colocate
    (["model.backend=hf", "trainer.use_vllm=false", "trainer.vllm_mode=server"], "does not generate with a vLLM"),
    (["model.backend=hf", "trainer.vllm_mode=server"], "4-bit base (trl#4973)"),
    (["model.backend=unsloth", "model.load_in_4bit=false", "trainer.vllm_mode=server"], "use backend: hf"),
])
def test_recipes_server_mode_cannot_train_are_refused(overrides, expected):
    with pytest.raises(UserError) as info:
        serve_command(load_recipe(GRPO, overrides))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_check_server_mode_uses_the_chosen_backend():
    recipe = load_recipe(GRPO, ["model.load_in_4bit=false", "model.backend=auto", "trainer.vllm_mode=server"])
    check_server_mode(recipe)  # auto may still become hf
    with pytest.raises(UserError, match="Unsloth generates with its own"):
        check_server_mode(recipe, backend="unsloth")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_serve_without_vllm_is_a_user_error():
    with pytest.raises(UserError, match="vLLM is not installed"):
        serve(GRPO, SERVER)


# ---------------------------------------------------------------------------------------------
# relaunch: exit codes and signals (a stand-in child instead of accelerate)

CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1] + ".got", "w").write(os.environ["RLKIT_LAUNCHED"]),
                                          sys.exit(1)))  # like torchrun: pass it on, then exit 1
open(sys.argv[1], "w").close()
time.sleep(float(sys.argv[2]))
sys.exit(3)
"""


def _stand_in(monkeypatch, tmp_path, seconds):
    ready = tmp_path / "ready"
    monkeypatch.setattr(launch, "launch_command", lambda argv, **kw: [sys.executable, "-c", CHILD, str(ready),
                                                                      str(seconds)])
    return ready


def test_relaunch_returns_the_launcher_exit_code(monkeypatch, tmp_path):
    _stand_in(monkeypatch, tmp_path, 0)
    assert launch.relaunch(["r.yaml"], num_processes=2) == 3


def test_relaunch_forwards_sigterm_and_reports_it(monkeypatch, tmp_path):
    import os
    import signal
    import threading
    import time

    ready = _stand_in(monkeypatch, tmp_path, 60)

    previous = signal.getsignal(signal.SIGTERM)

    def send_when_ready():  # once the child runs and rlkit's handler is in place
        deadline = time.time() + 30
        while (not ready.exists() or signal.getsignal(signal.SIGTERM) is previous) and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # to rlkit, which passes it on to the launcher's process group

    threading.Thread(target=send_when_ready, daemon=True).start()
    assert launch.relaunch(["r.yaml"], num_processes=2) == 128 + signal.SIGTERM
    assert (tmp_path / "ready.got").read_text() == "1"  # the child got it, and knew it was launched
    assert signal.getsignal(signal.SIGTERM) is previous  # rlkit's handler is gone again

