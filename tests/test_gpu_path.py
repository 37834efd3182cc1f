"""The first GPU run, checked on CPU: what each GPU-only code path is given, built from real parts.

One test (or a few) per defect of issue 18. Where a decision depends on the machine it is a function
of the machine's facts (CUDA present, bf16 support, free memory), called here with a GPU's facts; what
can be constructed on a CPU is constructed (runs, pre-quantized checkpoints, TRL configs, tokenizers).
"""

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from rlkit.backends import hf
from rlkit.errors import UserError
from rlkit.recipe import ModelSpec, load_recipe, recipes_dir
from rlkit.tiny import TINY_MODEL, resolve_model_id
from rlkit.trainers import trainer_config

ROOT = Path(__file__).resolve().parent.parent
QLORA = ["model.load_in_4bit=true", "model.dtype=float32", "trainer.learning_rate=2e-2", "trainer.max_steps=1",
         "trainer.seed=7"]


# --- 1. the base really loaded is recorded, and merge/eval load it -------------------------------------


@pytest.fixture(scope="module")
def qlora_run(tmp_path_factory):
    from rlkit.train import train

    return train(recipes_dir() / "gsm8k_sft.yaml", [*QLORA, "trainer.hub_token=hf_notarealtoken0123456789"],
                 smoke=True, output_dir=tmp_path_factory.mktemp("qlora") / "run")


@pytest.mark.trains
def test_run_records_the_loaded_base_and_the_exact_trl_config(qlora_run):
    provenance = yaml.safe_load((qlora_run / "recipe.resolved.yaml").read_text())["provenance"]
    base = provenance["base_model"]
    assert base["name_or_path"] == resolve_model_id(TINY_MODEL)
    q = base["quantization"]
    assert (q["quant_method"], q["bnb_4bit_quant_type"], q["bnb_4bit_use_double_quant"]) == ("bitsandbytes", "nf4", True)
    assert base["dtype"] == "float32"
    config = json.loads((qlora_run / "trainer_config.json").read_text())
    assert config["learning_rate"] == 2e-2 and config["max_steps"] == 1 and config["seed"] == 7
    assert config["use_cpu"] is not torch.cuda.is_available()  # what this machine made of the defaults
    assert config["bf16"] is False  # a float32 model: the recipe's dtype wins on any machine
    assert len(config) > 100  # every field, not just the recipe's
    assert "hf_notarealtoken" not in (qlora_run / "trainer_config.json").read_text()


