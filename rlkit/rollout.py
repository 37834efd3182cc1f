"""Agent rollouts: a recipe's tool environment against a model, written to ``trajectories.jsonl``.

The environment classes are the ones GRPO trains with (``rlkit.envs``), so a rollout sees the same
tools, tool results and errors as training. Three policies produce the assistant turns:

- :class:`HFPolicy`: a local model (base, adapter or merged) through transformers; every live
  episode's next turn is generated in one batch.
- :class:`VLLMPolicy`: vLLM's offline engine on a GPU (a LoRA adapter is served with ``LoRARequest``).
- :class:`EndpointPolicy`: any OpenAI-compatible chat-completions server (a teacher API, ``vllm serve``,
  SGLang); tools go out as the API's ``tools`` and calls come back in ``tool_calls``. Episodes run
  concurrently, at most ``concurrency`` requests at a time.

An episode ends when the model answers without a tool call, after ``max_turns`` tool rounds (TRL's
``max_tool_calling_iterations``: the calls of one more turn are then not run), or on a failure
(request error, timeout, unparsable output), which is recorded on the episode and never stops the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit import runs, safety
from rlkit.errors import UserError
from rlkit.evaluate import sampling_kwargs

log = logging.getLogger("rlkit")
TRAJECTORY_KEYS = ("id", "messages")  # what every trajectory record holds: how a file rlkit wrote is told apart


@dataclass
class Turn:
    """One assistant turn as a policy produced it."""

    message: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # stop | tool_calls | length | error
    seconds: float = 0.0
    error: str | None = None
    retries: int = 0  # transient failures retried before this turn's answer (endpoints)


@dataclass
class Episode:
    """One question's conversation with the environment, turn by turn."""

    index: int
    row: dict[str, Any]
    env: Any
    messages: list[dict[str, Any]]
    prompt_length: int
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    done: bool = False
    stopped_by: str | None = None  # "max_turns" when the turn limit ended the episode
    first_turn: int = 0  # tool rounds count from this turn (a chat resets it at each user message)

    @property
    def completion(self) -> list[dict[str, Any]]:
        """The trajectory after the prompt: assistant turns and tool results (what rewards read)."""
        return self.messages[self.prompt_length:]

    def take(self, turn: Turn, *, max_turns: int, tool_timeout: float | None) -> None:
        """Record ``turn``; run its tool calls unless the turn limit is reached; decide whether the episode ends."""
        from rlkit.envs import call_tool

        usage = {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                 "total_tokens": turn.prompt_tokens + turn.completion_tokens,
                 "finish_reason": turn.finish_reason, "seconds": round(turn.seconds, 4), "retries": turn.retries}
        self.turns.append(usage)
        if turn.error is not None:
            self.error, self.done = turn.error, True
            return
        self.messages.append(turn.message)
        calls = turn.message.get("tool_calls") or []
        if not calls:
            self.done = True
            return
        tool_rounds = sum(1 for t in self.turns[self.first_turn:-1] if t["finish_reason"] == "tool_calls")
        if tool_rounds >= max_turns:
            self.done, self.stopped_by = True, "max_turns"
            return
        for i, call in enumerate(calls):
            function = call.get("function", {})
            name, arguments = function.get("name", ""), function.get("arguments", {})
            result = call_tool(self.env, name, arguments, timeout=tool_timeout)
            call_id = call.get("id") or f"call_{len(self.turns)}_{i}"
            call["id"] = call_id
            self.messages.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": result.content})
            self.tool_calls.append({"turn": len(self.turns), "name": name, "arguments": result.arguments,
                                    "content": result.content, "error": result.error,
                                    "seconds": round(result.seconds, 4)})
            if result.timed_out:  # the call may still be running inside this env: the episode cannot go on
                self.error, self.done = f"tool timeout: {name} {result.error}", True
                return


# ---------------------------------------------------------------------------------------------
# Policies


