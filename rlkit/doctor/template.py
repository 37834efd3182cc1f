"""The chat template as training will use it, checked with TRL's own helpers and on the recipe's rows.

- end of turn: the token that closes an assistant turn is one generation stops at (else endless samples)
- prefix: earlier turns render the same whatever follows (multi-turn RL trains on what the model produced);
  TRL swaps a known template for its ``*_training.jinja`` variant, an unknown one fails inside TRL
- think blocks: whether an earlier turn's ``<think>`` survives under that template
- tool calls: render -> parse with TRL's response parser gives back the same call
- loss mask (SFT): on real rows, the mask covers the assistant text and the end-of-turn token, nothing else
- truncation: rows longer than the context TRL will cut or rlkit will drop
"""

from __future__ import annotations

import json
from typing import Any

from rlkit.doctor import Check, Context

F = "template"
_PROBE = "doctor_probe_7d1c"


def checks(ctx: Context) -> list[Check]:
    from rlkit.errors import UserError

    try:
        tok = ctx.tokenizer
    except UserError as e:
        return [Check(F, "tokenizer", "skip", f"cannot load the tokenizer here: {e}",
                      "run the doctor where the model is cached (or set HF_HUB_OFFLINE=0)")]
    if not tok.chat_template:
        return [Check(F, "chat template", "fail", "the tokenizer has no chat template; rlkit's tasks are "
                      "conversational",
                      "use an instruct model or set `chat_template` in its tokenizer_config.json")]
    out = [_end_of_turn(ctx, tok), *_prefix_and_tools(ctx, tok), _think(ctx, tok)]
    out += _masks(ctx, tok)
    out.append(_truncation(ctx, tok))
    return [c for c in out if c is not None]


def _kwargs(ctx: Context) -> dict[str, Any]:
    return dict(ctx.recipe.model.chat_template_kwargs)


def _tools(ctx: Context) -> list[dict] | None:
    if ctx.recipe.env is None:
        return None
    from rlkit.envs import recipe_tool_schemas

    return recipe_tool_schemas(ctx.recipe)


def end_of_turn_id(tok: Any, chat_template: str | None = None, **kwargs: Any) -> int | None:
    """The first token the template writes after an assistant message's content (the end-of-turn token)."""
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
    text = tok.apply_chat_template(msgs, tokenize=False, chat_template=chat_template, **kwargs)
    after = text.rpartition(_PROBE)[2]
    ids = tok(after, add_special_tokens=False)["input_ids"]
    return next((i for i in ids if tok.decode([i]).strip()), None)


def _stop_ids(ctx: Context, tok: Any) -> set[int]:
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    from transformers import GenerationConfig

    from rlkit.tiny import resolve_model_id

    try:
        gen = GenerationConfig.from_pretrained(resolve_model_id(ctx.recipe.model.name_or_path))
    except OSError:  # no generation_config.json (or not cached): generate() stops at the tokenizer's eos only
        return ids
    eos = gen.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids


def _end_of_turn(ctx: Context, tok: Any) -> Check:
    eot = end_of_turn_id(tok, **_kwargs(ctx))
    if eot is None:
        return Check(F, "end of turn", "fail", "the template writes nothing after an assistant message: "
                     "the model cannot learn where a turn ends", "use a chat template that closes assistant turns")
    stops = _stop_ids(ctx, tok)
    name = tok.decode([eot])
    data = {"end_of_turn": name, "stop_ids": sorted(stops)}
    if eot in stops:
        return Check(F, "end of turn", "ok", f"assistant turns end with {name!r} (id {eot}), a stop token of "
                     "generation", data=data)
    generates = ctx.recipe.algorithm in ("grpo", "ppo") or ctx.recipe.pairs is not None
    return Check(F, "end of turn", "fail" if generates else "warn",
                 f"assistant turns end with {name!r} (id {eot}) but generation stops at "
                 f"{[tok.decode([i]) for i in sorted(stops)]}: samples run to the length limit",
                 f"set eos_token to {name!r} in the tokenizer (or generation_config.eos_token_id)", data=data)


def _training_template(tok: Any) -> tuple[str | None, str | None]:
    """(TRL's training template or None when the stock one is fine, None or why TRL cannot patch it)."""
    from rlkit.compat import get_training_chat_template

    try:
        return get_training_chat_template(tok), None
    except ValueError as e:
        return None, str(e).split(". ")[0]


