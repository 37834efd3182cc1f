"""Backend choice: auto -> hf without CUDA, unsloth without a GPU is an error, never a fallback.

`choose()` takes the machine's CUDA fact as `cuda=`, so the CPU-machine behaviour is checked on every
machine; the GPU test loads through Unsloth on a GPU (conftest skips `gpu` tests on CPU with the reason
"needs a CUDA GPU").
"""

import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from rlkit import backends
from rlkit.errors import UserError


@pytest.fixture(autouse=True)
def fresh_choice():
    backends._chosen.clear()
    yield
    backends._chosen.clear()


def test_auto_picks_hf_without_cuda(caplog):
    with caplog.at_level("INFO", logger="rlkit"):
        assert backends.choose("auto", cuda=False) == "hf"
    assert "backend auto -> hf (no CUDA GPU)" in caplog.text


def test_unsloth_without_gpu_is_a_clear_error():
    with pytest.raises(UserError, match="unsloth needs a CUDA GPU and this machine has none"):
        backends.choose("unsloth", cuda=False)
    assert backends._chosen == {}  # nothing recorded: a later call on a GPU machine decides afresh


@pytest.fixture
def broken_unsloth(tmp_path, monkeypatch):
    """A real `unsloth` package on sys.path whose import fails the way a bad install does."""
    package = tmp_path / "unsloth"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError(\"No module named 'unsloth_zoo'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("UNSLOTH_COMPILE_LOCATION", raising=False)
    return tmp_path


def test_an_unsloth_that_fails_to_import_makes_auto_use_hf(broken_unsloth, caplog):
    with caplog.at_level("WARNING", logger="rlkit"):
        assert backends.choose("auto", cuda=True) == "hf"
    assert "backend auto -> hf (unsloth fails to import: No module named 'unsloth_zoo')" in caplog.text
    with pytest.raises(UserError, match=r"unsloth fails to import \(No module named 'unsloth_zoo'\)"):
        backends.choose("unsloth", cuda=True)


def test_unsloth_compiled_cache_goes_to_rlkit_cache_not_the_working_directory(broken_unsloth, monkeypatch):
    import os

    backends.choose("auto", cuda=True)  # sets the location before importing unsloth, even one that fails
    assert os.environ["UNSLOTH_COMPILE_LOCATION"] == str(broken_unsloth / "cache" / "unsloth_compiled_cache")
    monkeypatch.setenv("UNSLOTH_COMPILE_LOCATION", "/elsewhere")
    backends.prepare_unsloth_env()
    assert os.environ["UNSLOTH_COMPILE_LOCATION"] == "/elsewhere"  # the user's choice wins


def test_loading_a_recipe_chooses_no_backend(tmp_path):
    # eval, chat, index and validate load recipes: none of them may import Unsloth (or fail on it).
    from rlkit.recipe import load_recipe, recipes_dir

    load_recipe(recipes_dir() / "gsm8k_grpo.yaml")
    assert backends._chosen == {}


@pytest.mark.slow
def test_gpu_tests_run_on_cuda_and_skip_with_a_reason_on_cpu():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", __file__,
                           "-k", "gpu_backend or picks_hf"], capture_output=True, text=True, timeout=120)
    if torch.cuda.is_available():
        assert "2 passed" in done.stdout and "SKIPPED" not in done.stdout, done.stdout  # both ran
    else:
        assert "SKIPPED [1]" in done.stdout and "needs a CUDA GPU" in done.stdout, done.stdout
        assert "1 passed, 1 skipped" in done.stdout, done.stdout