class HFPolicy:
    """A local transformers model; generates the next turn of many episodes in one batch."""

    concurrent = False

    def __init__(self, model: Any, tokenizer: Any, *, chat_template_kwargs: dict[str, Any], max_new_tokens: int,
                 temperature: float = 0.0, batch_size: int = 32) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.kwargs, self.max_new_tokens = chat_template_kwargs, max_new_tokens
        self.temperature, self.batch_size = temperature, batch_size
        require_response_parser(tokenizer)
        self.template = training_template(tokenizer)

    def generate(self, conversations: Sequence[list[dict[str, Any]]], tools: list[dict]) -> list[Turn]:
        import torch

        from rlkit.fastgen import length_order

        tok = self.tokenizer
        tok.padding_side = "left"
        self.model.eval()
        device = next(self.model.parameters()).device
        turns: list[Turn] = []
        sampling = sampling_kwargs(self.temperature)
        rendered = [tok.apply_chat_template(c, tools=tools, tokenize=False, add_generation_prompt=True,
                                            chat_template=self.template, **self.kwargs) for c in conversations]
        # Similar lengths share a batch (less padding); turns go back in conversation order at the end.
        order = length_order([len(ids) for ids in tok(rendered, add_special_tokens=False)["input_ids"]])
        for start in range(0, len(conversations), self.batch_size):
            texts = [rendered[i] for i in order[start:start + self.batch_size]]
            batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            started = time.time()
            with torch.inference_mode():
                out = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, pad_token_id=tok.pad_token_id,
                                          **sampling)
            seconds = (time.time() - started) / len(texts)
            width = batch["input_ids"].shape[1]
            for row, mask in zip(out.tolist(), batch["attention_mask"].tolist(), strict=True):
                prompt_ids = [t for t, m in zip(row[:width], mask, strict=True) if m]
                ids = _until_eos(row[width:], tok.eos_token_id)
                turns.append(parsed_turn(tok, ids, prompt_ids, self.max_new_tokens, seconds))
        position = {i: pos for pos, i in enumerate(order)}
        return [turns[position[i]] for i in range(len(turns))]


class VLLMPolicy:
    """vLLM's offline engine (GPU only). An adapter is applied per request through ``LoRARequest``."""

    concurrent = False

    def __init__(self, model_path: str, tokenizer: Any, *, adapter: str | None, max_lora_rank: int,
                 chat_template_kwargs: dict[str, Any], max_new_tokens: int, temperature: float = 0.0,
                 max_model_len: int | None = None, gpu_memory_utilization: float = 0.8,
                 quantization: str | None = None) -> None:
        try:
            from vllm import LLM, SamplingParams
            from vllm.lora.request import LoRARequest
        except ImportError:
            raise UserError("--backend vllm needs vLLM: pip install 'rlkit[gpu]' (CUDA only)") from None
        from rlkit.backends.unsloth_args import vllm_lora_rank

        self.tokenizer, self.kwargs = tokenizer, chat_template_kwargs
        self.max_new_tokens = max_new_tokens
        extra = {"quantization": quantization} if quantization else {}
        self.llm = LLM(model=model_path, enable_lora=adapter is not None, max_lora_rank=vllm_lora_rank(max_lora_rank),
                       max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization, **extra)
        self.max_model_len = max_model_len or self.llm.llm_engine.model_config.max_model_len
        self.lora = LoRARequest("adapter", 1, adapter) if adapter else None
        self.sampling = SamplingParams(temperature=temperature, max_tokens=max_new_tokens)
        require_response_parser(tokenizer)
        self.template = training_template(tokenizer)

    def generate(self, conversations: Sequence[list[dict[str, Any]]], tools: list[dict]) -> list[Turn]:
        from vllm import SamplingParams

        started = time.time()
        lengths = prompt_lengths(self.tokenizer, conversations, tools, self.template, self.kwargs)
        budgets = completion_budgets(lengths, self.max_model_len, self.max_new_tokens)
        fit = [i for i, b in enumerate(budgets) if b is not None]
        turns = [overflow_turn(n, self.max_model_len) for n in lengths]
        if not fit:
            return turns
        params = [SamplingParams(temperature=self.sampling.temperature, max_tokens=budgets[i]) for i in fit]
        outputs = self.llm.chat([conversations[i] for i in fit], params, tools=tools, lora_request=self.lora,
                                chat_template=self.template, chat_template_kwargs=self.kwargs, use_tqdm=False)
        seconds = (time.time() - started) / max(len(conversations), 1)
        for i, o in zip(fit, outputs, strict=True):
            turns[i] = parsed_turn(self.tokenizer, list(o.outputs[0].token_ids), list(o.prompt_token_ids),
                                   self.max_new_tokens, seconds)
        return turns