def _prefix_and_tools(ctx: Context, tok: Any) -> list[Check]:
    from rlkit.compat import is_chat_template_prefix_preserving, supports_tool_calling

    multi_turn = ctx.recipe.env is not None and ctx.recipe.algorithm == "grpo"
    if not supports_tool_calling(tok):
        verdict = "fail" if multi_turn else "skip"
        return [Check(F, "tool calls", verdict, "the template cannot render a tool call and its result "
                      "(TRL's supports_tool_calling)", "use a tool-calling chat template" if multi_turn else "")]
    out = []
    if is_chat_template_prefix_preserving(tok):
        out.append(Check(F, "prefix", "ok", "earlier turns render identically whatever follows "
                         "(TRL's is_chat_template_prefix_preserving)"))
    else:
        training, why = _training_template(tok)
        if training is not None:
            out.append(Check(F, "prefix", "ok", "the stock template re-renders earlier turns; TRL swaps in its "
                             "prefix-preserving training template for tool episodes and assistant-only loss"))
        else:
            out.append(Check(F, "prefix", "fail" if multi_turn else "warn",
                             f"earlier turns re-render differently and TRL cannot patch this template ({why})",
                             "give the tokenizer a prefix-preserving template (see trl/chat_templates/*_training)"))
    out.append(_tool_round_trip(ctx, tok, multi_turn))
    return out


def _tool_round_trip(ctx: Context, tok: Any, multi_turn: bool) -> Check:
    import copy

    from rlkit.compat import add_response_schema, parse_response

    tok = copy.copy(tok)  # the response parser is attached to a copy; the shared tokenizer stays as loaded
    try:
        if getattr(tok, "response_template", None) is None and not getattr(tok, "response_schema", None):
            add_response_schema(tok)  # a tokenizer that ships its own parser (rlkit's SmolLM2 build) keeps it
    except ValueError:
        return Check(F, "tool round trip", "fail" if multi_turn else "skip",
                     "TRL has no response parser for this template, so tool calls are never read back",
                     "set `response_template` in the tokenizer config" if multi_turn else "")
    call = {"name": "calculate", "arguments": {"expression": "17 * (3 + 4)", "note": "ä \"q\""}}
    prompt = [{"role": "user", "content": "What is 17 * 7?"}]
    kwargs = _kwargs(ctx)
    full = tok.apply_chat_template(prompt + [{"role": "assistant", "content": "",
                                              "tool_calls": [{"type": "function", "function": call}]}],
                                   tokenize=False, **kwargs)
    head = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **kwargs)
    if not full.startswith(head):
        return Check(F, "tool round trip", "fail" if multi_turn else "warn",
                     "the rendered tool call does not start with the generation prompt", "fix the chat template")
    ids = tok(full[len(head):], add_special_tokens=False)["input_ids"]
    parsed = parse_response(tok, ids, prefix=tok(head, add_special_tokens=False)["input_ids"])
    got = [c.get("function") for c in parsed.get("tool_calls") or []]
    if got == [call]:
        return Check(F, "tool round trip", "ok", "a rendered tool call parses back to the same name and arguments")
    return Check(F, "tool round trip", "fail" if multi_turn else "warn",
                 f"rendered {json.dumps(call)} parsed back as {json.dumps(got)}",
                 "use a template whose tool-call format TRL's parser reads")


def _think(ctx: Context, tok: Any) -> Check:
    """Whether an earlier turn's think block reaches the model in the template training renders with."""
    training, _ = _training_template(tok)
    multi_turn = ctx.recipe.env is not None
    assistant_only = bool(ctx.setting("assistant_only_loss", False))
    template = training if (multi_turn or assistant_only) and training else None
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": f"<think>\n{_PROBE}\n</think>\n\nb"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    text = tok.apply_chat_template(msgs, tokenize=False, chat_template=template, **_kwargs(ctx))
    kept = _PROBE in text
    which = "TRL's training template" if template else "the stock template"
    thinking = bool(ctx.recipe.model.chat_template_kwargs.get("enable_thinking")) or any(
        r.name in ("think_format", "short_think") for r in ctx.recipe.rewards)
    evidence = f"earlier <think> blocks are {'kept' if kept else 'dropped'} by {which}"
    if not kept and thinking and multi_turn:
        return Check(F, "think blocks", "warn", evidence + ": later turns are trained on a context without the "
                     "model's own reasoning", "use a prefix-preserving template that keeps reasoning")
    return Check(F, "think blocks", "ok", evidence, data={"kept": kept})


