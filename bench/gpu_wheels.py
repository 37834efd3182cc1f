"""Pack the wheels `bench/gpu.py` needs on a bare CUDA machine into one `tar.xz` (run where there is network).

A bare CUDA machine has Python, torch, transformers, peft, accelerate and triton (and their own
dependencies), no network, and room for a small upload. This downloads, for the target Python and
platform, only what is missing there: trl, datasets (+ pyarrow, pandas...), bitsandbytes, what rlkit
itself imports (pydantic, rich), and with `--unsloth` unsloth + unsloth_zoo; then it follows each
wheel's declared dependencies (markers evaluated for the target), skipping what the machine has
(`BARE`, extend with `--have`). Extras of dependencies are not followed (e.g. fsspec[http]'s aiohttp:
only remote URLs need it). Versions are those installed here, the combination rlkit is tested with.

Trimmed to fit: bitsandbytes keeps only its CPU and CUDA-`--cuda-major` libraries, unsloth drops
its `studio/` web app. vLLM comes with `bench/gpu_carry.py`, which adds it to these wheels in pieces.

    python bench/gpu_wheels.py --out gpu-wheels.tar.xz             # ~48 MiB; add --unsloth for Unsloth
    # copy it and the checkout to the GPU machine, then there:
    mkdir wheels && tar -xJf gpu-wheels.tar.xz -C wheels
    python -m pip install --no-index --no-deps wheels/*.whl
    python bench/gpu.py --dry-run                                  # what will run
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

# What a bare CUDA machine already has (torch, transformers, peft, accelerate, triton and their dependencies).
# Not fsspec: huggingface_hub brings a newer one than datasets allows (<=2026.2.0), so it is packed.
BARE = {
    "torch", "triton", "transformers", "peft", "accelerate", "numpy", "huggingface-hub", "hf-xet", "tokenizers",
    "safetensors", "regex", "tqdm", "pyyaml", "packaging", "filelock", "typing-extensions", "jinja2",
    "markupsafe", "sympy", "mpmath", "networkx", "psutil", "httpx", "httpcore", "h11", "anyio", "sniffio", "idna",
    "certifi", "typer-slim", "typer", "click", "shellingham", "setuptools", "pip", "wheel",
}
# What to bring, beyond BARE; followed through their dependencies.
WANT = ["trl", "datasets", "bitsandbytes", "pydantic", "rich"]
UNSLOTH = ["unsloth", "unsloth_zoo"]
# Versions for what is not installed here: the newest Unsloth of the range pyproject's `gpu` extra allows
# (<2026.11); an unpinned download would take a newer release rlkit is not checked against.
NOT_HERE = {"unsloth": "2026.10.9", "unsloth-zoo": "2026.10.9"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(name: str) -> str:
    """``name==VERSION`` as installed here, else as `NOT_HERE` pins it, else ``name``."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return f"{name}=={NOT_HERE[canonical(name)]}" if canonical(name) in NOT_HERE else name


def download(spec: str, dest: Path, python: str, platform: str) -> Path:
    name = canonical(re.split(r"[=<>!~ \[]", spec)[0])
    version = spec.partition("==")[2]
    for path in dest.glob("*.whl"):  # downloaded before
        parts = path.name.split("-")
        if canonical(parts[0]) == name and (not version or parts[1] == version):
            return path
    before = set(dest.iterdir())
    # pip does not widen an explicit manylinux tag to the older ones it implies: list them.
    newest = int(m.group(1)) if (m := re.fullmatch(r"manylinux_2_(\d+)_x86_64", platform)) else 28
    platforms = [platform, *(f"manylinux_2_{minor}_x86_64" for minor in range(17, max(newest, 28) + 1)),
                 "manylinux2014_x86_64", "any"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
           *(arg for p in dict.fromkeys(platforms) for arg in ("--platform", p)), "--implementation", "cp",
           "-d", str(dest), "-q", spec]
    subprocess.run(cmd, check=True)
    new = set(dest.iterdir()) - before
    if new:
        return new.pop()
    return next(p for p in dest.iterdir() if canonical(p.name.split("-")[0]) == name)


