"""rlkit's batched generation: what a caller writes batch by batch is what it returns, prompt by prompt."""

import pytest

from rlkit.inference.generate import generate
from rlkit.tiny import tiny_model_path


def test_batches_written_as_they_end_line_up_with_their_prompts():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path()
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    # Lengths that a length-sorted batching would reorder: short, long, short, long, medium.
    words = [1, 40, 2, 30, 12]
    prompts = [[{"role": "user", "content": " ".join(["seven"] * n) + f" {i}"}] for i, n in enumerate(words)]
    streamed: dict[int, str] = {}

    def on_batch(first, completions, cut):
        assert cut == [True] * len(completions)  # the tiny model never stops within 6 tokens
        for j, c in enumerate(completions):
            streamed[first + j] = c

    kwargs = dict(max_new_tokens=6, batch_size=2, show_progress=False)
    returned = generate(model, tok, prompts, {}, on_batch=on_batch, **kwargs)
    assert [streamed[i] for i in range(len(prompts))] == returned  # each streamed batch sits at its prompts' place
    # and without a writer (length-sorted batches) the same prompt gets the same greedy completion back
    alone = [generate(model, tok, [p], {}, **kwargs)[0] for p in prompts]
    sorted_batches = generate(model, tok, prompts, {}, **kwargs)
    assert len(set(alone)) == len(prompts)  # every prompt its own completion: a misplaced one would show
    assert sorted_batches == alone and returned == alone
    # a resumed eval whose examples are all written has nothing left to generate
    assert generate(model, tok, [], {}, on_batch=on_batch, **kwargs) == []


def _tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _input_shapes(monkeypatch, model):
    """The list every forward of ``model`` appends its input_ids' shape to."""
    shapes = []
    forward = model.forward

    def counted(*args, **kw):
        shapes.append(tuple(kw["input_ids"].shape))
        return forward(*args, **kw)

    monkeypatch.setattr(model, "forward", counted)
    return shapes


@pytest.mark.parametrize("prefix", [[], list(range(20, 100))], ids=["plain batch", "shared prefix"])
def test_cut_marks_exactly_the_replies_the_token_limit_ended(prefix):
    """A reply is cut when it reaches max_new_tokens without a stop token; one that stops, even on its last allowed
    token, is not. The stop token is chosen from what the tiny model says, so the test knows where it stops."""
    from rlkit.inference import generate as gen

    model, tok = _tiny()
    prompts = [prefix + [120, 21, 22], prefix + [300, 31], prefix + [40, 41, 42, 43]]
    assert (gen.shared_prefix(prompts) >= gen.SHARED_PREFIX_MIN) == bool(prefix)  # the cached path, or not
    free = gen.generate_ids(model, tok, prompts, max_new_tokens=5, batch_size=3)
    assert [g.cut for g in free] == [True] * 3  # nothing stopped them
    stop = free[0].ids[1]  # the first reply's second token ends it from now on
    assert all(stop not in g.ids for g in free[1:]) and stop not in free[0].ids[:1]
    for limit, eos in ((5, stop), (2, [tok.eos_token_id, stop])):  # one id, or several
        model.generation_config.eos_token_id = eos
        out = gen.generate_ids(model, tok, prompts, max_new_tokens=limit, batch_size=3)
        assert out[0].ids[:2] == free[0].ids[:2] and [g.cut for g in out] == [False, True, True]
        assert [g.ids[:limit] for g in out[1:]] == [g.ids[:limit] for g in free[1:]]