def prompt_lengths(tokenizer: Any, conversations: Sequence[list[dict[str, Any]]], tools: list[dict],
                   template: str | None, kwargs: dict[str, Any]) -> list[int]:
    """Tokens of each conversation as the policy prompts it (chat template, tools, generation prompt)."""
    texts = [tokenizer.apply_chat_template(c, tools=tools, tokenize=False, add_generation_prompt=True,
                                           chat_template=template, **kwargs) for c in conversations]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def completion_budgets(lengths: Sequence[int], max_model_len: int, max_new_tokens: int) -> list[int | None]:
    """Per prompt, the tokens it may generate inside the context, or None where none fit.

    vLLM refuses a prompt as long as its context with an exception that would end every episode of the
    batch; a multi-turn episode grows until it gets there, so that episode alone ends, with an error.
    """
    return [min(max_new_tokens, max_model_len - n) if n < max_model_len else None for n in lengths]


def overflow_turn(prompt_tokens: int, max_model_len: int) -> Turn:
    return Turn({}, prompt_tokens=prompt_tokens, finish_reason="length",
                error=f"context overflow: the conversation has {prompt_tokens} tokens, the model's context "
                      f"{max_model_len} (model.max_seq_length)")


class EndpointPolicy:
    """An OpenAI-compatible chat-completions endpoint, through the ``openai`` client.

    Every request has a total deadline of ``timeout`` seconds (``asyncio.wait_for``: the client's own
    timeout bounds each read, so a server that trickles bytes would otherwise hold a request forever).
    Transient failures (connection errors, the deadline, 429, 5xx) are retried up to ``max_retries``
    times with exponential backoff, and each turn records how many retries it took.
    """

    concurrent = True

    def __init__(self, endpoint: str, *, api_key: str | None, served_model: str | None, max_new_tokens: int,
                 temperature: float = 0.0, timeout: float = 120.0, max_retries: int = 2,
                 backoff: float = 0.5) -> None:
        self.endpoint, self.served_model, self.api_key = endpoint, served_model, api_key or "EMPTY"
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.client = self._client()

    def _client(self) -> Any:
        import openai

        # Retries are rlkit's (counted, recorded) and the deadline is rlkit's `wait_for`; the client's own
        # per-read timeout only backs it up, a little later, so the total deadline is what a user sees.
        return openai.AsyncOpenAI(base_url=self.endpoint, api_key=self.api_key, timeout=self.timeout + 5,
                                  max_retries=0)

    def preflight(self) -> str:
        """One tiny request before any episode: a dead endpoint, a wrong model or a bad key is a UserError here,
        whatever flags were given, instead of N failed episodes. Returns the served model's name."""
        return asyncio.run(self._preflight())

    async def _preflight(self) -> str:
        # Its own client: an httpx pool must not outlive the event loop it was made in.
        client, self.client = self.client, self._client()
        try:
            name = await self.model_name()
            messages = [{"role": "user", "content": PREFLIGHT_PROMPT}]
            response, error, _ = await self._request(lambda: self.client.chat.completions.create(
                model=name, messages=messages, max_completion_tokens=1, temperature=0.0))
        finally:
            await self.client.close()
            self.client = client
        if error is not None:
            raise UserError(f"--endpoint {self.endpoint}: the preflight request to model {name!r} failed "
                            f"({_describe(error)}); check the URL and that the server is up") from None
        return name

    async def model_name(self) -> str:
        """The served model: ``--served-model``, or the endpoint's only model."""
        if self.served_model is None:
            response, error, _ = await self._request(self._list_models)
            if error is not None:
                raise UserError(f"--endpoint {self.endpoint}: cannot list models ({_describe(error)}); "
                                "check the URL, or pass --served-model")
            if len(response) != 1:
                raise UserError(f"--endpoint {self.endpoint} serves {len(response)} models "
                                f"({', '.join(response[:5]) or 'none'}); pick one with --served-model")
            self.served_model = response[0]
        return self.served_model

    async def _list_models(self) -> list[str]:
        return [m.id async for m in self.client.models.list()]

    async def _request(self, make: Callable[[], Any]) -> tuple[Any, Exception | None, int]:
        """``(response, None, retries)`` or ``(None, error, retries)``; misconfiguration raises a UserError."""
        import openai

        retries = 0
        while True:
            try:
                return await asyncio.wait_for(make(), self.timeout), None, retries
            except _fatal_errors() as e:  # every request would fail the same way: stop, don't record N failures
                raise UserError(f"--endpoint {self.endpoint}: {_describe(e)}; check --api-key, --served-model and "
                                "that the server accepts tools") from None
            except TimeoutError:
                error: Exception = DeadlineExceeded(f"no complete response within {self.timeout:g}s")
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as e:
                error = e
            except openai.OpenAIError as e:  # e.g. 422: this request is wrong, another may not be
                return None, e, retries
            if retries >= self.max_retries:
                return None, error, retries
            retries += 1
            await asyncio.sleep(min(self.backoff * 2 ** (retries - 1), 8.0))

    async def agenerate(self, messages: list[dict[str, Any]], tools: list[dict]) -> Turn:
        started = time.time()
        model = await self.model_name()
        response, error, retries = await self._request(lambda: self.client.chat.completions.create(
            model=model, messages=[_openai_message(m) for m in messages], tools=tools or None,
            max_completion_tokens=self.max_new_tokens, temperature=self.temperature))
        seconds = time.time() - started
        if error is not None:
            return Turn({}, finish_reason="error", seconds=seconds, error=f"endpoint error: {_describe(error)}",
                        retries=retries)
        if not response.choices:
            return Turn({}, finish_reason="error", seconds=seconds, error="endpoint error: no choices in the response",
                        retries=retries)
        choice = response.choices[0]
        message: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
        # vLLM >= 0.11 and OpenRouter say `reasoning`; older vLLM and DeepSeek `reasoning_content`.
        reasoning = getattr(choice.message, "reasoning", None) or getattr(choice.message, "reasoning_content", None)
        if reasoning:
            message["reasoning_content"] = reasoning
        if choice.message.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                for c in choice.message.tool_calls]
        usage = response.usage
        finish = "tool_calls" if message.get("tool_calls") else (choice.finish_reason or "stop")
        return Turn(message, prompt_tokens=usage.prompt_tokens if usage else 0,
                    completion_tokens=usage.completion_tokens if usage else 0, finish_reason=finish, seconds=seconds,
                    retries=retries)


