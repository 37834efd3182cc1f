"""Token-based chunks of documents, cut on the tokenizer's character offsets.

A chunk is a window of at most `chunk_tokens` tokens of one document; consecutive windows share exactly
`chunk_overlap` tokens. Its text is the slice of the document from the window's first token's start to
its last token's end (the offsets mapping, never `decode`), so a sentence that appears verbatim in a
document appears verbatim in any chunk whose window covers it. Tokens are counted with the policy's own
tokenizer by default, so "200 tokens" means what the model will read; `retrieval.tokenizer: words` (runs
of non-space characters) or `chars` chunk without any tokenizer, which an endpoint rollout offline needs.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from rlkit.errors import UserError
from rlkit.retrieval.corpus import Document


@dataclass(frozen=True, kw_only=True)
class Chunk(Document):
    """A piece of one document, with that document's metadata."""

    id: str  # "{doc_index}:{chunk_index}", stable for a given corpus and chunking; `doc_id` is the user's


WINDOWS = ("words", "chars")  # `retrieval.tokenizer` values that need no tokenizer


class WindowTokenizer:
    """Words (runs of non-space characters) or characters as tokens, with the offsets chunking cuts on."""

    def __init__(self, unit: str) -> None:
        self.pattern = re.compile(r"\S+" if unit == "words" else r"(?s).")

    def __call__(self, text: str, **kwargs) -> dict[str, list[tuple[int, int]]]:
        return {"offset_mapping": [m.span() for m in self.pattern.finditer(text)]}


def load_tokenizer(name: str):
    """A fast (Rust) tokenizer, which alone reports the character offsets chunking cuts on, or a word/char window."""
    if name in WINDOWS:
        return WindowTokenizer(name)
    from transformers import AutoTokenizer

    from rlkit.tiny import resolve_model_id

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_id(name))
    except (OSError, ValueError) as e:  # not cached offline, no such repo or path, no tokenizer files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"retrieval.tokenizer: cannot load the tokenizer {name!r} that counts chunk tokens "
                        f"({reason}); name one that is available, or set `retrieval.tokenizer: words` "
                        "(or chars) to chunk without one") from None
    if not tokenizer.is_fast:
        raise UserError(f"retrieval.tokenizer: {name!r} has no fast tokenizer; chunking needs character offsets")
    return tokenizer


def token_windows(n_tokens: int, size: int, overlap: int) -> list[range]:
    """Windows of at most `size` token positions, each sharing `overlap` with the previous one, covering all."""
    windows = []
    for start in range(0, n_tokens, size - overlap):
        windows.append(range(start, min(start + size, n_tokens)))
        if start + size >= n_tokens:
            break
    return windows


def chunk_documents(docs: list[Document], tokenizer, size: int, overlap: int,
                    show_progress: bool = True) -> list[Chunk]:
    from rlkit import progress

    chunks = []
    with progress.bar("chunking", len(docs), show=show_progress) as advance:
        for d, doc in enumerate(docs):
            advance()
            offsets = tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True,
                                verbose=False)["offset_mapping"]
            for c, window in enumerate(token_windows(len(offsets), size, overlap)):
                start, end = offsets[window.start][0], offsets[window.stop - 1][1]
                chunks.append(Chunk(**{**asdict(doc), "text": doc.text[start:end]}, id=f"{d}:{c}"))
    return chunks
