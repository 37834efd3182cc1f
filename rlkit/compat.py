"""Every place rlkit leans on a library's private or version-specific internals, in one module.

Each entry names the library version it was written against; ``tests/test_compat.py`` holds a canary
per entry that fails loudly, naming the installed version, when upstream changes. Nothing here is
imported at module level: importing ``rlkit.compat`` costs nothing.
"""

from __future__ import annotations

from typing import Any


# --- trl.chat_template_utils (TRL 1.12; not exported from ``trl``) -------------------------------

def add_response_schema(tokenizer: Any) -> Any:
    from trl.chat_template_utils import add_response_schema as impl

    return impl(tokenizer)


def parse_response(tokenizer: Any, ids: list[int], prefix: list[int] | None = None) -> dict[str, Any]:
    from trl.chat_template_utils import parse_response as impl

    return impl(tokenizer, ids, prefix=prefix)


def get_training_chat_template(tokenizer: Any) -> str | None:
    from trl.chat_template_utils import get_training_chat_template as impl

    return impl(tokenizer)


def is_chat_template_prefix_preserving(tokenizer: Any) -> bool:
    from trl.chat_template_utils import is_chat_template_prefix_preserving as impl

    return impl(tokenizer)


def supports_tool_calling(tokenizer: Any) -> bool:
    from trl.chat_template_utils import supports_tool_calling as impl

    return impl(tokenizer)


def has_generation_markers(template: str) -> bool:
    from trl.chat_template_utils import has_generation_markers as impl

    return impl(template)


def is_chat_template_stop_token_trained(tokenizer: Any, chat_template: str | None = None) -> bool:
    from trl.chat_template_utils import is_chat_template_stop_token_trained as impl

    return impl(tokenizer, chat_template=chat_template)


def qwen3_chat_template() -> str:
    """TRL's copy of the Qwen3 chat template (a module-level string)."""
    from trl.chat_template_utils import qwen3_chat_template as template

    return template