def _masks(ctx: Context, tok: Any) -> list[Check]:
    if ctx.recipe.algorithm != "sft":
        return []
    rows = ctx.train_rows
    cols = set(rows.column_names)
    if "messages" in cols:
        if not ctx.setting("assistant_only_loss", False):
            return [Check(F, "loss mask", "warn", "rows are whole `messages` and assistant_only_loss is off: the "
                          "loss covers the prompt and any tool results too",
                          "--set trainer.assistant_only_loss=true")]
        return [_assistant_mask(ctx, tok, rows)]
    if {"prompt", "completion"} <= cols and isinstance(rows[0]["prompt"], list):
        return [_completion_mask(ctx, tok, rows)]
    return []


def _row_kwargs(ctx: Context, row: dict[str, Any]) -> dict[str, Any]:
    tools = row.get("tools")
    return {"tools": json.loads(tools) if isinstance(tools, str) else tools,
            **(row.get("chat_template_kwargs") or _kwargs(ctx))}


def _assistant_mask(ctx: Context, tok: Any, rows: Any) -> Check:
    """As SFTTrainer masks with assistant_only_loss: TRL's training template when the stock one lacks markers."""
    from rlkit.compat import has_generation_markers, is_chat_template_stop_token_trained

    name = "loss mask"
    template = None
    if not has_generation_markers(tok.chat_template):
        template, why = _training_template(tok)
        if template is None:
            return Check(F, name, "fail", "assistant_only_loss needs {% generation %} markers; the template has none "
                         f"and TRL cannot patch it ({why}): SFTTrainer stops, or the mask is empty",
                         "add {% generation %}...{% endgeneration %} around assistant content in the template, "
                         "or set assistant_only_loss: false")
    eot = end_of_turn_id(tok, chat_template=template, **_kwargs(ctx))
    bad, no_eot, covered, total = [], 0, 0, 0
    for i, row in enumerate(rows):
        kwargs = _row_kwargs(ctx, row)
        out = tok.apply_chat_template(row["messages"], tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True, chat_template=template, **kwargs)
        ids, mask = out["input_ids"], out["assistant_masks"]
        masked = {j for j, m in enumerate(mask) if m}
        covered, total = covered + len(masked), total + len(ids)
        wrong = {j for j in masked ^ _assistant_spans(tok, row["messages"], template, kwargs)
                 if j < len(ids) and tok.decode([ids[j]]).strip()}
        if not masked or wrong:
            bad.append(i)
        if eot is not None and eot not in {ids[j] for j in masked}:
            no_eot += 1
    data = {"rows": len(rows), "masked_share": round(covered / max(total, 1), 3), "bad_rows": bad}
    if bad:
        return Check(F, name, "fail", f"{len(bad)} of {len(rows)} rows: the assistant mask misses assistant text or "
                     f"covers other turns (rows {bad[:5]})", "fix the {% generation %} markers", data=data)
    if no_eot or not is_chat_template_stop_token_trained(tok, chat_template=template):
        return Check(F, name, "fail", f"the end-of-turn token is outside the assistant mask in {no_eot} of "
                     f"{len(rows)} rows: the model never learns to stop",
                     "put the end-of-turn token inside {% generation %} ... {% endgeneration %}", data=data)
    how = "TRL's training template" if template else "the template's own markers"
    return Check(F, name, "ok", f"{len(rows)} rows: the mask ({how}) covers exactly the assistant turns and their "
                 f"end-of-turn token ({data['masked_share']:.0%} of tokens)", data=data)


def _assistant_spans(tok: Any, messages: list, template: str | None, kwargs: dict) -> set[int]:
    """Token positions of each assistant turn: from its generation prompt to the end of its own rendering.

    Valid because the template training uses is prefix-preserving (checked above).
    """
    def length(msgs: list, generation_prompt: bool) -> int:
        return len(tok.apply_chat_template(msgs, tokenize=True, return_dict=False, chat_template=template,
                                           add_generation_prompt=generation_prompt, **kwargs))

    spans: set[int] = set()
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            spans |= set(range(length(messages[:k], True), length(messages[:k + 1], False)))
    return spans


