"""Agent episodes: a recipe's tool environment against a model, turn by turn.

The environment classes are the ones GRPO trains with (``rlkit.envs``), so an episode sees the same
tools, tool results and errors as training. Three policies produce the assistant turns:

- :class:`rlkit.agents.hf.HFPolicy`: a local model (base, adapter or merged) through transformers; the live
  episodes' next turns are generated in batches (on CPU, episodes of one batch play together to their end,
  each turn reading only what grew its conversation).
- :class:`rlkit.agents.vllm.VLLMPolicy`: vLLM's offline engine on a GPU (a LoRA adapter is served with
  ``LoRARequest``).
- :class:`rlkit.agents.endpoint.EndpointPolicy`: any OpenAI-compatible chat-completions server (a teacher
  API, ``vllm serve``, SGLang); tools go out as the API's ``tools`` and calls come back in ``tool_calls``.
  Episodes run concurrently, at most ``concurrency`` requests at a time.

An episode ends when the model answers without a tool call, after ``max_turns`` tool rounds (TRL's
``max_tool_calling_iterations``: the calls of one more turn are then not run), or on a failure
(request error, timeout, unparsable output), which is recorded on the episode and never stops the run.

Modules: ``episodes`` (turns and episodes), ``turns`` (generated tokens as parsed turns, context budgets),
``engine`` (running episodes), ``hf``/``vllm``/``endpoint`` (policies), ``policies`` (choosing one),
``scoring`` (trajectory records), ``rollout`` (``rlkit rollout``).
"""