@pytest.mark.gpu
def test_unsloth_gpu_backend_loads_on_gpu(tiny_model_dir):
    """The tiny model through `backends.load` with `backend: unsloth`: on the GPU, wrapped in Unsloth's LoRA."""
    from rlkit.recipe import load_recipe, recipes_dir

    recipe = load_recipe(recipes_dir() / "gsm8k_sft.yaml", ["model.backend=unsloth", "lora.r=8"], smoke=True)
    model, tokenizer, peft_config, backend = backends.load(recipe)
    assert backend == "unsloth" and backends._chosen == {"unsloth": "unsloth"}
    assert peft_config is None  # Unsloth wrapped the model itself; TRL must not add a second LoRA
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    lora = {n: p for n, p in model.named_parameters() if "lora_A" in n or "lora_B" in n}
    targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in lora}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert all(p.requires_grad for p in lora.values())
    assert {p.shape[0] for n, p in lora.items() if "lora_A" in n} == {8}
    assert not any(p.requires_grad for n, p in model.named_parameters() if n not in lora)  # only the LoRA trains
    ids = tokenizer("12 + 7 =", return_tensors="pt").to("cuda")
    assert torch.isfinite(model(**ids).logits.float()).all()


HEAD_PEAK = """
import sys, torch
from torch import nn

def status(key):  # kB
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

class Model(nn.Module):  # SmolLM2-135M's head: 49,152 x 576 in bf16, frozen (57 MB)
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(576, 49152, bias=False, dtype=torch.bfloat16).requires_grad_(False)

    def get_output_embeddings(self):
        return self.head

torch.manual_seed(0)
model = Model()
if sys.argv[1] == "contiguous":
    from rlkit.backends.hf import contiguous_head_input
    contiguous_head_input(model)
hidden = torch.randn(16, 150, 576, dtype=torch.bfloat16, requires_grad=True)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the high-water mark (VmHWM) to the current RSS
before = status("VmRSS")
logits = model.head(hidden[:, -20:, :])  # what transformers does for logits_to_keep=20
print((status("VmHWM") - before) // 1024, logits.float().sum().item())
"""