@pytest.fixture(scope="module")
def swapped_run(qlora_run, tmp_path_factory):
    """The run as Unsloth leaves it: the recipe names the 16-bit model, the base loaded was a
    pre-quantized checkpoint (here: the tiny model quantized to nf4 and saved, as unsloth/*-bnb-4bit are)."""
    import shutil

    run = tmp_path_factory.mktemp("swapped") / "run"
    shutil.copytree(qlora_run, run)
    prequantized = tmp_path_factory.mktemp("hub") / "tiny-qwen3-unsloth-bnb-4bit"
    model, tokenizer = hf.load(ModelSpec(name_or_path=TINY_MODEL, load_in_4bit=True, dtype="float32"))
    model.save_pretrained(prequantized)
    tokenizer.save_pretrained(prequantized)
    resolved = yaml.safe_load((run / "recipe.resolved.yaml").read_text())
    resolved["provenance"]["base_model"] = hf.loaded_base(model) | {"name_or_path": str(prequantized)}
    (run / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    return run, prequantized


@pytest.mark.trains
def test_merge_uses_the_recorded_base_not_the_recipes_name(swapped_run, tmp_path):
    from rlkit.merge import merge, read_source

    run, prequantized = swapped_run
    src = read_source(run)
    assert src.spec.name_or_path == str(prequantized) and src.spec.load_in_4bit
    assert src.recipe_model == TINY_MODEL and src.quantization["bnb_4bit_quant_type"] == "nf4"
    report = merge(run, tmp_path / "merged", dtype="float32", show_progress=False)
    assert report["base_model"] == str(prequantized) and report["recipe_model"] == TINY_MODEL
    m = report["metrics"]
    assert m["max_abs_logit_diff"] <= 1e-4 and m["top1_agreement"] == 1.0 and m["greedy_match"] == 1.0
    assert m["adapter_effect_max_abs_logit"] > 1e-3  # the check compares something the adapter changed


@pytest.mark.trains
def test_eval_loads_the_adapter_on_the_recorded_base(swapped_run):
    from rlkit.inference.load import load
    from rlkit.inference.reference import model_ref

    run, prequantized = swapped_run
    recipe = load_recipe(recipes_dir() / "gsm8k_sft.yaml", QLORA, smoke=True)
    model, tokenizer = load(model_ref(recipe, run, None))
    assert model.config._name_or_path == str(prequantized)
    assert any("Linear4bit" in type(m).__name__ for m in model.modules())
    # The adapter is on it: its trained lora_B weights (zero at init), and logits the base alone does not give.
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and max(p.abs().max().item() for p in lora_b) > 0
    ids = tokenizer("Tom has 12 apples. He buys 7 more.", return_tensors="pt").to(model.device)
    with torch.no_grad():
        tuned = model(**ids).logits
        with model.disable_adapter():
            base = model(**ids).logits
    assert (tuned - base).abs().max().item() > 1e-3


# --- 2. inference loads go to the GPU; training loads are placed by the trainer -------------------------


def test_device_map_puts_16bit_inference_models_on_the_gpu():
    assert hf.device_map(cuda=True, four_bit=False, training=False) == {"": 0}  # eval, chat, rollout, merge check
    assert hf.device_map(cuda=True, four_bit=False, training=True) is None  # Trainer / ZeRO / FSDP place it
    assert hf.device_map(cuda=True, four_bit=True, training=True, local_rank=3) == {"": 3}
    assert hf.device_map(cuda=False, four_bit=True, training=False) is None


# --- 3. torch is a range in the base dependencies; make install keeps a user's torch ---------------------


def test_torch_is_a_range_in_the_base_dependencies_and_the_gpu_extra_leaves_it_to_vllm():
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = next(Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch")
    assert "==" not in str(torch_req.specifier)
    assert {"2.6.0", "2.11.0", "2.13.0", "2.14.1"} <= {v for v in ("2.5.1", "2.6.0", "2.11.0", "2.13.0", "2.14.1",
                                                                      "2.15.0") if v in torch_req.specifier}
    assert "2.15.0" not in torch_req.specifier and "2.5.1" not in torch_req.specifier
    gpu = [Requirement(r) for r in project["optional-dependencies"]["gpu"]]
    assert "torch" not in {r.name for r in gpu}  # vLLM pins its own torch (tests/test_stack_range.py)


def test_make_install_puts_an_explicit_torch_in_first_only_where_none_is_installed(tmp_path):
    done = subprocess.run(["make", "-n", "-B", "install", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    lines = done.stdout.splitlines()
    torch_line = next(i for i, line in enumerate(lines) if "torch==2.13.0" in line)
    rlkit_line = next(i for i, line in enumerate(lines) if '-e ".[dev]"' in line)
    assert torch_line < rlkit_line
    assert re.search(r'python -c "import torch" 2>/dev/null \|\| .*pip install --quiet torch==2\.13\.0$',
                     lines[torch_line])


# --- 4. Unsloth gets every recipe field -----------------------------------------------------------------


def test_unsloth_gets_the_resolved_model_dtype_attention_and_modules_to_save():
    from rlkit.backends.unsloth_args import from_pretrained_kwargs, peft_kwargs
    from rlkit.recipe import LoraSpec

    spec = ModelSpec(name_or_path=TINY_MODEL, dtype="bfloat16", attn_implementation="eager", load_in_4bit=True,
                     max_seq_length=512)
    lora = LoraSpec(r=20, modules_to_save=["lm_head"])
    kwargs = from_pretrained_kwargs(spec, lora, None, fast_inference=True)
    assert kwargs["model_name"] == resolve_model_id(TINY_MODEL) and Path(kwargs["model_name"]).is_dir()
    assert kwargs["dtype"] is torch.bfloat16 and kwargs["attn_implementation"] == "eager"
    assert kwargs["max_lora_rank"] == 32  # vLLM's next kernel size up from r=20
    assert "dtype" not in from_pretrained_kwargs(ModelSpec(name_or_path="x"), None, None, fast_inference=False)
    peft = peft_kwargs(lora, seed=3)
    assert peft["modules_to_save"] == ["lm_head"] and peft["r"] == 20 and peft["random_state"] == 3
    assert "modules_to_save" not in peft_kwargs(LoraSpec(), seed=0)


# --- 5. hf + vLLM colocate sizes vLLM for the recipe's context ------------------------------------------


def grpo(*overrides):
    return load_recipe(recipes_dir() / "gsm8k_grpo.yaml", list(overrides), smoke=True)


def test_vllm_gets_the_recipes_context_length():
    recipe = grpo("trainer.use_vllm=true", "model.max_seq_length=1536")
    assert trainer_config(recipe, output_dir="/tmp/x").vllm_max_model_length == 1536
    explicit = grpo("trainer.use_vllm=true", "trainer.vllm_max_model_length=1024")
    assert trainer_config(explicit, output_dir="/tmp/x").vllm_max_model_length == 1024
    assert trainer_config(grpo(), output_dir="/tmp/x").vllm_max_model_length is None


def test_a_turn_cap_reaches_vllm_in_its_name():
    cap = "trainer.generation_kwargs={max_new_tokens: 64, top_k: 20}"
    hf = trainer_config(grpo(cap), output_dir="/tmp/x").generation_kwargs
    vllm = trainer_config(grpo("trainer.use_vllm=true", cap), output_dir="/tmp/x").generation_kwargs
    assert hf == {"max_new_tokens": 64, "top_k": 20} and vllm == {"max_tokens": 64, "top_k": 20}
    as_json = grpo("trainer.use_vllm=true", """trainer.generation_kwargs='{"max_new_tokens": 64}'""")  # TRL's form
    assert trainer_config(as_json, output_dir="/tmp/x").generation_kwargs == {"max_tokens": 64}
    from rlkit.trainers.grpo import reply_tokens

    assert [reply_tokens(kwargs, 512) for kwargs in ({"max_new_tokens": 64}, {"max_tokens": 600}, {"top_k": 20},
                                                    None, "{}")] == [64, 512, 512, 512, 512]


# --- 6. TRL's defaults whichever backend replaced the config class --------------------------------------

def unsloth_like(base):
    """A config class replaced the way Unsloth's generated ones are (unsloth/models/rl.py): a subclass whose
    __init__ has other defaults and resets the batch size to num_generations when it does not divide
    (first rule: the total batch; second, for TRLs without steps_per_generation: the per-device batch).
    Unsloth itself cannot be imported without a GPU. (``bnpo``/``0.001`` are Unsloth's GRPO defaults before
    2026.10; 2026.10.9's None sentinels and its dapo branch run verbatim in tests/test_unsloth_grpo_defaults.py.)"""

    class Replaced(base):
        def __init__(self, *args, learning_rate=5e-5, seed=3407, weight_decay=0.001, beta=0.001, loss_type="bnpo",
                     per_device_train_batch_size=4, num_generations=8, gradient_accumulation_steps=2,
                     steps_per_generation=None, generation_batch_size=None, per_device_rule=False, **kwargs):
            total = gradient_accumulation_steps * per_device_train_batch_size
            if steps_per_generation is None and generation_batch_size is None and total % num_generations:
                per_device_train_batch_size = num_generations
            if per_device_rule and per_device_train_batch_size % num_generations:
                per_device_train_batch_size = num_generations
            super().__init__(*args, learning_rate=learning_rate, seed=seed, weight_decay=weight_decay, beta=beta,
                             loss_type=loss_type, per_device_train_batch_size=per_device_train_batch_size,
                             num_generations=num_generations, gradient_accumulation_steps=gradient_accumulation_steps,
                             steps_per_generation=steps_per_generation, generation_batch_size=generation_batch_size,
                             **kwargs)

    Replaced.__module__ = "unsloth_compiled_cache.UnslothGRPOTrainer"
    return Replaced


def replaced_like(base, **other_defaults):
    """A config class replaced with other defaults, the way Unsloth replaces SFT/DPO/reward/PPO configs."""

    class Replaced(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **(other_defaults | kwargs))

    Replaced.__module__ = f"unsloth_compiled_cache.Unsloth{base.__name__}"
    return Replaced


# Values TRL itself sets (several differ from transformers' TrainingArguments: lr 5e-5, no checkpointing).
TRL_KNOWN = {"sft": {"learning_rate": 2e-5}, "dpo": {"learning_rate": 1e-6, "beta": 0.1},
             "reward": {"learning_rate": 1e-4}, "ppo": {"learning_rate": 3e-6, "kl_coef": 0.05, "vf_coef": 0.1},
             "grpo": {"learning_rate": 1e-6, "beta": 0.0, "loss_type": "dapo", "num_generations": 8}}


@pytest.mark.parametrize("algorithm", ["sft", "dpo", "reward", pytest.param("ppo", marks=pytest.mark.ppo), "grpo"])
def test_pinned_defaults_are_trls_own(algorithm):
    from rlkit.backends.trl_config import trl_defaults, with_trl_defaults
    from rlkit.trainers import config_class

    cls = config_class(algorithm)
    defaults = trl_defaults(cls)
    known = TRL_KNOWN[algorithm] | {"seed": 42, "weight_decay": 0.0, "gradient_checkpointing": True}
    assert {k: defaults[k] for k in known} == known and "output_dir" not in defaults and len(defaults) > 100
    cpu = {"use_cpu": True, "bf16": False}
    trl = cls(output_dir="/tmp/x", **cpu).to_dict()
    assert cls(output_dir="/tmp/x", **(defaults | cpu)).to_dict() == trl
    # Through an Unsloth-like replaced class (other defaults): the pinned config is TRL's, field for field.
    replaced = unsloth_like(cls) if algorithm == "grpo" else \
        replaced_like(cls, learning_rate=5e-5, seed=3407, weight_decay=0.001, gradient_checkpointing=False)
    assert replaced(output_dir="/tmp/x", **cpu).learning_rate == 5e-5  # the stand-in does change the defaults
    # GRPO's epsilon_high is passed resolved (None -> epsilon, as TRL's trainer resolves it): Unsloth reads an explicit
    # dapo as DAPO and would otherwise clip at 0.28 (test_unsloth_grpo_defaults.py).
    resolved = {"epsilon_high": trl["epsilon"]} if algorithm == "grpo" else {}
    assert replaced(output_dir="/tmp/x", **with_trl_defaults(replaced, cpu)).to_dict() == trl | resolved


def test_a_replaced_config_class_trains_with_trls_defaults_and_may_not_change_the_batch():
    from trl import GRPOConfig

    from rlkit.backends.trl_config import check_backend_changes, trl_class, with_trl_defaults

    Replaced = unsloth_like(GRPOConfig)
    assert trl_class(Replaced) is GRPOConfig
    asked = {"use_cpu": True, "bf16": False, "per_device_train_batch_size": 16, "num_generations": 8}
    kwargs = with_trl_defaults(Replaced, asked)
    config = Replaced(output_dir="/tmp/x", **kwargs)
    trl = GRPOConfig(output_dir="/tmp/x", **asked)
    assert (config.learning_rate, config.seed, config.weight_decay, config.beta, config.loss_type) == \
        (trl.learning_rate, trl.seed, trl.weight_decay, trl.beta, trl.loss_type) == (1e-6, 42, 0.0, 0.0, "dapo")
    assert config.gradient_accumulation_steps == trl.gradient_accumulation_steps == 1
    check_backend_changes(config, {"output_dir": "/tmp/x", **kwargs}, "unsloth")  # nothing changed: no error
    assert "dataset_num_proc" not in kwargs  # how, not what, is computed: left to the backend
    # A total batch that does not divide: TRL refuses it, the replaced class would train another batch size.
    odd = with_trl_defaults(Replaced, asked | {"per_device_train_batch_size": 12})
    with pytest.raises(UserError, match=r"GRPOConfig rejects these settings .*divisible by num_generations"):
        check_backend_changes(Replaced(output_dir="/tmp/x", **odd), {"output_dir": "/tmp/x", **odd}, "unsloth")
    # One TRL accepts (4 x 2 accumulation = 8 completions) but the per-device rule resets to 8.
    fine = with_trl_defaults(Replaced, asked | {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2})
    changed = Replaced(output_dir="/tmp/x", per_device_rule=True, **fine)
    with pytest.raises(UserError, match=r"unsloth backend changes the batch shape.*per_device_train_batch_size: 4 -> 8"):
        check_backend_changes(changed, {"output_dir": "/tmp/x", **fine}, "unsloth")


# --- 8. vLLM rollouts: rank, context -----------------------------------------------------------------------


def test_vllm_lora_rank_is_one_vllm_accepts():
    from rlkit.backends.unsloth_args import vllm_lora_rank

    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 16, 24, 64, 100, 300, 512)] == \
        [1, 8, 8, 16, 16, 32, 64, 128, 320, 512]
    with pytest.raises(UserError, match="vLLM serves LoRA ranks up to 512"):
        vllm_lora_rank(600)


def test_an_overlong_conversation_ends_its_episode_alone(tiny_model_dir):
    from rlkit.agents.turns import completion_budgets, overflow_turn, prompt_lengths

    tokenizer = hf.load_tokenizer(str(tiny_model_dir))
    short = [{"role": "user", "content": "What is 2 + 2?"}]
    long = [{"role": "user", "content": "What is 2 + 2? " * 60}]
    lengths = prompt_lengths(tokenizer, [short, long], [], None, {})
    assert lengths[0] < 64 < lengths[1]
    assert completion_budgets(lengths, 64, 32) == [min(32, 64 - lengths[0]), None]
    assert completion_budgets([60], 64, 32) == [4]  # generation stops at the context's end, not past it
    turn = overflow_turn(lengths[1], 64)
    assert turn.finish_reason == "length" and f"{lengths[1]} tokens" in turn.error


# --- 9. pre-Ampere GPUs ---------------------------------------------------------------------------------


def test_pre_ampere_gpus_train_in_fp16_unless_the_recipe_says():
    from rlkit.trainers import device_defaults

    recipe = load_recipe(recipes_dir() / "gsm8k_grpo.yaml")  # --smoke sets bf16 itself
    assert device_defaults(recipe, cuda=True, bf16_supported=False) == {"bf16": False, "fp16": True}
    assert device_defaults(recipe, cuda=True, bf16_supported=True) == {}
    explicit = load_recipe(recipes_dir() / "gsm8k_grpo.yaml", ["trainer.bf16=false"])
    assert device_defaults(explicit, cuda=True, bf16_supported=False) == {}
    assert device_defaults(recipe, cuda=False) == {"use_cpu": True, "bf16": False}


# --- 10. score heads stay in float32 under a 16-bit model -------------------------------------------------


@pytest.mark.ppo
def test_a_bf16_value_models_score_head_is_float32_and_learns_at_ppo_learning_rates():
    from rlkit.trainers.ppo import _value_model

    recipe = load_recipe(recipes_dir() / "gsm8k_ppo.yaml", ["model.dtype=bfloat16"], smoke=True)
    lr = trainer_config(recipe, output_dir="/tmp/x").learning_rate
    assert lr == 3e-6
    model = _value_model(recipe, None)  # the value model PPOTrainer is given
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    head = model.score.modules_to_save["default"]
    assert head.weight.dtype == torch.float32 and head.weight.requires_grad
    # One PPO value step, read as PPOTrainer reads values: backbone hidden states (bf16, no autocast) into
    # `model.score`, the value loss against a return, AdamW (TRL's: no weight decay) over what trains.
    tokenizer = hf.load_tokenizer(resolve_model_id(recipe.model.name_or_path))
    ids = tokenizer(["12 + 7 = 19"], return_tensors="pt")
    hidden = getattr(model, model.base_model_prefix)(**ids, output_hidden_states=True).hidden_states[-1]
    values = model.score(hidden)[..., 0]
    assert hidden.dtype == torch.bfloat16 and values.dtype == torch.float32
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    before = head.weight.detach().clone()
    (0.5 * (values - 1.0).square().mean()).backward()
    optimizer.step()
    moved = head.weight.detach() - before
    assert (moved != 0).float().mean().item() == 1.0  # every entry of the head moved
    assert moved.abs().max().item() <= 1.01 * lr  # by about lr: Adam's first step
    in_bf16 = before.to(torch.bfloat16)
    moved_in_bf16 = (in_bf16 + moved.to(torch.bfloat16) != in_bf16).float().mean().item()
    assert moved_in_bf16 < 0.1  # a bf16 head would have kept (nearly) all of its weights


# --- 13. odds and ends ------------------------------------------------------------------------------------


@pytest.mark.trains
def test_colocated_vllm_refuses_pre_quantized_names_on_hf():
    from rlkit.train import _check_machine

    recipe = grpo("trainer.use_vllm=true", "model.name_or_path=unsloth/Qwen3-1.7B-unsloth-bnb-4bit",
                  "model.backend=hf")
    cfg = trainer_config(recipe, output_dir="/tmp/x")
    with pytest.raises(UserError, match="trl#4973"):
        _check_machine(recipe, cfg, "hf", cuda=True)


def test_merge_check_runs_where_the_float32_model_fits(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlkit.merge.verification import fits_on_gpu

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    size = sum(p.numel() * 4 for p in model.parameters())
    assert fits_on_gpu(model, free_bytes=2 * size) and not fits_on_gpu(model, free_bytes=size)