PREFLIGHT_PROMPT = "Reply with the word OK."


class DeadlineExceeded(Exception):
    """A request that did not complete within the policy's total deadline."""


def transport_failures(records: list[dict[str, Any]]) -> dict[str, int]:
    """Episodes that ended on an endpoint error, by error type (``APIConnectionError``: 3, ...)."""
    import collections

    kinds = (r["error"].removeprefix("endpoint error: ").partition(":")[0] for r in records
             if (r.get("error") or "").startswith("endpoint error: "))
    return dict(collections.Counter(kinds).most_common())


def _fatal_errors() -> tuple[type[Exception], ...]:
    import openai

    return (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError, openai.BadRequestError)


def _describe(error: Exception) -> str:
    from rlkit.secrets import redact

    text = redact(str(error).strip().splitlines()[0]) if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _arguments(raw: str | None) -> dict[str, Any] | str:
    """Tool-call arguments as a dict; a string that is not a JSON object stays a string (the tool call fails)."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return raw or ""
    return value if isinstance(value, dict) else raw or ""


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """rlkit's chat message (transformers' form) as the chat-completions API wants it."""
    out = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id") or f"call_{i}", "type": "function",
             "function": {"name": c["function"]["name"],
                          "arguments": c["function"]["arguments"] if isinstance(c["function"]["arguments"], str)
                          else json.dumps(c["function"]["arguments"])}}
            for i, c in enumerate(message["tool_calls"])]
    if message["role"] == "tool":
        out["tool_call_id"] = message.get("tool_call_id", "")
    return out


def require_response_parser(tokenizer: Any) -> None:
    """Give the tokenizer TRL's response parser for its chat template (how tool calls are read from text)."""
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return
    from rlkit.compat import add_response_schema

    try:
        add_response_schema(tokenizer)
    except ValueError:
        raise UserError("the model's chat template is not one TRL can parse tool calls from; set "
                        "`tokenizer.response_template` in the model's tokenizer_config (see transformers' "
                        "chat response parsing docs)") from None


