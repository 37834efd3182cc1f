"""LLM-judge rewards through any OpenAI-compatible endpoint (vLLM, SGLang, Ollama, a hosted API).

- ``judge``: the endpoint's model decides whether a completion's final answer is equivalent to the
  reference (the ``answer`` column, plus an ``aliases`` column when the data has one). 0/1 by default
  (the reply must end ``VERDICT: CORRECT`` / ``VERDICT: INCORRECT``); ``graded: true`` asks for
  ``SCORE: x`` with x in [0, 1]. ``rubric:`` replaces the prompt; it may use ``{question}``,
  ``{reference}`` and ``{completion}`` and must keep the reply format.
- ``rank`` (RULER-style): the judge sees every completion for the same prompt at once and scores each
  relative to the others, no reference needed; the reply is JSON ``{"scores": [...]}``. Scores are then
  min-max normalised within the group (best 1, worst 0, all equal 0.5). A prompt with one completion
  has nothing to be ranked against and gets ``None``.

A recipe names them like any reward::

    rewards:
      - name: judge
        args: {endpoint: "http://localhost:8000/v1", model: Qwen/Qwen3-8B, api_key_env: JUDGE_KEY}

Requests, cache, retries and metrics are :mod:`rlkit.rewards.judge_client`'s. **When the judge fails**
(after ``max_retries`` retries of a request): ``on_failure: stop`` (the default) stops the run with one
line saying how many requests failed and why; ``on_failure: skip`` returns ``None`` for those completions,
and ``None`` is then 0 almost everywhere: TRL's GRPO keeps a completion out of its group's baseline (advantage
0) only when *every* reward returned ``None`` for it, and otherwise sums the other rewards alone (a judge term
of 0); ``rlkit pairs``, PPO's rule rewards, agent rollouts/evals and the doctor count ``None`` as 0
(``RewardSet``). docs/agents.md says where each happens. ``rlkit eval``'s accuracy never calls the judge (the
task's answer rule scores it).

Before training, the doctor sends one request to each judge (an unreachable one is a single blocking
line) and puts ``judge`` through the reward card: 11 batches of its 4 rows (gold forms and adversarial
probes, the long ones cut to their last ``max_chars``), answered once and cached. ``rank`` is left out of
the card, whose probes come one per prompt.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from rlkit.rewards.judge_client import DEFAULT_KEY_ENV, Malformed, Settings, ask, cache_key, report

JUDGE_RUBRIC = """You grade a response against a reference answer.

Question:
{question}

Reference answer: {reference}

Response:
{completion}

Is the response's final answer equivalent to the reference answer? Equivalent means the same value or \
meaning; wording, formatting, units written differently and the working shown do not matter. An answer \
that hedges between several values is not equivalent. End your reply with exactly one line: \
VERDICT: CORRECT or VERDICT: INCORRECT"""

GRADED_RUBRIC = """You grade a response against a reference answer.

Question:
{question}

Reference answer: {reference}

Response:
{completion}

How right is the response's final answer, from 0 (wrong) to 1 (equivalent to the reference)? Give \
partial credit only for a partly right answer. End your reply with exactly one line: SCORE: <number>"""

RANK_RUBRIC = """Several responses to the same task follow. Score each from 0 (worst) to 1 (best) relative \
to the others: how well does it accomplish the task (correct, complete, follows the instructions)?

Task:
{question}

{responses}

Reply with JSON only: {{"scores": [one number per response, in order]}}"""

_VERDICT = re.compile(r"VERDICT:\s*\**\s*(CORRECT|INCORRECT)\b", re.IGNORECASE)
_SCORE = re.compile(r"SCORE:\s*\**\s*([-+]?\d*\.?\d+)", re.IGNORECASE)
FAILURE_POLICIES = ("stop", "skip")
log = logging.getLogger("rlkit")


