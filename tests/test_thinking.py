"""Thinking mode: enable_thinking reaches every place the model is prompted, and earlier think blocks survive."""

from rlkit.recipe import load_recipe, recipes_dir

TRAJECTORY = [
    {"role": "system", "content": "Use the search tool."},
    {"role": "user", "content": "Who founded Acme?"},
    {"role": "assistant", "content": "", "reasoning_content": "I should search for Acme.",
     "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "Acme founder"}}}]},
    {"role": "tool", "name": "search", "content": "[1] Acme (BBC News, October 5, 2023)\nAcme was founded by Ada."},
    {"role": "assistant", "content": "<answer>Ada</answer>", "reasoning_content": "The article names Ada."},
    {"role": "user", "content": "When?"},  # a second exchange (rlkit chat): Qwen3's stock template drops earlier thinking
]


def test_rollouts_keep_earlier_think_blocks_like_trl_training(tiny_model_dir):
    """Qwen3's stock template drops earlier <think> blocks; rollouts use TRL's training template, which keeps them."""
    from transformers import AutoTokenizer

    from rlkit.agents.turns import training_template

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    template = training_template(tok)
    assert template is not None  # the tiny model has Qwen3's exact template, which is not prefix-preserving
    kwargs = {"tokenize": False, "add_generation_prompt": True, "enable_thinking": True}
    stock = tok.apply_chat_template(TRAJECTORY, **kwargs)
    trained = tok.apply_chat_template(TRAJECTORY, chat_template=template, **kwargs)
    assert "I should search for Acme." not in stock and "The article names Ada." not in stock
    assert "<think>\nI should search for Acme.\n</think>" in trained
    assert "<think>\nThe article names Ada.\n</think>" in trained
    # Thinking on: the generation prompt leaves the think block to the model; off: an empty block is pre-filled.
    assert trained.endswith("<|im_start|>assistant\n")
    off = tok.apply_chat_template(TRAJECTORY, chat_template=template, tokenize=False, add_generation_prompt=True,
                                  enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_thinking_recipes_pass_enable_thinking_to_trl_and_prompt_for_short_thinking():
    from rlkit.data import load_rows, task_rows

    for name, task_prompt in (("thinking_short_cot", "Think briefly"), ("gsm8k_thinking_short_cot", "Think briefly")):
        recipe = load_recipe(recipes_dir() / f"{name}.yaml", smoke=True)
        assert recipe.model.chat_template_kwargs == {"enable_thinking": True}
        from rlkit.trainers import trainer_config

        config = trainer_config(recipe, output_dir="/tmp/rlkit-thinking")
        assert config.chat_template_kwargs == {"enable_thinking": True}
        rows = task_rows(recipe, "grpo", load_rows(recipe.data.task, recipe.data.train))
        assert task_prompt in rows[0]["prompt"][0]["content"]
        weights = {r.name: r.weight for r in recipe.rewards}
        assert weights["short_think"] == 0.5
