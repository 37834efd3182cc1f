"""`rlkit chat`: the terminal loop on a real (tiny) model, and how tool calls and results are shown."""

from rich.console import Console

from rlkit.recipe import recipes_dir


def test_chat_loop_with_the_calculator_env(tmp_path, capsys, monkeypatch):
    import copy

    from rlkit.agents.hf import HFPolicy
    from rlkit.chat import chat

    lines = iter(["What is 6 times 7?", "/reset", "", "And 2 + 2?", "/exit", "never read"])
    seen = []

    def read(prompt):
        seen.append(prompt)
        return next(lines)

    asked = []  # the conversation the model is given at each turn (the real model answers)
    real_generate = HFPolicy.generate

    def recording(self, conversations, tools):
        asked.append(copy.deepcopy(conversations[0]))
        return real_generate(self, conversations, tools)

    monkeypatch.setattr(HFPolicy, "generate", recording)

    chat("rlkit/tiny-qwen3", env="calculator", recipe_path=recipes_dir() / "gsm8k_calculator_grpo.yaml",
         max_new_tokens=8, read=read)
    out = capsys.readouterr().out
    assert len(seen) == 5  # stops at /exit
    assert "tools: calculator" in out and "(new conversation)" in out
    assert out.count("model>") + out.count("→ calculate") >= 2  # one reply per question at least
    # After /reset the model sees the system prompt and the new question only: the history is gone.
    users = [[m["content"] for m in conversation if m["role"] == "user"] for conversation in asked]
    assert users[0] == ["What is 6 times 7?"] and users[-1] == ["And 2 + 2?"]
    after = next(c for c, u in zip(asked, users, strict=True) if "And 2 + 2?" in u)
    assert after[0] == asked[0][0] and after[0]["role"] == "system" and len(after) == 2


def test_tool_calls_and_results_are_shown_as_they_happen():
    from rlkit.chat import show_messages

    console = Console(record=True, width=200)
    show_messages(console, [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "6*7"}}}]},
        {"role": "tool", "name": "calculate", "content": "42"},
        {"role": "assistant", "content": "#### 42"},
    ])
    text = console.export_text()
    assert text.splitlines() == ['→ calculate({"expression": "6*7"})', "← calculate: 42", "model> #### 42"]


def test_escape_codes_and_markup_from_models_and_tools_never_reach_the_terminal_raw():
    from rlkit.chat import show_messages

    console = Console(record=True, width=200, force_terminal=True)
    show_messages(console, [
        {"role": "assistant", "content": "\x1b]0;pwned\x07\x1b[2J[bold red]hi[/]"},
        {"role": "tool", "name": "search", "content": "doc \x1b[31mred\x1b[0m"},
    ])
    raw = console.export_text(styles=False)
    assert "\x1b" not in raw and "\x07" not in raw
    assert raw.splitlines() == [r"model> \x1b]0;pwned\x07\x1b[2J[bold red]hi[/]", r"← search: doc \x1b[31mred\x1b[0m"]