def test_a_shared_prefix_runs_once_and_changes_no_token(smollm2_dir, monkeypatch):
    """Prompts that share a long prefix (system prompt, worked turns) get exactly the tokens the plain
    left-padded batch gives (SmolLM2, fp32), with the prefix run once: the model sees it at batch size 1."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.inference import generate as gen

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    system = {"role": "system", "content": "You are a careful math tutor. Answer with the number only. "
                                           "Examples: 2 + 2 = 4. 10 - 3 = 7. 6 * 7 = 42. 9 / 3 = 3. 15 + 5 = 20."}
    questions = ["What is 12 + 30?", "Tom has 3 apples and buys 4 more. How many apples does he have now?",
                 "7 * 8?", "A shop sells 15 pens on Monday and 9 on Tuesday. How many pens in all?"]
    prompts = gen.tokenize(tok, gen.render(tok, [[system, {"role": "user", "content": q}] for q in questions], {}))
    n = gen.shared_prefix(prompts)
    assert n >= gen.SHARED_PREFIX_MIN and gen.shared_prefix([[1, 2], [1, 2]]) == 1
    kwargs = dict(max_new_tokens=12, batch_size=4)

    shapes = _input_shapes(monkeypatch, model)
    shared = gen.generate_ids(model, tok, prompts, **kwargs)
    longest = max(map(len, prompts))
    assert shapes[:2] == [(1, n), (4, longest - n)]  # the prefix once, then only the tails
    monkeypatch.setattr(gen, "SHARED_PREFIX_MIN", 10_000)
    shapes.clear()
    plain = gen.generate_ids(model, tok, prompts, **kwargs)
    assert shapes[0] == (4, longest)
    assert [g.ids for g in shared] == [g.ids for g in plain]
    assert [g.prompt_ids for g in shared] == prompts


def test_a_shared_prefix_with_several_samples_per_prompt_keeps_them_in_prompt_order():
    from rlkit.inference import generate as gen

    model, tok = _tiny()
    prefix = list(range(20, 100))
    prompts = [prefix + [5, 6], prefix + [7], prefix + [8, 9, 10]]
    assert gen.shared_prefix(prompts) >= gen.SHARED_PREFIX_MIN  # the shared-prefix path runs
    out = gen.generate_ids(model, tok, prompts, max_new_tokens=5, batch_size=3, temperature=1.0,
                           num_return_sequences=2)
    assert [g.prompt_ids for g in out] == [p for p in prompts for _ in range(2)]
    assert all(len(g.ids) == 5 for g in out)
    # Greedy, two per prompt: each pair is what that prompt alone generates (the prompts' completions differ,
    # so a sample placed under another prompt would show).
    greedy = gen.generate_ids(model, tok, prompts, max_new_tokens=5, batch_size=3, num_return_sequences=2)
    alone = [gen.generate_ids(model, tok, [p], max_new_tokens=5, batch_size=1)[0].ids for p in prompts]
    assert len({tuple(a) for a in alone}) == len(prompts)
    assert [g.ids for g in greedy] == [a for a in alone for _ in range(2)]
    assert [g.prompt_ids for g in greedy] == [p for p in prompts for _ in range(2)]


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager with sdpa prefill"])
def test_a_turn_cache_reads_only_each_conversations_new_tokens_and_changes_no_token(monkeypatch, eager):
    """An agent's next prompt is its last one, its reply and a tool result. With a turn cache the second call reads
    only those new tokens (one row continues nothing: it reads all of its own), and in fp32 every greedy token is
    the plain batch's; sequences the next call does not continue are dropped."""
    from rlkit.inference import generate as gen

    model, tok = _tiny()
    if eager:
        model.set_attn_implementation("eager")
        monkeypatch.setattr(gen, "SDPA_PREFILL_MIN", 8)
    shapes = _input_shapes(monkeypatch, model)
    first = [[400 + i, *range(20, 20 + n)] for i, n in enumerate((30, 12, 21))]
    cache = gen.TurnCache()
    kwargs = dict(max_new_tokens=6, batch_size=4)
    replies = [g.ids for g in gen.generate_ids(model, tok, first, turn_cache=cache, **kwargs)]
    stop = replies[1][2]  # the second reply ends at its third token (its KV is kept up to there)
    model.generation_config.eos_token_id = stop
    tool = [[700, 701], [710, 711, 712, 713, 714], [720]]
    second = [first[0] + replies[0] + tool[0], first[1] + replies[1][:3] + tool[1], [900, 901, *range(50, 75)]]
    shapes.clear()
    cached = gen.generate_ids(model, tok, second, turn_cache=cache, **kwargs)
    new = [len(tool[0]) + 1, len(tool[1]), 27]  # reply 0's last token was never read back; row 2 reads everything
    assert [g.prompt_ids for g in cached] == second
    reads = [s for s in shapes if s[1] > 1]
    assert reads == [(3, max(new) - 1)] if eager else reads == [(3, max(new))]
    assert len(cache.start()) == 3 and cache.start() == []  # handed on once, then dropped
    monkeypatch.setattr(gen, "SDPA_PREFILL_MIN", 10_000)
    plain = gen.generate_ids(model, tok, second, **kwargs)
    assert [g.ids for g in cached] == [g.ids for g in plain] and len({tuple(g.ids) for g in plain}) == 3
    assert [g.cut for g in cached] == [g.cut for g in plain]