def judge(prompts: list, completions: list, answer: list, *, endpoint: str = "", model: str = "",
          api_key_env: str = DEFAULT_KEY_ENV, rubric: str | None = None, graded: bool = False,
          concurrency: int = 8, timeout: float = 60.0, max_retries: int = 3, max_tokens: int = 256,
          max_chars: int = 8000, cache: str | bool = True, on_failure: str = "stop", **columns) -> list[float | None]:
    """1.0 where the judge finds the completion's final answer equivalent to the reference, else 0.0
    (``graded``: the judge's score in [0, 1]); ``None`` only for failures under ``on_failure: skip``."""
    settings = _settings(endpoint, model, api_key_env, concurrency, timeout, max_retries, max_tokens, cache,
                         on_failure, max_chars)
    template = rubric or (GRADED_RUBRIC if graded else JUDGE_RUBRIC)
    _check_template(template, ("question", "reference", "completion"))
    aliases = columns.get("aliases") or [None] * len(completions)
    jobs = []
    for prompt, completion, gold, more in zip(prompts, completions, answer, aliases, strict=True):
        question, text = question_text(prompt), _tail(completion_text(completion), max_chars)
        reference = str(gold) + (f" (also accepted: {'; '.join(map(str, more))})" if more else "")
        content = template.format(question=question, reference=reference, completion=text)
        jobs.append((cache_key(settings, template, question, text, reference), [{"role": "user", "content": content}],
                     _parse_score if graded else _parse_verdict))
    values, stats = ask(settings, jobs)
    stats.skipped = sum(v is None for v in values) if on_failure == "skip" else 0
    report("judge", stats, columns.get("log_metric"))  # TRL passes log_metric in training
    return _settle(values, stats, settings, on_failure, "judge")


def rank(prompts: list, completions: list, *, endpoint: str = "", model: str = "",
         api_key_env: str = DEFAULT_KEY_ENV, rubric: str | None = None, concurrency: int = 8, timeout: float = 60.0,
         max_retries: int = 3, max_tokens: int = 512, max_chars: int = 4000, cache: str | bool = True,
         on_failure: str = "stop", **columns) -> list[float | None]:
    """RULER-style relative scores: each group of completions for the same prompt is scored by the judge
    in one request and min-max normalised within the group (``None`` for a prompt with one completion)."""
    settings = _settings(endpoint, model, api_key_env, concurrency, timeout, max_retries, max_tokens, cache,
                         on_failure, max_chars)
    template = rubric or RANK_RUBRIC
    _check_template(template, ("question", "responses"))
    groups: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(json.dumps(prompt, sort_keys=True, default=str), []).append(i)
    ranked = [members for members in groups.values() if len(members) > 1]
    jobs = []
    for members in ranked:
        question = question_text(prompts[members[0]])
        texts = [_tail(completion_text(completions[i]), max_chars) for i in members]
        responses = "\n\n".join(f"Response {n}:\n{t}" for n, t in enumerate(texts, 1))
        content = template.format(question=question, responses=responses)
        jobs.append((cache_key(settings, template, question, texts), [{"role": "user", "content": content}],
                     _scores_parser(len(members))))
    values, stats = ask(settings, jobs)
    if on_failure == "skip":
        stats.skipped = sum(len(members) for members, group in zip(ranked, values, strict=True) if group is None)
    report("rank", stats, columns.get("log_metric"))
    _settle(values, stats, settings, on_failure, "rank")
    scores: list[float | None] = [None] * len(completions)
    for members, group in zip(ranked, values, strict=True):
        if group is None:  # on_failure: skip
            continue
        low, high = min(group), max(group)
        for i, s in zip(members, group, strict=True):
            scores[i] = 0.5 if high == low else (s - low) / (high - low)
    return scores


def settings_of(args: dict[str, Any]) -> Settings:
    """The client settings a `judge`/`rank` entry's ``args:`` describe (for the doctor's preflight)."""
    keys = ("endpoint", "model", "api_key_env", "concurrency", "timeout", "max_retries", "cache")
    return Settings(**{k: args[k] for k in keys if k in args})