@pytest.mark.cpu_only  # the pre-hook is installed on CPU loads only
def test_the_cpu_lm_head_reads_a_contiguous_input_instead_of_copying_itself_per_sequence(tiny_model_dir):
    """Measured: the strided last-20 slice of 16 sequences raised the RSS high-water mark by 901 MB (the 57 MB head copied
    once per sequence, three runs within 1 MB); with the pre-hook by 37-52 MB, and the logits are the same."""
    from rlkit.backends.hf import load
    from rlkit.recipe import ModelSpec

    def run(mode: str) -> tuple[int, float]:
        out = subprocess.run([sys.executable, "-c", HEAD_PEAK, mode], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        grown_mb, total = out.stdout.split()
        return int(grown_mb), float(total)

    (strided_mb, strided_sum), (contiguous_mb, contiguous_sum) = run("strided"), run("contiguous")
    from rlkit.inference.fastgen import cpu_has_native_bf16

    # The copy is oneDNN's bf16 path on a CPU with bf16 units; emulated bf16 (AVX2: an AMD EPYC, measured 33 MB)
    # reads the strided input in place. Either way the pre-hook's input stays under the bound.
    assert contiguous_mb < 150 and (strided_mb > 500 or not cpu_has_native_bf16())
    # the same logits, up to the order a CPU with AMX sums a contiguous input in (measured: 7e-6 of the total)
    assert strided_sum == pytest.approx(contiguous_sum, rel=1e-4)
    model, _ = load(ModelSpec(name_or_path=str(tiny_model_dir), backend="hf"))
    assert len(model.get_output_embeddings()._forward_pre_hooks) == 1  # rlkit's CPU load installs it


@pytest.fixture
def no_flashinfer(monkeypatch):
    """A machine without flashinfer-python (a carried vLLM) and without the variable set."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a))
    monkeypatch.setenv(backends.FLASHINFER_SAMPLER, "set by a test")  # so that the variable is restored afterwards
    monkeypatch.delenv(backends.FLASHINFER_SAMPLER)


def test_without_flashinfer_rlkit_switches_vllms_flashinfer_sampler_off_and_says_so_once(no_flashinfer, caplog):
    with caplog.at_level("INFO", logger="rlkit"):
        backends.prepare_vllm_env()
        backends.prepare_vllm_env()
    assert os.environ[backends.FLASHINFER_SAMPLER] == "0"
    said = [r.getMessage() for r in caplog.records if "flashinfer" in r.getMessage()]
    assert said == ["vLLM: flashinfer is not installed, so VLLM_USE_FLASHINFER_SAMPLER=0 (vLLM's own sampler instead "
                    "of FlashInfer's)"]


def test_the_users_flashinfer_setting_wins_and_an_installed_flashinfer_is_used(no_flashinfer, monkeypatch, caplog):
    import importlib.util

    monkeypatch.setenv(backends.FLASHINFER_SAMPLER, "1")
    with caplog.at_level("INFO", logger="rlkit"):
        backends.prepare_vllm_env()
    assert os.environ[backends.FLASHINFER_SAMPLER] == "1" and "flashinfer" not in caplog.text
    monkeypatch.delenv(backends.FLASHINFER_SAMPLER)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # flashinfer-python installed
    backends.prepare_vllm_env()
    assert backends.FLASHINFER_SAMPLER not in os.environ


@pytest.mark.parametrize("use_vllm", [True, False])
def test_loading_for_training_with_vllm_sets_the_sampler_fallback_first(no_flashinfer, monkeypatch, use_vllm):
    """Where TRL's colocated engine (hf) or Unsloth's (fast_inference) starts: backends.load, before the model."""
    from rlkit.backends import hf
    from rlkit.recipe import load_recipe, recipes_dir

    seen = {}

    def load(*args, **kwargs):
        seen["env"] = os.environ.get(backends.FLASHINFER_SAMPLER)
        return None, None

    monkeypatch.setattr(hf, "load", load)
    monkeypatch.setattr(hf, "lora_config", lambda *a, **k: None)
    recipe = load_recipe(recipes_dir() / "gsm8k_grpo.yaml", ["model.backend=hf"], smoke=True)
    backends.load(recipe, use_vllm=use_vllm)
    assert seen["env"] == ("0" if use_vllm else None)


EMULATED_BF16 = """
import json, logging, sys
from rich.console import Console
from rlkit.backends.hf import load
from rlkit.compat import cpu_supports_bf16
from rlkit.demos.stages import machine_overrides
from rlkit.recipe import ModelSpec

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
for dtype in ("float32", "bfloat16", "bfloat16"):  # the second bf16 load says nothing more
    print(f"loading {dtype}", file=sys.stderr)
    model, _ = load(ModelSpec(name_or_path=sys.argv[1], backend="hf", dtype=dtype))
print(json.dumps({"native": cpu_supports_bf16(), "dtype": str(model.dtype),
                  "demo": machine_overrides(Console(file=sys.stderr, width=200))}))
"""


@pytest.mark.cpu_only
@pytest.mark.parametrize("isa", [
    pytest.param("AVX2", marks=pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                                  reason="ONEDNN_MAX_CPU_ISA=AVX2 is an x86 setting")),
    None])
def test_bf16_on_a_cpu_without_bf16_units_says_float32_is_faster_and_the_demos_use_it(tiny_model_dir, isa):
    """oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA, as on most laptops) has no bf16 matmul units: on this Xeon a bf16
    matmul at SmolLM2's MLP shape ran at 28 GFLOP/s there against float32's 367 (1,869 with AMX;
    bench/results/bf16_units.md). A bf16 load says so once, with the fix; a float32 load says nothing; the SmolLM2
    demos run in float32 there. Unrestricted, this CPU's own answer decides (with AMX or AVX512-BF16: no line, no
    override)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    env.pop("DNNL_MAX_CPU_ISA", None)  # oneDNN's older name for the same limit
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    out = subprocess.run([sys.executable, "-c", EMULATED_BF16, str(tiny_model_dir)], capture_output=True, text=True,
                         check=True, env=env)
    found = json.loads(out.stdout)
    log = out.stderr.split("loading bfloat16")
    assert found["dtype"] == "torch.bfloat16"  # an explicit choice is kept, only advised against
    assert "model.dtype" not in log[0]  # float32: nothing to say
    if isa == "AVX2" or not found["native"]:
        assert found["native"] is False
        said = "--set model.dtype=float32 trains and generates faster here"
        assert log[1].count(said) == 1 and said not in log[2]
        assert found["demo"] == ["model.dtype=float32"] and "the demo runs in float32" in log[2]
    else:
        assert "model.dtype" not in out.stderr and found["demo"] == []