def requirements(wheel: Path, python: str) -> list[str]:
    """The wheel's unconditional dependencies for the target Python on Linux (extras not followed)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.removeprefix("Requires-Dist:").strip())
        if req.marker is None or req.marker.evaluate(env):
            out.append(req.name)
    return out


def repack(wheel: Path, drop: re.Pattern | None = None) -> list[tuple[str, int]]:
    """Rewrite a wheel uncompressed (xz then compresses the whole archive far better than each wheel's
    deflate), without the files matching ``drop`` (its RECORD rewritten to match); returns the files left
    out, with their unpacked sizes. Streams member by member: vLLM's wheel is 700 MiB unpacked."""
    out = wheel.with_name(wheel.name + ".tmp")
    dropped: list[tuple[str, int]] = []
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as new:
        infos = z.infolist()
        dropped = [(i.filename, i.file_size) for i in infos if drop is not None and drop.search(i.filename)]
        gone = {name for name, _ in dropped}
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        lines = []
        for info in infos:
            if info.filename in gone or info.filename == record_name:
                continue
            data = z.read(info)
            if dropped:
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                lines.append(f"{info.filename},sha256={digest},{len(data)}")
            info.compress_type = zipfile.ZIP_STORED
            new.writestr(info, data)
        record = z.getinfo(record_name)
        text = "\n".join([*lines, f"{record_name},,"]) + "\n" if dropped else z.read(record)
        record.compress_type = zipfile.ZIP_STORED  # after reading: z.read decompresses as the info says
        new.writestr(record, text)
    out.replace(wheel)
    return dropped


def collect(todo: list[str], have: set[str], downloads: Path, dest: Path, python: str, platform: str,
            spec: Callable[[str], str] | None = None) -> list[Path]:
    """Download ``todo`` and what each needs (markers evaluated for the target, ``have`` skipped) into
    ``downloads`` (a re-run reuses them), copy each wheel into ``dest``; ``spec(name)`` says which version
    (default: :func:`pinned`). ``have`` grows by what was collected, so a second call never packs a second
    version of a package."""
    spec = spec or pinned
    todo, wheels = list(todo), []
    while todo:
        name = canonical(todo.pop(0))
        if name in have:
            continue
        have.add(name)
        wheel = download(spec(name), downloads, python, platform)
        todo += requirements(wheel, python)
        shutil.copy(wheel, dest / wheel.name)
        wheels.append(dest / wheel.name)
    return wheels


def drops(cuda_major: str) -> dict[str, re.Pattern]:
    """Wheel-name prefix -> the files left out of it: bitsandbytes' libraries for other CUDA majors, Unsloth's
    `studio/` web app."""
    keep_cuda = rf"libbitsandbytes_(?!cpu)(?!cuda{cuda_major}\d)\w+\.(so|dll|dylib)$"
    return {"bitsandbytes-": re.compile(keep_cuda), "unsloth-": re.compile(r"^(unsloth/)?studio/")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-wheels.tar.xz"))
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (default %(default)s)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64")
    parser.add_argument("--cuda-major", default="13", help="keep bitsandbytes' libraries for this CUDA major")
    parser.add_argument("--unsloth", action="store_true", help="add unsloth and unsloth_zoo (without studio/)")
    parser.add_argument("--have", action="append", default=[], help="a distribution the GPU machine already has")
    parser.add_argument("--wheels", type=Path, help="keep the downloaded wheels here (a re-run reuses them)")
    args = parser.parse_args(argv)
    have = {canonical(n) for n in (*BARE, *args.have)}
    todo = [*WANT, *(UNSLOTH if args.unsloth else [])]
    with tempfile.TemporaryDirectory(prefix="rlkit-gpu-wheels-") as tmp:
        downloads = args.wheels or Path(tmp) / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        dest = Path(tmp) / "pack"
        dest.mkdir()
        collect(todo, have, downloads, dest, args.python, args.platform)
        trims = drops(args.cuda_major)
        for wheel in dest.glob("*.whl"):
            repack(wheel, next((d for prefix, d in trims.items() if wheel.name.startswith(prefix)), None))
        with tarfile.open(args.out, "w:xz", preset=9) as tar:
            for wheel in sorted(dest.glob("*.whl")):
                tar.add(wheel, arcname=wheel.name)
        wheels = sorted(p.name for p in dest.glob("*.whl"))
        unpacked = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print("\n".join(wheels))
    print(f"{args.out}: {len(wheels)} wheels, {unpacked / 2**20:.1f} MiB of wheels, "
          f"{args.out.stat().st_size / 2**20:.1f} MiB packed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
