"""GPU paths of `rlkit merge` and QLoRA placement, checked on CPU through the real code (issue 26).

Where the decision depends on CUDA being present, ``torch.cuda.is_available`` is made to answer True
and the arguments rlkit hands to ``from_pretrained`` are recorded before the load (which would need a GPU).
"""

import pytest
import torch

from rlkit.backends import hf
from rlkit.recipe import ModelSpec
from rlkit.tiny import TINY_MODEL


class Loaded(Exception):
    pass


def record_load(monkeypatch):
    seen = {}

    def spy(cls, name, **kwargs):
        seen.update(kwargs)
        raise Loaded

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hf, "_from_pretrained", spy)
    return seen


def test_merge_dequantizes_a_4bit_base_on_the_cpu_where_cuda_exists(monkeypatch):
    from rlkit.merge.fold import load_base

    seen = record_load(monkeypatch)
    spec = ModelSpec(name_or_path=TINY_MODEL, load_in_4bit=True, dtype="float32")
    with pytest.raises(Loaded):
        load_base(spec, "dequantized")
    # transformers' bnb 4-bit loader maps device_map=None to the current GPU when CUDA exists.
    assert seen["device_map"] == {"": "cpu"}
    assert seen["quantization_config"].load_in_4bit
    seen.clear()
    with pytest.raises(Loaded):
        load_base(spec, "original")
    assert "device_map" not in seen and "quantization_config" not in seen  # 16-bit: stays where it is built


def test_inference_and_training_placement_is_unchanged(monkeypatch):
    assert hf.device_map(cuda=True, four_bit=True, training=False) == {"": 0}
    assert hf.device_map(cuda=True, four_bit=True, training=True, local_rank=3) == {"": 3}
    assert hf.device_map(cuda=True, four_bit=False, training=True) is None
    assert hf.device_map(cuda=False, four_bit=True, training=False) is None
    assert hf.device_map(cuda=True, four_bit=False, training=False, device="cpu") is None


def test_a_4bit_base_really_loads_on_the_cpu_with_the_explicit_map(tiny_model_dir):
    from rlkit.merge.fold import load_base

    model = load_base(ModelSpec(name_or_path=TINY_MODEL, load_in_4bit=True, dtype="float32"), "dequantized")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


# --- QLoRA under a config that shards parameters: one line, exit 2, before any rank starts -------------------

def test_sharding_configs_are_told_apart():
    from rlkit.launch import sharding

    assert [sharding(name) for name in ("zero3", "fsdp", "zero2", "multi_gpu", "single_gpu")] == \
        ["DeepSpeed ZeRO-3", "FSDP", None, None, None]


@pytest.mark.parametrize("config", ["zero3", "fsdp"])
def test_4bit_under_zero3_or_fsdp_is_refused_up_front(config, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlkit", "train", str(root / "recipes" / "gsm8k_sft.yaml"),
                           "--smoke", "--set", "model.load_in_4bit=true", "--accelerate-config", config,
                           "--output-dir", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "load_in_4bit under" in line]
    assert len(said) == 1 and "multi_gpu" in said[0] and "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_rank_launched_elsewhere_refuses_too(monkeypatch):
    from rlkit.errors import UserError

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(UserError, match="load_in_4bit under FSDP"):
        hf.load(ModelSpec(name_or_path=TINY_MODEL, load_in_4bit=True), training=True)


# --- GPU memory between the merge's stages -------------------------------------------------------------------

def test_the_gpu_cache_is_released_before_verification_loads_each_model(monkeypatch, tmp_path, tiny_model_dir):
    """A real merge (bare 16-bit adapter) with CUDA made to look present: torch's cache is emptied after the
    float32 merged model is freed, and again after the reference is freed, before the merged model loads."""
    import gc
    import weakref

    import peft.peft_model
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import rlkit.inference.load
    import rlkit.merge
    import rlkit.merge.verification
    from rlkit.merge import merge

    torch.manual_seed(0)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                          LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "adapter")
    del lora
    gc.collect()

    events, models = [], {}

    def alive():
        return sorted(name for name, ref in models.items() if ref() is not None)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)  # dtype auto: float32, as on CPU
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append(("empty_cache", alive())))
    # Everything still runs on the CPU: rlkit's placement, PEFT's adapter loading and the check's fit test.
    monkeypatch.setattr(hf, "device_map", lambda **kwargs: None)
    monkeypatch.setattr(peft.peft_model, "infer_device", lambda: "cpu")
    monkeypatch.setattr(rlkit.merge.verification, "fits_on_gpu", lambda model: False)

    real_save, real_with_adapter = rlkit.merge.save, rlkit.inference.load.with_adapter
    real_from_pretrained = AutoModelForCausalLM.from_pretrained.__func__

    def save(model, *args):
        models["float32 merged"] = weakref.ref(model)
        events.append(("save", alive()))
        return real_save(model, *args)

    def with_adapter(*args):
        model = real_with_adapter(*args)
        models["reference"] = weakref.ref(model)
        events.append(("load reference", alive()))
        return model

    def from_pretrained(cls, name, *args, **kwargs):
        if ".merging-" in str(name):
            events.append(("load merged", alive()))
        return real_from_pretrained(cls, name, *args, **kwargs)

    monkeypatch.setattr(rlkit.merge, "save", save)
    monkeypatch.setattr(rlkit.inference.load, "with_adapter", with_adapter)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(from_pretrained))
    report = merge(tmp_path / "adapter", tmp_path / "out", base_model=str(tiny_model_dir), dtype="float32",
                   show_progress=False)
    assert report["metrics"]["max_abs_logit_diff"] <= 1e-4  # the merge itself still works
    assert events == [
        ("save", ["float32 merged"]),
        ("empty_cache", []),  # the float32 copy is gone before its cached blocks are handed back
        ("load reference", ["reference"]),
        ("empty_cache", []),  # ... and the reference, before the merged model is loaded and sized
        ("load merged", []),
    ]
