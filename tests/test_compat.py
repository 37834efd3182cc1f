"""Canaries for rlkit.compat: one per entry, each checking that the upstream internal still exists and
behaves as the entry assumes. A failure names the installed version of the library that changed."""

import importlib
import importlib.util
import inspect
import os
import typing
from importlib import metadata
from pathlib import Path

import pytest

from rlkit import compat


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def canary(ok: bool, package: str, what: str) -> None:
    """Fail loudly, naming the installed version, when an upstream assumption no longer holds."""
    if not ok:
        pytest.fail(f"{package} {version(package)}: {what} (rlkit.compat was written against the version it "
                    "names; update the entry and its callers)", pytrace=False)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config)


# --- TRL ------------------------------------------------------------------------------------------

# name -> (arguments rlkit passes by position, arguments it passes by keyword)
CHAT_TEMPLATE_UTILS = {
    "add_response_schema": (1, []),
    "parse_response": (2, ["prefix"]),
    "get_training_chat_template": (1, []),
    "is_chat_template_prefix_preserving": (1, []),
    "supports_tool_calling": (1, []),
    "has_generation_markers": (1, []),
    "is_chat_template_stop_token_trained": (1, ["chat_template"]),
}


@pytest.mark.parametrize("name", sorted(CHAT_TEMPLATE_UTILS))
def test_trl_chat_template_utils_keep_their_names_and_arguments(name):
    import trl.chat_template_utils as utils

    func = getattr(utils, name, None)
    canary(callable(func), "trl", f"trl.chat_template_utils.{name} is gone")
    positional, keywords = CHAT_TEMPLATE_UTILS[name]
    params = inspect.signature(func).parameters
    try:
        inspect.signature(func).bind(*range(positional), **dict.fromkeys(keywords))
    except TypeError as e:
        pytest.fail(f"trl {version('trl')}: trl.chat_template_utils.{name}{inspect.signature(func)} no longer takes "
                    f"{positional} positional argument(s) and {keywords}: {e}", pytrace=False)
    required = [p for p in params.values() if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
    canary(len(required) <= positional, "trl", f"trl.chat_template_utils.{name} needs {[p.name for p in required]}")


def test_trl_ships_the_qwen3_chat_template():
    template = compat.qwen3_chat_template()
    canary(isinstance(template, str) and "<|im_start|>" in template and "tool_call" in template, "trl",
           "trl.chat_template_utils.qwen3_chat_template is no longer Qwen3's chat template string")


def test_trl_tool_loop_rules():
    from trl import GRPOTrainer

    init = inspect.getsource(GRPOTrainer.__init__)
    for name in compat.TRL_NON_TOOL_METHODS:
        canary(f'member_name == "{name}"' in init, "trl",
               f"GRPOTrainer no longer sets {name!r} apart from an environment's tools")
    canary(init.count("member_name ==") == len(compat.TRL_NON_TOOL_METHODS), "trl",
           "GRPOTrainer sets other environment methods apart from the tools than rlkit.compat.TRL_NON_TOOL_METHODS")
    loop = inspect.getsource(GRPOTrainer._tool_call_loop)
    canary('result = {"error": str(e)}' in loop and "str(result)" in loop, "trl",
           "GRPOTrainer._tool_call_loop no longer reports a failed tool call as str({'error': message})")
    canary(compat.trl_tool_error("boom") == "{'error': 'boom'}", "rlkit", "trl_tool_error changed")


def test_a_tool_grpo_run_does_not_print_trls_experimental_warning(tmp_path, monkeypatch):
    """TRL warns at each GRPOTrainer built with ``environment_factory`` unless TRL_EXPERIMENTAL_SILENCE=1 (read
    then, not at import); rlkit sets it, so `make demo-calc`'s screen has no warning a user cannot act on."""
    import warnings

    from rlkit.recipe import load_recipe, recipes_dir
    from rlkit.train import build_trainer

    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    recipe = load_recipe(recipes_dir() / "multihop_rag_grpo.yaml", smoke=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_trainer(recipe, tmp_path, smoke=True)
    source = inspect.getsource(importlib.import_module("trl.trainer.grpo_trainer"))
    canary("TRL_EXPERIMENTAL_SILENCE" in source, "trl", "GRPOTrainer no longer reads TRL_EXPERIMENTAL_SILENCE")
    assert recipe.env is not None
    assert not [w for w in caught if "experimental" in str(w.message)], [str(w.message) for w in caught]
    assert os.environ["TRL_EXPERIMENTAL_SILENCE"] == "1"


@pytest.mark.ppo
def test_trl_experimental_ppo_exists():
    from transformers import TrainingArguments

    config, trainer = compat.ppo_config_class(), compat.ppo_trainer_class()
    canary(issubclass(config, TrainingArguments), "trl", "trl.experimental.ppo.PPOConfig is no TrainingArguments")
    params = inspect.signature(trainer).parameters
    canary({"reward_model", "value_model", "ref_model", "peft_config"} <= set(params), "trl",
           f"trl.experimental.ppo.PPOTrainer takes {list(params)}")


@pytest.mark.parametrize("name", ["single_gpu", "multi_gpu", "zero2", "zero3", "fsdp"])
def test_trl_ships_the_accelerate_configs_rlkit_names(name):
    from rlkit.launch import NAMED_CONFIGS

    try:
        path = compat.trl_accelerate_config(NAMED_CONFIGS[name])
    except Exception as e:
        pytest.fail(f"trl {version('trl')}: no accelerate config {NAMED_CONFIGS[name]!r}: {e}", pytrace=False)
    canary(path.is_file() and "trl" in path.parts and "accelerate_configs" in path.parts, "trl",
           f"trl.cli's resolver found {path} for {NAMED_CONFIGS[name]!r}")


@pytest.mark.ppo
def test_trl_get_reward_reads_the_ppo_reward_model_base():
    import torch
    from trl.experimental.utils import get_reward

    class Constant(compat.ppo_reward_model_base()):
        def sequence_scores(self, input_ids, attention_mask):
            return [float(mask.sum()) for mask in attention_mask]  # each sequence's real token count

    pad = 0
    batch = torch.tensor([[pad, 5, 6, 7, 8, pad], [3, 4, 5, 6, 9, pad]])
    _, scores, _ = get_reward(Constant(), batch, pad, context_length=3)
    canary(scores.tolist() == [4.0, 5.0], "trl",
           f"trl.experimental.utils.get_reward read {scores.tolist()} from the reward model, expected [4.0, 5.0]")


# --- PEFT -----------------------------------------------------------------------------------------


def test_peft_saves_a_second_adapter_in_a_subfolder_named_after_it(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    model.add_adapter("ref", LoraConfig(r=2, target_modules=["q_proj"]))
    model.save_pretrained(str(tmp_path))
    canary((tmp_path / "adapter_config.json").is_file(), "peft", "the default adapter is not saved at the top")
    canary((compat.peft_saved_adapter_dir(tmp_path, "ref") / "adapter_config.json").is_file(), "peft",
           f"save_pretrained wrote {sorted(p.name for p in tmp_path.iterdir())}, no ref/ adapter folder")


def test_peft_adapter_parameter_names():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    named = {name for name, _ in model.named_parameters() if compat.is_peft_adapter_parameter(name)}
    canary(bool(trainable) and named == trainable, "peft",
           f"adapter parameters are named {sorted(trainable - named) or sorted(named - trainable)}")


# --- transformers ---------------------------------------------------------------------------------


def test_transformers_tracker_names():
    trackers = compat.known_trackers()
    canary({"wandb", "tensorboard", "mlflow", "trackio"} <= trackers, "transformers",
           f"INTEGRATION_TO_CALLBACK holds {sorted(trackers)}")


def test_transformers_tensorboard_callback_keeps_its_writer():
    from transformers.integrations import TensorBoardCallback, is_tensorboard_available

    if not is_tensorboard_available():
        pytest.skip("tensorboard is not installed")
    writer = object()
    canary(compat.tensorboard_writer(TensorBoardCallback(tb_writer=writer)) is writer, "transformers",
           "TensorBoardCallback no longer keeps its SummaryWriter as tb_writer")
    canary(compat.tensorboard_writer(TensorBoardCallback()) is None, "transformers",
           "TensorBoardCallback has a tb_writer before the run opens it")


def test_transformers_config_name_or_path():
    from transformers import PretrainedConfig

    config = PretrainedConfig(name_or_path="org/model")
    canary(compat.config_name_or_path(config) == "org/model" == config.name_or_path, "transformers",
           "PretrainedConfig no longer keeps the checkpoint it came from in _name_or_path")


def test_transformers_qwen2_pretokenize_regex():
    regex = compat.qwen2_pretokenize_regex()
    canary(isinstance(regex, str) and r"\p{N}" in regex, "transformers",
           "models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX no longer isolates digits")


# --- bitsandbytes ---------------------------------------------------------------------------------


def test_transformers_saves_each_checkpoint_through_the_wrappable_save_checkpoint():
    from transformers import Trainer

    source = inspect.getsource(Trainer._maybe_log_save_evaluate)
    canary("self._save_checkpoint(model, trial)" in source, "transformers",
           "Trainer._maybe_log_save_evaluate no longer saves a checkpoint through self._save_checkpoint(model, trial)")
    trainer = type("T", (), {"_save_checkpoint": lambda self, model, trial: ("saved", model)})()
    compat.wrap_checkpoint_save(trainer, lambda save: lambda model, trial: ("wrapped", save(model, trial)))
    assert trainer._save_checkpoint("m", None) == ("wrapped", ("saved", "m"))


_SHORT_WRITE = """
import resource, signal, sys, torch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
try:
    torch.save({"weights": torch.zeros(1 << 18)}, sys.argv[1])
except RuntimeError as e:
    print(e)
"""


def test_torch_save_cut_short_raises_what_rlkit_recognises(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(tmp_path / "optimizer.pt")], capture_output=True,
                          text=True, timeout=300)
    message = done.stdout.strip()
    canary(bool(message) and compat.torch_write_failed(RuntimeError(message)), "torch",
           f"torch.save whose writes are refused now ends with {message or done.stderr[-300:]!r}")
    assert not compat.torch_write_failed(RuntimeError("a bug")) and not compat.torch_write_failed(OSError(28, "x"))


def test_safetensors_errors_carry_the_errno(tmp_path):
    import errno

    import torch
    from safetensors.torch import save_file

    with pytest.raises(Exception) as raised:
        save_file({"weights": torch.zeros(4)}, str(tmp_path / "missing" / "adapter_model.safetensors"))
    canary(compat.safetensors_errno(raised.value) == errno.ENOENT, "safetensors",
           f"a failed write no longer reads '(os error N)': {raised.value!r}")
    assert compat.safetensors_errno(OSError(28, "x")) is None


def test_bitsandbytes_cpu_bf16_packing_switch():
    import torch
    from bitsandbytes.nn import Linear4bit

    layer = Linear4bit(8, 8, compute_dtype=torch.float32)
    canary(hasattr(layer, "support_avx512bf16_for_cpu"), "bitsandbytes",
           "Linear4bit has no support_avx512bf16_for_cpu attribute")
    canary("support_avx512bf16_for_cpu" in inspect.getsource(Linear4bit.forward), "bitsandbytes",
           "Linear4bit.forward no longer reads support_avx512bf16_for_cpu")
    compat.disable_cpu_bf16_packing(torch.nn.Sequential(layer))
    canary(layer.support_avx512bf16_for_cpu is False, "bitsandbytes", "the switch could not be set")


def test_bitsandbytes_kernels_hint_is_dropped_and_nothing_else():
    """bitsandbytes' CPU backend still logs the `pip install kernels` hint by that text on that logger, and the filter
    drops that record alone: another warning of the same logger passes. (rlkit's commands and stage processes set
    the filter up with their logging, before bitsandbytes is imported: test_cli's smoke train reads their lines.)"""
    import importlib.util
    import logging
    from pathlib import Path

    source = Path(importlib.util.find_spec("bitsandbytes").submodule_search_locations[0]) / "backends/cpu/ops.py"
    canary(compat.BNB_KERNELS_HINT in source.read_text(), "bitsandbytes",
           f"backends/cpu/ops.py no longer logs {compat.BNB_KERNELS_HINT!r}")
    logger = logging.getLogger(compat.BNB_CPU_LOGGER)
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        compat.quiet_bnb_kernels_hint()
        compat.quiet_bnb_kernels_hint()  # once is enough: no second filter
        logger.warning(compat.BNB_KERNELS_HINT + ": %s. Please make sure you already `pip install kernels`",
                       "No module named 'kernels'")
        logger.warning("Failed to load the CPU library: something rlkit's user should see")
    finally:
        logger.removeHandler(handler)
    assert seen == ["Failed to load the CPU library: something rlkit's user should see"]
    assert sum(type(f).__name__ == "_NoKernelsHint" for f in logger.filters) == 1


# --- torch ----------------------------------------------------------------------------------------


def test_torch_reports_cpu_bf16_support():
    canary(isinstance(compat.cpu_supports_bf16(), bool), "torch",
           "torch.ops.mkldnn._is_mkldnn_bf16_supported() no longer answers a bool")


HUGE_PAGES = ("import os, sys, torch; from rlkit.compat import torch_huge_pages; torch_huge_pages(); "
              "keep = [torch.ones(2**21) for _ in range(8)]; "  # 8 tensors of 8 MiB
              "kb = [int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')]; "
              "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), kb[0])")


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


@pytest.mark.parametrize("preset", [None, "0"])
def test_torch_backs_large_cpu_tensors_with_huge_pages(preset):
    import os
    import subprocess
    import sys

    mode = _thp_mode()
    if mode != "madvise":  # "always" gives huge pages whatever torch advises; "never" none at all
        pytest.skip(f"transparent huge pages are {mode or 'not available'} on this machine, not 'madvise'")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if preset is not None:
        env["THP_MEM_ALLOC_ENABLE"] = preset
    out = subprocess.run([sys.executable, "-c", HUGE_PAGES], capture_output=True, text=True, check=True, env=env)
    value, huge_kb = out.stdout.split()
    if preset is None:
        # 64 MiB of tensors, set after `import torch` (no tensor exists yet): most of it in 2 MiB pages.
        canary(value == "1" and int(huge_kb) >= 32 * 1024, "torch",
               f"THP_MEM_ALLOC_ENABLE=1 gave {huge_kb} kB of huge pages for 64 MiB of tensors")
    else:
        assert (value, int(huge_kb)) == ("0", 0)  # the user's own setting wins


def test_the_rlkit_command_turns_huge_pages_on_first(monkeypatch):
    """`rlkit.cli.main` sets torch's switch before anything else runs (even for --help, which imports no torch)."""
    import sys

    from rlkit.cli import main

    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    monkeypatch.setattr(sys, "argv", ["rlkit", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert os.environ.get("THP_MEM_ALLOC_ENABLE") == ("1" if sys.platform.startswith("linux") else None)


# --- GPU-only libraries ---------------------------------------------------------------------------


def test_vllm_lora_ranks():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from vllm.config import lora

    ranks = typing.get_args(getattr(lora, "MaxLoRARanks", None))
    canary(ranks == compat.VLLM_LORA_RANKS, "vllm",
           f"vllm.config.lora.MaxLoRARanks is {ranks or 'gone'}, rlkit.compat.VLLM_LORA_RANKS is {compat.VLLM_LORA_RANKS}")


def test_unsloth_reads_the_compile_location():
    spec = importlib.util.find_spec("unsloth_zoo")
    if spec is None or importlib.util.find_spec("unsloth") is None:
        pytest.skip("Unsloth is not installed")
    sources = [p for folder in spec.submodule_search_locations for p in Path(folder).rglob("*.py")]
    canary(any("UNSLOTH_COMPILE_LOCATION" in p.read_text(errors="replace") for p in sources), "unsloth_zoo",
           "unsloth_zoo no longer reads UNSLOTH_COMPILE_LOCATION")


def test_importing_compat_imports_no_library():
    import subprocess
    import sys

    code = ("import sys, rlkit.compat; heavy = [m for m in ('torch', 'transformers', 'trl', 'peft', 'bitsandbytes') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