def training_template(tokenizer: Any) -> str | None:
    """The chat template TRL trains tool episodes with: the model's own if it keeps earlier turns verbatim,
    else TRL's prefix-preserving variant (Qwen3's stock template drops earlier ``<think>`` blocks). Rollouts
    render with it so a policy is evaluated on the context it was trained on."""
    from rlkit.compat import get_training_chat_template, is_chat_template_prefix_preserving

    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


def parsed_turn(tokenizer: Any, ids: list[int], prompt_ids: list[int], max_new_tokens: int, seconds: float) -> Turn:
    """A generated token sequence as an assistant message, tool calls parsed the way TRL parses them."""
    from rlkit.compat import parse_response

    finished = bool(ids) and ids[-1] == tokenizer.eos_token_id
    message = parse_response(tokenizer, ids, prefix=prompt_ids) if ids else {"role": "assistant", "content": ""}
    message = {k: v for k, v in message.items() if v is not None}
    message["role"] = "assistant"
    if message.get("tool_calls"):
        finish = "tool_calls"
    else:
        finish = "stop" if finished or len(ids) < max_new_tokens else "length"
    return Turn(message, prompt_tokens=len(prompt_ids), completion_tokens=len(ids), finish_reason=finish,
                seconds=seconds)


def _until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:ids.index(eos) + 1] if eos in ids else ids


# ---------------------------------------------------------------------------------------------
# The engine


def run_episodes(rows: Sequence[dict[str, Any]], make_env: Callable[[], Any], policy: Any, *, max_turns: int,
                 tool_timeout: float | None = 30.0, concurrency: int = 8, show_progress: bool = True,
                 on_done: Callable[[Episode], None] | None = None) -> list[Episode]:
    """Run one episode per row to the end; returns them in row order. ``on_done(episode)`` sees each one
    as it finishes (to write it at once)."""
    on_done = on_done or (lambda episode: None)
    from rlkit import progress
    from rlkit.envs import tool_schemas

    episodes = []
    for i, row in enumerate(rows):
        env = make_env()
        appended = env.reset(**row)
        messages = [dict(m) for m in row["prompt"]]
        if appended:  # TRL's contract: text from reset() is appended to the last user message
            messages[-1]["content"] = f"{messages[-1]['content']}\n\n{appended}"
        episodes.append(Episode(i, row, env, messages, prompt_length=len(messages)))
    if not episodes:
        return episodes
    tools = tool_schemas(episodes[0].env)
    with progress.bar("rollouts", len(episodes), show=show_progress) as advance:
        if policy.concurrent:
            asyncio.run(_run_concurrent(episodes, policy, tools, max_turns, tool_timeout, concurrency, advance,
                                        on_done))
        else:
            while live := [e for e in episodes if not e.done]:
                for episode, turn in zip(live, policy.generate([e.messages for e in live], tools), strict=True):
                    episode.take(turn, max_turns=max_turns, tool_timeout=tool_timeout)
                    if episode.done:
                        on_done(episode)
                        advance()
    return episodes


async def _run_concurrent(episodes: list[Episode], policy: Any, tools: list[dict], max_turns: int,
                          tool_timeout: float | None, concurrency: int, advance: Callable[[], None],
                          on_done: Callable[[Episode], None]) -> None:
    await policy.model_name()  # fail once, clearly, before any episode runs
    limit = asyncio.Semaphore(concurrency)

    async def play(episode: Episode) -> None:
        try:
            while not episode.done:
                async with limit:
                    turn = await policy.agenerate(episode.messages, tools)
                # Tools may block (a search on a large index); keep the event loop serving other episodes.
                await asyncio.to_thread(episode.take, turn, max_turns=max_turns, tool_timeout=tool_timeout)
        except UserError:
            raise
        except Exception as e:  # one malformed response must not cost the other episodes
            log.exception("episode %d failed", episode.index)
            episode.error, episode.done = f"rollout error: {_describe(e)}", True
        on_done(episode)
        advance()

    await asyncio.gather(*(play(e) for e in episodes))


