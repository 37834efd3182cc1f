"""The judge rewards' client: an OpenAI-compatible chat-completions endpoint called through ``openai``, with
bounded concurrency, a total deadline per request, retries, a response cache on disk and per-batch metrics.
``rlkit optimize-prompt`` asks its reflection model through it too (``role``, no cache).

- **Deadline and retries.** Every request must complete within ``timeout`` seconds (``asyncio.wait_for``:
  the client's own timeout bounds each read only). Connection errors, the deadline, 429 (after its
  ``Retry-After``, up to 60 s), 5xx, a body that is not a chat completion (an HTML error page, broken JSON) and a
  reply the judge's parser rejects (no verdict, a score outside [0, 1]) are retried up to ``max_retries`` times
  with exponential backoff. A wrong URL path, model or key (400/401/403/404) would fail every request the same
  way: it stops at once. Each failed try is counted by kind (:data:`ERROR_KINDS`) in the batch's metrics.
- **Cache.** Each answer's reply text is appended to a JSONL file keyed by a hash of (judge model, rubric,
  prompt, completion(s), reference), so a rerun (or the doctor's probes, or an eval after training)
  costs no request. A cached reply is parsed again before it is served, so the cache never serves what the
  parser rejects (a record without its reply, written by an older rlkit, is asked again). The file is the truth;
  it is read once per process.
- **The key** comes from the environment variable the recipe names (``api_key_env``), never from the
  recipe itself, so nothing secret reaches ``recipe.resolved.yaml`` or the run directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit import secrets
from rlkit.cache import cache_dir
from rlkit.errors import UserError

log = logging.getLogger("rlkit")
DEFAULT_KEY_ENV = "RLKIT_JUDGE_API_KEY"
PREFLIGHT = "Reply with the word OK."
_LOADED: dict[Path, dict[str, Any]] = {}  # each cache file, read once per process (the file is the truth)


# What a failed try can be, as the judge metrics count them (`judge/errors/<kind>`).
ERROR_KINDS = ("timeout", "connection", "rate_limited", "server_error", "rejected", "bad_body", "malformed",
               "out_of_range")
RETRY_AFTER_MAX = 60.0  # seconds: a 429's Retry-After is honoured up to this


class Malformed(Exception):
    """A judge reply the parser cannot read (retried like a transport failure); ``kind`` is one of
    :data:`ERROR_KINDS` (``malformed``: no answer in it, ``out_of_range``, ``bad_body``: not a chat completion)."""

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Stats:
    """What one batch of judge calls cost: requests sent, cache hits, retries, failures, seconds per request."""

    requests: int = 0
    cached: int = 0
    retries: int = 0
    failures: int = 0
    seconds: list[float] = field(default_factory=list)
    last_error: str = ""
    prompt_tokens: int = 0  # as the server's `usage` counts them (0 where it sends none)
    completion_tokens: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))  # failed tries by kind
    skipped: int = 0  # completions left unscored (None) under `on_failure: skip`

    def metrics(self) -> dict[str, float]:
        latency = sum(self.seconds) / len(self.seconds) if self.seconds else 0.0
        return {"requests": self.requests, "cache_hits": self.cached, "retries": self.retries,
                "failures": self.failures, "skipped": self.skipped, "latency_s": latency,
                **{f"errors/{kind}": n for kind, n in self.errors.items()}}

    def failed(self, kind: str, message: str) -> None:
        self.errors[kind] += 1
        self.last_error = message


@dataclass(frozen=True)
class Settings:
    endpoint: str
    model: str
    api_key_env: str = DEFAULT_KEY_ENV
    concurrency: int = 8
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 0.5
    max_tokens: int = 256
    cache: str | bool = True
    temperature: float = 0.0
    # Who is asked, in every error (the judge, the reflection model), and how to fix an endpoint that fails.
    role: str = "judge"
    hint: str = "start the judge server or fix `endpoint:` in the reward's args"
    default_key_env: str = DEFAULT_KEY_ENV  # may be unset (a local server takes any key); another must be set

    def check(self) -> None:
        """Refuse impossible settings (ValueError: rlkit.rewards turns it into a one-line ``args:`` error)."""
        if not self.endpoint or not str(self.endpoint).startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http(s) URL such as http://localhost:8000/v1, not {self.endpoint!r}")
        if not self.model:
            raise ValueError(f"model: name the {self.role} model the endpoint serves (it is part of the cache key)")
        if self.concurrency < 1 or self.timeout <= 0 or self.max_retries < 0 or self.max_tokens < 1:
            raise ValueError("concurrency and max_tokens must be >= 1, timeout > 0 and max_retries >= 0")
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be between 0 and 2, not {self.temperature}")

    def api_key(self) -> str:
        key = os.environ.get(self.api_key_env)
        if key is None and self.api_key_env != self.default_key_env:
            raise UserError(f"{self.role}: environment variable {self.api_key_env} (api_key_env) is not set; export "
                            f"the {self.role}'s API key there")
        secrets.register(key)  # masked in logs and errors from here on
        return key or "EMPTY"  # a local vLLM server takes any key

    def cache_path(self) -> Path | None:
        if self.cache is False:
            return None
        return Path(self.cache) if isinstance(self.cache, str) else cache_dir() / "judge" / "responses.jsonl"


def cache_key(settings: Settings, *parts: Any) -> str:
    return hashlib.sha256(json.dumps([settings.model, *parts], sort_keys=True, default=str).encode()).hexdigest()


def _cache(path: Path | None) -> dict[str, Any]:
    """The cache file's records by key (the last record of a key wins)."""
    if path is None:
        return {}
    if path not in _LOADED:
        entries: dict[str, Any] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line torn by a killed run: that answer is asked again
                    continue
                if isinstance(record, dict) and "key" in record:
                    entries[record["key"]] = record
        _LOADED[path] = entries
    return _LOADED[path]