def test_long_prompts_of_an_eager_model_are_read_with_sdpa_and_decode_the_same_tokens(monkeypatch):
    """An eager-attention model (rlkit's bf16 CPU setting) reads prompts of SDPA_PREFILL_MIN tokens or more with
    SDPA into the cache, then decodes with eager attention: in fp32 the greedy tokens are those of the plain
    eager batch, with and without a shared prefix, and the prompt pass really ran with SDPA."""
    from rlkit.inference import generate as gen

    model, tok = _tiny()
    model.set_attn_implementation("eager")
    prefix = list(range(20, 120))
    own = [[400 + i, *range(200, 200 + n)] for i, n in enumerate((300, 180, 260))]  # padding in the middle
    seen = []
    forward = model.forward

    def recorded(*args, **kw):
        seen.append((tuple(kw["input_ids"].shape), model.config._attn_implementation))
        return forward(*args, **kw)

    monkeypatch.setattr(model, "forward", recorded)
    kwargs = dict(max_new_tokens=6, batch_size=3)
    for prompts in ([prefix + t for t in own], own):
        shared = gen.shared_prefix(prompts) if gen.shared_prefix(prompts) >= gen.SHARED_PREFIX_MIN else 0
        width = max(map(len, prompts)) - shared
        seen.clear()
        fast = gen.generate_ids(model, tok, prompts, **kwargs)
        reads = [s for s in seen if s[0][1] > 1]
        assert width - 1 >= gen.SDPA_PREFILL_MIN - 1 and bool(shared) == (prompts[0][0] == 20)
        expected = [((1, shared), "sdpa")] * bool(shared) + [((3, width - 1), "sdpa")]
        assert reads == expected and all(impl == "eager" for _, impl in seen[len(reads):])  # decoding stays eager
        assert model.config._attn_implementation == "eager"  # restored
        monkeypatch.setattr(gen, "SDPA_PREFILL_MIN", 10_000)
        plain = gen.generate_ids(model, tok, prompts, **kwargs)
        monkeypatch.setattr(gen, "SDPA_PREFILL_MIN", 256)
        assert [g.ids for g in fast] == [g.ids for g in plain] and len({tuple(g.ids) for g in plain}) > 1


def test_cpu_generation_checks_the_heap_after_every_batch(monkeypatch):
    """Freed generation memory (a KV cache grown token by token, prompt passes of every length) stays in glibc's
    heap unless trimmed: the HotpotQA eval of the search demo grew from 1.9 to 4.4 GB that way. On CPU the loop runs
    rlkit.cpu_memory's HeapTrimmer after each batch (it trims once the process grew 64 MiB since the last trim)."""
    from rlkit import cpu_memory
    from rlkit.inference import generate as gen

    checks = []

    class Counted:
        def check(self):
            checks.append(1)

    monkeypatch.setattr(cpu_memory, "heap_trimmer", lambda: Counted())
    model, tok = _tiny()
    prompts = [[20 + i, 30, 40] for i in range(5)]
    out = gen.generate_ids(model, tok, prompts, max_new_tokens=3, batch_size=2)
    assert len(out) == 5 and len(checks) == 3  # batches of 2, 2 and 1