def _completion_mask(ctx: Context, tok: Any, rows: Any) -> Check:
    """As SFTTrainer builds completion_mask for conversational prompt/completion rows."""
    eot = end_of_turn_id(tok, **_kwargs(ctx))
    mismatch, no_eot = [], 0
    for i, row in enumerate(rows):
        kw = _row_kwargs(ctx, row)
        prompt = tok.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True,
                                         return_dict=False, **kw)
        full = tok.apply_chat_template(row["prompt"] + row["completion"], tokenize=True, return_dict=False, **kw)
        if full[:len(prompt)] != prompt:
            mismatch.append(i)
        if eot is not None and eot not in full[len(prompt):]:
            no_eot += 1
    name = "loss mask"
    if mismatch:
        return Check(F, name, "fail", f"{len(mismatch)} of {len(rows)} rows: the prompt does not tokenize as the "
                     "start of prompt+completion, so the completion mask is shifted",
                     "check the template's generation prompt (e.g. a pre-filled <think>) against the completions",
                     data={"rows": mismatch[:10]})
    if no_eot:
        return Check(F, name, "fail", f"the end-of-turn token is outside the completion in {no_eot} of {len(rows)} "
                     "rows: the model never learns to stop", "end completions with the template's end of turn")
    return Check(F, name, "ok", f"{len(rows)} rows: the completion mask starts right after the prompt and holds "
                 "the end-of-turn token")


def _truncation(ctx: Context, tok: Any) -> Check | None:
    rows = ctx.train_rows
    if rows is None or len(rows) == 0:
        return None
    algo = ctx.recipe.algorithm
    if algo in ("grpo", "ppo") and ctx.before_training:
        return None  # the trainer builder drops too-long prompts itself, and refuses when none is left
    if algo in ("grpo", "ppo"):
        completion = ctx.setting("max_completion_length" if algo == "grpo" else "response_length", 512)
        room = ctx.recipe.model.max_seq_length - completion
        lengths = _lengths(ctx, tok, rows["prompt"], generation_prompt=True)
        over = sum(n > room for n in lengths)
        limit, what = room, f"prompt room ({ctx.recipe.model.max_seq_length} - {completion})"
    else:
        limit = ctx.setting("max_length", 1024) or ctx.recipe.model.max_seq_length
        cols = rows.column_names
        tools = rows["tools"] if "tools" in cols else None
        if "messages" in cols:
            lengths = _lengths(ctx, tok, rows["messages"], tools=tools)
            # Training starts at the first assistant turn; the tokens before it are context only.
            starts = _lengths(ctx, tok, [m[:next((k for k, x in enumerate(m) if x["role"] == "assistant"), len(m))]
                                         for m in rows["messages"]], generation_prompt=True, tools=tools)
        elif "prompt" in cols and ("completion" in cols or "chosen" in cols):
            second = rows["completion"] if "completion" in cols else rows["chosen"]
            lengths = _lengths(ctx, tok, [p + c if isinstance(p, list) else p + c
                                          for p, c in zip(rows["prompt"], second, strict=True)])
            starts = _lengths(ctx, tok, rows["prompt"], generation_prompt=True)
        else:
            return None
        over = sum(n > limit for n in lengths)
        what = f"max_length {limit}"
        if all(s >= limit for s in starts):
            return Check(F, "truncation", "fail", f"every row's trainable part starts after max_length {limit} "
                         f"(shortest context {min(starts)} tokens): nothing would be learned",
                         "raise trainer.max_length", data={"rows": len(lengths), "limit": limit})
    data = {"rows": len(lengths), "over": over, "longest": max(lengths), "limit": limit}
    evidence = f"{over} of {len(lengths)} rows exceed the {what}; the longest has {max(lengths)} tokens"
    if over == len(lengths) and algo in ("grpo", "ppo"):
        return Check(F, "truncation", "fail", evidence + ": every prompt would be dropped",
                     "raise model.max_seq_length", data=data)
    if over:
        return Check(F, "truncation", "warn", evidence + ("" if algo in ("grpo", "ppo") else
                                                          ": their ends (final answers) are cut"),
                     "raise the limit or shorten those rows", data=data)
    return Check(F, "truncation", "ok", evidence, data=data)


def _lengths(ctx: Context, tok: Any, conversations: list, *, generation_prompt: bool = False,
             tools: list | None = None) -> list[int]:
    env_tools = _tools(ctx)
    out = []
    for i, conv in enumerate(conversations):
        if not isinstance(conv, list):
            out.append(len(tok(conv, add_special_tokens=False)["input_ids"]))
            continue
        row_tools = tools[i] if tools is not None else env_tools
        row_tools = json.loads(row_tools) if isinstance(row_tools, str) else row_tools
        out.append(len(tok.apply_chat_template(conv, tokenize=True, return_dict=False, tools=row_tools,
                                               add_generation_prompt=generation_prompt, **_kwargs(ctx))))
    return out