def _settings(endpoint, model, api_key_env, concurrency, timeout, max_retries, max_tokens, cache, on_failure,
              max_chars) -> Settings:
    if on_failure not in FAILURE_POLICIES:
        raise ValueError(f"on_failure must be one of {', '.join(FAILURE_POLICIES)}, not {on_failure!r}")
    if max_chars < 100:
        raise ValueError(f"max_chars {max_chars} is too small to hold an answer; use at least 100")
    settings = Settings(endpoint=endpoint, model=model, api_key_env=api_key_env, concurrency=concurrency,
                        timeout=timeout, max_retries=max_retries, max_tokens=max_tokens, cache=cache)
    settings.check()
    return settings


def _settle(values: list, stats: Any, settings: Settings, on_failure: str, name: str) -> list:
    failed = sum(v is None for v in values)
    tries = ", ".join(f"{n} {kind}" for kind, n in stats.errors.items() if n)
    if failed and on_failure == "skip":  # shown, never passed off as a real 0 (the metrics count them too)
        log.warning("%s reward: %d of %d judge requests failed after %d retries (last: %s; failed tries: %s); "
                    "on_failure: skip leaves those completions unscored (None; %s/skipped)", name, failed,
                    len(values), settings.max_retries, stats.last_error, tries, name)
    if failed and on_failure == "stop":
        from rlkit.errors import UserError

        raise UserError(f"{name} reward: {failed} of {len(values)} judge requests to {settings.endpoint} "
                        f"(model {settings.model!r}) failed after {settings.max_retries} retries (last: "
                        f"{stats.last_error}); failed tries: {tries}; stopped rather than pay those completions 0. "
                        "Check the judge server, "
                        "raise `timeout`/`max_retries`, or set `on_failure: skip` (None for them, which most callers "
                        "count as 0: docs/agents.md)")
    return values


def _check_template(template: str, fields: tuple[str, ...]) -> None:
    try:
        template.format(**dict.fromkeys(fields, ""))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"rubric: cannot fill it ({type(e).__name__}: {e}); it may use "
                         f"{', '.join('{' + f + '}' for f in fields)} and must write other braces as "
                         "{{ }}") from None


def _parse_verdict(text: str) -> float:
    found = _VERDICT.findall(text)
    if not found:
        raise Malformed(f"no 'VERDICT: CORRECT/INCORRECT' line in {_short(text)}")
    return 1.0 if found[-1].upper() == "CORRECT" else 0.0


def _parse_score(text: str) -> float:
    found = _SCORE.findall(text)
    if not found:
        raise Malformed(f"no 'SCORE: <number>' line in {_short(text)}")
    value = float(found[-1])
    if not 0.0 <= value <= 1.0:
        raise Malformed(f"score {value:g} is outside [0, 1]", "out_of_range")
    return value


def _scores_parser(n: int) -> Any:
    def parse(text: str) -> list[float]:
        match = re.search(r"\{.*\}", text, re.DOTALL)
        try:
            scores = json.loads(match.group(0))["scores"] if match else None
        except (json.JSONDecodeError, KeyError, TypeError):
            scores = None
        if not isinstance(scores, list) or len(scores) != n or not all(
                isinstance(s, int | float) and not isinstance(s, bool) and 0 <= s <= 1 for s in scores):
            raise Malformed(f'expected {{"scores": [{n} numbers in [0, 1]]}}, got {_short(text)}')
        return [float(s) for s in scores]
    return parse


def question_text(prompt: Any) -> str:
    """The last user message of a conversational prompt, or the prompt text."""
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


def completion_text(completion: Any) -> str:
    """A completion's text: the string, or the assistant messages' contents of a conversational completion."""
    if isinstance(completion, list):
        return "\n".join(str(m.get("content") or "") for m in completion if isinstance(m, dict)
                         and m.get("role") == "assistant")
    return str(completion)


def _tail(text: str, max_chars: int) -> str:
    """At most ``max_chars``, keeping the end (where the final answer is)."""
    return text if len(text) <= max_chars else "[...]" + text[-max_chars:]


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")