def score_episodes(episodes: list[Episode], recipe: Any) -> list[dict[str, Any]]:
    """Trajectory records: rewards from the recipe's ``rewards:``, the task's answer metrics, env metrics."""
    from rlkit.data import get_task, success_rule
    from rlkit.envs import env_metrics
    from rlkit.rewards import RewardSet
    from rlkit.rewards.qa import final_answer

    task, succeeded = get_task(recipe.data.task), success_rule(recipe)
    rewards = RewardSet(recipe.rewards) if recipe.rewards else None
    totals: list[float | None] = [None] * len(episodes)
    per_reward: dict[str, list[float]] = {}
    if rewards is not None and episodes:
        columns = {key: [e.row.get(key) for e in episodes] for key in episodes[0].row if key != "prompt"}
        totals, per_reward = rewards([e.row["prompt"] for e in episodes], [e.completion for e in episodes], **columns)
    from rlkit.rewards.text import completion_text

    records = []
    for i, e in enumerate(episodes):
        metrics = {**task.episode_metrics(e.completion, e.row), **env_metrics(e.env), **evidence_recall(e)}
        usage = {key: sum(t[key] for t in e.turns) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
        records.append({
            "id": e.row.get("id", str(e.index)), "question_type": e.row.get("question_type"),
            "messages": e.messages, "tool_calls": e.tool_calls, "turns": e.turns, "usage": usage,
            "rounds": sum(1 for m in e.completion if m["role"] == "assistant"),
            "reward": totals[i], "rewards": {name: values[i] for name, values in per_reward.items()},
            "metrics": metrics, "success": e.error is None and succeeded(metrics), "error": e.error,
            "stopped_by": e.stopped_by, "answer": e.row.get("answer"),
            "retries": sum(t.get("retries", 0) for t in e.turns),
            "searches": getattr(e.env, "searches", None), "supporting_ids": e.row.get("supporting_ids"),
            "prediction": final_answer(completion_text(e.completion)),
        })
    return records


def evidence_recall(episode: Episode) -> dict[str, float]:
    """``{"evidence_recall": share of the row's supporting ids among the documents the episode's searches
    returned}``, matched by document id (by title for a corpus without ids); ``{}`` when either is unknown."""
    gold = set(episode.row.get("supporting_ids") or ())
    searches = getattr(episode.env, "searches", None)
    if not gold or searches is None:
        return {}
    found = {r["doc_id"] if r.get("doc_id") is not None else r.get("title") for s in searches for r in s["results"]}
    return {"evidence_recall": len(gold & found) / len(gold)}


def sft_records(records: list[dict[str, Any]], tools: list[dict]) -> list[dict[str, Any]]:
    """SFT rows (``messages`` plus ``tools``, a JSON string as TRL reads it) from the successful trajectories
    whose every tool call succeeded: a malformed or failed call is not a behaviour to teach."""
    schema = json.dumps(tools)
    return [{"messages": r["messages"], "tools": schema} for r in records
            if r["success"] and all(call.get("error") is None for call in r["tool_calls"])]


# ---------------------------------------------------------------------------------------------
# `rlkit rollout` and `rlkit eval` for agent recipes


def rollout(target: str | Path, *, model: str | None = None, endpoint: str | None = None, api_key: str | None = None,
            served_model: str | None = None, concurrency: int = 8, backend: str = "hf", split: str = "eval",
            limit: int | None = None, out: str | Path | None = None, sft_out: str | Path | None = None,
            temperature: float = 0.0, max_new_tokens: int | None = None, tool_timeout: float = 30.0,
            timeout: float = 120.0, retries: int = 2, smoke: bool = False, overrides: list[str] | None = None,
            show_progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """Run the recipe's agent on a split; append each finished episode to ``trajectories.jsonl`` (and the
    successful ones as SFT rows at the end). ``resume`` plays only the rows ``out`` does not hold yet."""
    from rlkit.evaluate import resolve_target

    recipe, run_dir = resolve_target(target, overrides, smoke)
    if recipe.env is None:
        raise UserError(f"{target}: the recipe has no `env:` (tool environment), so there is nothing to roll out")
    if endpoint and (model or backend != "hf"):
        raise UserError("--endpoint generates on the server; drop --model/--backend")
    if sft_out is not None:
        safety.check_target(sft_out, "--sft-out")
        if Path(sft_out).exists():
            raise UserError(f"--sft-out {sft_out}: already exists; choose a new file")
    if out is not None:
        safety.check_target(out, "--out")
        if Path(out).exists() and not resume:
            raise UserError(f"--out {out}: already exists; pass --resume to continue it, or choose a new file")
        if Path(out).exists():
            safety.check_replaceable_file(out, "--out", TRAJECTORY_KEYS)
    if resume and out is None:
        raise UserError("--resume continues the trajectories file given by --out; name it")
    from rlkit.envs import make_factory

    # Data and environment (its index) first: a bad split or corpus fails before a model loads.
    rows, make_env = _episode_rows(recipe, split, limit), make_factory(recipe)
    policy, label = make_policy(recipe, run_dir, model=model, endpoint=endpoint, api_key=api_key,
                                served_model=served_model, backend=backend, temperature=temperature,
                                max_new_tokens=max_new_tokens, timeout=timeout, retries=retries)
    path = Path(out) if out else _free_path(_default_dir(recipe.name, run_dir, label) / "trajectories.jsonl")
    with safety.hold(path):
        with safety.JsonlAppender(path, resume=resume, keys=TRAJECTORY_KEYS) as sink:
            _play(recipe, rows, make_env, policy, tool_timeout, concurrency, show_progress, sink)
        records = _in_row_order(path, rows)
    result: dict[str, Any] = {"path": str(path), "episodes": len(records),
                              "successes": sum(r["success"] for r in records),
                              "transport_failures": transport_failures(records)}
    if sft_out is not None:
        from rlkit.envs import tool_schemas

        sft_rows = sft_records(records, tool_schemas(make_env()))
        runs.write_jsonl(sft_rows, sft_out)
        result.update(sft_path=str(sft_out), sft_rows=len(sft_rows))
    return result


def evaluate_agent(recipe: Any, run_dir: Path | None, model: str | None, *, limit: int | None,
                   out: str | Path | None, show_progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """``rlkit eval`` of an agent recipe: greedy rollouts on the eval split, scored like ``rlkit analyze``."""
    from rlkit.analyze import analyze
    from rlkit.envs import make_factory
    from rlkit.evaluate import _default_out, _write, journal

    rows, make_env = _episode_rows(recipe, "eval", limit), make_factory(recipe)
    policy, label = make_policy(recipe, run_dir, model=model)
    started = time.time()
    results_path = Path(out) if out else _default_out(recipe.name, run_dir, label)
    with safety.hold(results_path), journal(results_path, ".trajectories.jsonl", resume, TRAJECTORY_KEYS) as sink:
        _play(recipe, rows, make_env, policy, 30.0, 8, show_progress, sink)
        sink.close()
        trajectories = sink.path
        records = _in_row_order(trajectories, rows)
        report = analyze(trajectories)
        overall = report["answers"]["all"]
        results = {"recipe": recipe.name, "model": label, "task": recipe.data.task, "n": len(records),
                   "accuracy": overall["accuracy"], "em": overall["em"], "f1": overall["f1"],
                   "evidence_recall": overall.get("evidence_recall"),
                   "by_question_type": report["answers"], "seconds": round(time.time() - started, 2),
                   "trajectories": str(trajectories)}
        return _write(results, results_path)


def _episode_rows(recipe: Any, split: str, limit: int | None) -> list[dict[str, Any]]:
    from rlkit.data import load_rows, task_rows

    source = recipe.data.eval if split == "eval" else recipe.data.train
    if source is None:
        raise UserError(f"the recipe has no data.{split} split")
    if limit:
        source = source.model_copy(update={"limit": limit})
    return task_rows(recipe, "eval", load_rows(recipe.data.task, source)).to_list()


def _play(recipe: Any, rows: list[dict[str, Any]], make_env: Callable[[], Any], policy: Any, tool_timeout: float,
          concurrency: int, show_progress: bool, sink: Any) -> None:
    """Play the rows whose record ``sink`` does not hold yet; write each record the moment its episode ends."""
    done = {str(r.get("id")) for r in sink.done}
    todo = [(i, row) for i, row in enumerate(rows) if str(row.get("id", i)) not in done]
    if sink.done:
        log.info("%s: %d episodes already written; playing the other %d", sink.path, len(sink.done), len(todo))

    def write(episode: Episode) -> None:
        record = score_episodes([episode], recipe)[0]
        record["id"] = episode.row.get("id", str(todo[episode.index][0]))  # or the row's place in the whole split
        if not sink.written:  # the path a killed run's --resume needs
            log.info("writing trajectories to %s as episodes finish", sink.path)
        sink.write(record)

    run_episodes([row for _, row in todo], make_env, policy, max_turns=recipe.env.max_turns, tool_timeout=tool_timeout,
                 concurrency=concurrency, show_progress=show_progress, on_done=write)


def _in_row_order(path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite a finished trajectories file (written as episodes ended) in the split's row order."""
    from rlkit.jsonl import read_records

    place = {str(row.get("id", i)): i for i, row in enumerate(rows)}
    records = sorted(read_records(path), key=lambda r: place.get(str(r.get("id")), len(place)))
    runs.write_jsonl(records, path)
    return records


def make_policy(recipe: Any, run_dir: Path | None, *, model: str | None = None, endpoint: str | None = None,
                api_key: str | None = None, served_model: str | None = None, backend: str = "hf",
                temperature: float = 0.0, max_new_tokens: int | None = None, timeout: float = 120.0,
                retries: int = 2) -> tuple[Any, str]:
    """(policy, label) for an endpoint, vLLM on this GPU, or a local hf model (run dir, adapter, merged or base)."""
    import os

    max_new_tokens = max_new_tokens or recipe.eval.max_new_tokens
    kwargs = recipe.model.chat_template_kwargs
    if endpoint:
        from rlkit import secrets

        key = api_key or os.environ.get("OPENAI_API_KEY")  # read, never written anywhere
        secrets.register(key)  # masked in logs, errors and trajectories from here on
        # The recipe's chat_template_kwargs are the student's; a teacher endpoint gets its own defaults.
        policy = EndpointPolicy(endpoint, api_key=key, served_model=served_model, max_new_tokens=max_new_tokens,
                                temperature=temperature, timeout=timeout, max_retries=retries)
        return policy, policy.preflight()  # outputs are named after the served model, not host:port
    if backend == "vllm":
        from rlkit.backends import cuda_available, hf
        from rlkit.backends.recorded import run_dir_of, trained_base
        from rlkit.tiny import resolve_model_id

        if not cuda_available():
            raise UserError("--backend vllm needs a CUDA GPU and this machine has none; use --backend hf")
        adapter = hf.adapter_dir(Path(model)) if model and runs.holds_adapter(model) else (
            run_dir / "adapter" if run_dir and not model else None)
        spec, quantization = trained_base(recipe.model, run_dir_of(adapter) if adapter else None)
        base = resolve_model_id(spec.name_or_path) if adapter or not model else model
        four_bit = bool(adapter or not model) and (spec.load_in_4bit or quantization is not None)
        tokenizer = hf.load_tokenizer(str(adapter) if adapter else base)
        # A QLoRA adapter is served on a bitsandbytes 4-bit base, as it was trained (vLLM quantizes a 16-bit
        # checkpoint itself and reads a pre-quantized one's config).
        policy = VLLMPolicy(base, tokenizer, adapter=str(adapter) if adapter else None,
                            max_lora_rank=recipe.lora.r if recipe.lora else 16, chat_template_kwargs=kwargs,
                            max_new_tokens=max_new_tokens, temperature=temperature,
                            max_model_len=recipe.model.max_seq_length,
                            quantization="bitsandbytes" if four_bit else None)
        return policy, str(adapter or base)
    if backend != "hf":
        raise UserError(f"--backend {backend!r}: use hf or vllm")
    from rlkit.evaluate import load_for_eval

    lm, tokenizer, label = load_for_eval(recipe, run_dir, model)
    return HFPolicy(lm, tokenizer, chat_template_kwargs=kwargs, max_new_tokens=max_new_tokens,
                    temperature=temperature, batch_size=recipe.eval.batch_size), label


def _free_path(path: Path) -> Path:
    """``path``, or ``stem-2.jsonl``, ``stem-3.jsonl``...: a later rollout never overwrites an earlier one."""
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def _default_dir(name: str, run_dir: Path | None, label: str) -> Path:
    from rlkit.evaluate import model_tag

    return (run_dir / "rollouts" if run_dir else Path("rollouts") / name) / model_tag(label)
