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