def _cached(record: Any, parse: Callable[[str], Any]) -> Any:
    """The answer a cached record holds, parsed again from its reply; ``None`` (ask again) for one the parser
    rejects or without a reply."""
    if not isinstance(record, dict) or not isinstance(record.get("reply"), str):
        return None
    try:
        return parse(record["reply"])
    except Malformed:
        return None


Job = tuple[str, list[dict[str, str]], Callable[[str], Any]]


def ask(settings: Settings, jobs: list[Job]) -> tuple[list[Any], Stats]:
    """Each job's parsed answer (``None`` where every try failed) and the batch's :class:`Stats`.

    ``jobs`` are ``(cache key, chat messages, parse)``; ``parse(reply text)`` returns the value or raises
    :class:`Malformed`. Cached answers are returned without a request.
    """
    path = settings.cache_path()
    cache = _cache(path)
    stats = Stats()
    results: list[Any] = [None] * len(jobs)
    todo = []
    for i, (key, messages, parse) in enumerate(jobs):
        hit = _cached(cache.get(key), parse)
        if hit is not None:
            results[i] = hit
            stats.cached += 1
        else:
            todo.append((i, key, (messages, parse)))
    if todo:
        answers = _run(_ask_all(settings, [job for _, _, job in todo], stats))
        fresh = []
        for (i, key, _), answer in zip(todo, answers, strict=True):
            if answer is not None:
                results[i], reply = answer
                cache[key] = {"key": key, "value": results[i], "reply": reply}
                fresh.append(cache[key])
        if path is not None and fresh:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a+b") as f:
                # After a run killed mid-line, start on a fresh line (the torn one is skipped on reading).
                # (`seek` returns the new position, so it is not or-ed: that added a blank line to every append.)
                torn = f.seek(0, os.SEEK_END) > 0 and f.seek(-1, os.SEEK_END) >= 0 and f.read(1) != b"\n"
                f.write(("\n" if torn else "").encode() + "".join(json.dumps(r) + "\n" for r in fresh).encode())
    return results, stats


