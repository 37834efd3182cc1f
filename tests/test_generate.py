"""rlkit's batched generation: what a caller writes batch by batch is what it returns, prompt by prompt."""

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

    def on_batch(first, completions):
        for j, c in enumerate(completions):
            streamed[first + j] = c

    kwargs = dict(max_new_tokens=6, batch_size=2, show_progress=False)
    returned = generate(model, tok, prompts, {}, on_batch=on_batch, **kwargs)
    assert [streamed[i] for i in range(len(prompts))] == returned  # each streamed batch sits at its prompts' place
    # and without a writer (length-sorted batches) the same prompt gets the same greedy completion back
    alone = [generate(model, tok, [p], {}, **kwargs)[0] for p in prompts]
    sorted_batches = generate(model, tok, prompts, {}, **kwargs)
    assert sum(a == b for a, b in zip(alone, sorted_batches, strict=True)) >= 4
    assert sum(a == b for a, b in zip(alone, returned, strict=True)) >= 4
    # a resumed eval whose examples are all written has nothing left to generate
    assert generate(model, tok, [], {}, on_batch=on_batch, **kwargs) == []