def _run(coroutine: Any) -> Any:
    """``asyncio.run``, or in a worker thread when this thread already runs an event loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _ask_all(settings: Settings, batch: list[tuple[list[dict[str, str]], Callable[[str], Any]]],
                   stats: Stats) -> list[Any]:
    import openai

    # A client per batch: an httpx pool must not outlive the event loop it was made in.
    client = openai.AsyncOpenAI(base_url=settings.endpoint, api_key=settings.api_key(),
                                timeout=settings.timeout + 5, max_retries=0)
    gate = asyncio.Semaphore(settings.concurrency)

    async def one(messages: list[dict[str, str]], parse: Callable[[str], Any]) -> Any:
        async with gate:
            return await _ask_one(client, settings, messages, parse, stats)

    try:
        return await asyncio.gather(*(one(m, p) for m, p in batch))
    finally:
        await client.close()


async def _ask_one(client: Any, settings: Settings, messages: list[dict[str, str]], parse: Callable[[str], Any],
                   stats: Stats) -> tuple[Any, str] | None:
    """``(parsed answer, reply text)``, or ``None`` once every try failed."""
    import openai

    fatal = (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError, openai.BadRequestError)
    transient = {openai.RateLimitError: "rate_limited", openai.InternalServerError: "server_error",
                 openai.UnprocessableEntityError: "rejected", openai.APIResponseValidationError: "bad_body",
                 openai.APIConnectionError: "connection"}
    wait = 0.0
    for attempt in range(settings.max_retries + 1):
        if attempt:
            stats.retries += 1
            await asyncio.sleep(max(wait, min(settings.backoff * 2 ** (attempt - 1), 8.0)))
        started, wait = time.perf_counter(), 0.0
        stats.requests += 1
        try:
            response = await asyncio.wait_for(_create(client, settings, messages), settings.timeout)
            text = _reply_text(response, stats)
            value = parse(text)
        except fatal as e:  # every request would fail the same way
            raise UserError(f"{settings.role} {settings.endpoint} (model {settings.model!r}): {type(e).__name__}: "
                            f"{_message(e)}; check endpoint, model and the key in ${settings.api_key_env}") from None
        except TimeoutError:
            stats.failed("timeout", f"no complete reply within {settings.timeout:g}s")
        except tuple(transient) as e:
            stats.failed(next(kind for cls, kind in transient.items() if isinstance(e, cls)),
                         f"{type(e).__name__}: {_message(e)}")
            wait = _retry_after(e)
        except Malformed as e:
            stats.failed(e.kind, f"malformed reply: {e}")
        else:
            stats.seconds.append(time.perf_counter() - started)
            return value, text
        stats.seconds.append(time.perf_counter() - started)
    stats.failures += 1
    return None


def _retry_after(error: Any) -> float:
    """The seconds a 429 (or 503) asks to wait (``Retry-After``, in seconds), up to :data:`RETRY_AFTER_MAX`."""
    response = getattr(error, "response", None)
    try:
        seconds = float(response.headers.get("retry-after", 0)) if response is not None else 0.0
    except ValueError:  # an HTTP date: the backoff decides
        return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX)


async def _create(client: Any, settings: Settings, messages: list[dict[str, str]]) -> Any:
    try:
        return await client.chat.completions.create(model=settings.model, messages=messages,
                                                    temperature=settings.temperature,
                                                    max_completion_tokens=settings.max_tokens)
    except json.JSONDecodeError:  # a JSON content type with a body that is not JSON: the client lets this through
        raise Malformed("the body is not JSON", "bad_body") from None


def _reply_text(response: Any, stats: Stats) -> str:
    """The reply's text; its tokens added to ``stats``. A body that is not a chat completion (the client hands
    back the raw text of a non-JSON content type) is :class:`Malformed`."""
    if not hasattr(response, "choices"):
        raise Malformed(f"not a chat completion: {_message(Exception(str(response)))}", "bad_body")
    usage = getattr(response, "usage", None)
    stats.prompt_tokens += getattr(usage, "prompt_tokens", 0) or 0
    stats.completion_tokens += getattr(usage, "completion_tokens", 0) or 0
    return (response.choices[0].message.content or "") if response.choices else ""


def _message(error: Exception) -> str:
    text = str(getattr(error, "message", None) or error)
    return text if len(text) <= 160 else text[:157] + "..."


def preflight(settings: Settings) -> None:
    """One tiny request: a dead endpoint, a wrong model or a missing key is a one-line UserError here."""
    try:
        settings.check()
    except ValueError as e:
        raise UserError(f"{settings.role}: {e}") from None
    quick = Settings(**{**settings.__dict__, "max_tokens": 1, "max_retries": min(settings.max_retries, 1),
                        "cache": False})
    _, stats = ask(quick, [("", [{"role": "user", "content": PREFLIGHT}], str)])
    if stats.failures:
        raise UserError(f"{settings.role} {settings.endpoint} (model {settings.model!r}) cannot be reached: "
                        f"{stats.last_error}; {settings.hint}")


def report(name: str, stats: Stats, log_metric: Callable[[str, float], None] | None) -> None:
    """The batch's judge metrics through TRL's ``log_metric`` (training) or the log (eval, pairs, doctor)."""
    metrics = stats.metrics()
    if log_metric is not None:
        for key, value in metrics.items():
            log_metric(f"{name}/{key}", float(value))
    errors = ", ".join(f"{n} {kind}" for kind, n in stats.errors.items() if n)
    log.info("%s: %d requests, %d cached, %d retries, %d failed%s%s, %.2fs per request", name, stats.requests,
             stats.cached, stats.retries, stats.failures, f" ({errors})" if errors else "",
             f", {stats.skipped} completions unscored (on_failure: skip)" if stats.skipped else "",
             metrics["latency_s"])
