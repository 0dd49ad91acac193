"""BiasedTales-ML (Ouyang, Luo, Xiao, Zhu; arXiv:2604.17008) computed the way the study computed it:
issue #13 items 7 (VSR per design), 8 (cosine over all categories), 9 (Appendix F contrasts),
10 (one extractor for the narrative fields) and 18 (citations, no paths outside the repository).
Item 6 (validity per study) is covered in test_langid.py."""

from __future__ import annotations

import subprocess

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics.pairwise import cosine_similarity as sk_cosine

from storybias.config import params
from storybias.config.params import Comparison
from storybias.core import artifacts, paths
from storybias.stages import metrics
from storybias.stages.extract import answers as extract

ROOT = paths.repo_root()


# --- item 7: the VSR joined to the JSD is the comparison's design's (bedtime), not a pooled one ----


def _vsr_rows(models: tuple[str, ...] = ("m1",)) -> pd.DataFrame:
    """Bedtime VSR 0.5; the other designs 1.0, so a pooled or wrong-design join is visible."""
    rows = []
    for design, rate in (("bedtime", 0.5), ("stereotales", 1.0), ("occupations", 1.0)):
        for model in models:
            for lang in ("en", "fr"):
                rows.append(
                    {
                        "design": design,
                        "model": model,
                        "language": lang,
                        "n_stories": 10,
                        "n_valid": int(rate * 10),
                        "vsr": rate,
                    }
                )
    return pd.DataFrame(rows)


def test_vsr_jsd_join_uses_the_comparisons_design():
    jsd = pd.DataFrame(
        {
            "comparison": ["child_gender", "child_gender"],
            "model": ["m1", "m1"],
            "language": ["en", "fr"],
            "jsd": [0.1, 0.2],
        }
    )
    comparisons = [
        Comparison(name="child_gender", design="bedtime", condition="child_gender", group_m="boy", group_f="girl")
    ]
    out = metrics.vsr_jsd_join(jsd, _vsr_rows(), comparisons)
    assert list(out["vsr"]) == [0.5, 0.5] and len(out) == 2
    assert list(out["n_stories"]) == [10, 10]


def test_stage_05_joins_bedtime_vsr(tmp_path, monkeypatch):
    from storybias.core import io
    from test_metrics import _synthetic_run

    p = _synthetic_run(tmp_path, monkeypatch)
    io.write_parquet_atomic(_vsr_rows(("m1", "m2")), artifacts.vsr_path(p.run_name))
    out = metrics.run(p)
    joined = out["vsr_jsd"]
    assert not joined.empty and (joined["vsr"] == 0.5).all()


# --- item 8: cosine over every semantic category (Eq. 3), adjectives and settings -----------------


def test_cosine_uses_adjective_and_setting_categories():
    rows = []
    for lang, setting_sign in (("en", 1.0), ("fr", -1.0)):
        for cat, value in (("agency", 1.0), ("communality", -0.5)):
            rows.append(
                {"comparison": "c", "model": "m", "language": lang, "kind": "adjectives", "category": cat, "s_c": value}
            )
        rows.append(
            {
                "comparison": "c",
                "model": "m",
                "language": lang,
                "kind": "settings",
                "category": "home",
                "s_c": 2.0 * setting_sign,
            }
        )
    sc = pd.DataFrame(rows)
    out = metrics.cosine_matrix(sc)
    value = out[(out.language_a == "en") & (out.language_b == "fr")]["cosine"].item()
    expected = sk_cosine([[1.0, -0.5, 2.0]], [[1.0, -0.5, -2.0]])[0, 0]
    assert value == pytest.approx(expected)
    assert value < 0.99, "adjectives alone would give 1.0"


def test_cosine_keeps_a_category_name_shared_by_two_kinds_apart():
    rows = [
        {"comparison": "c", "model": "m", "language": lang, "kind": kind, "category": "x", "s_c": v}
        for lang, kind, v in (
            ("en", "adjectives", 1.0),
            ("en", "settings", 0.0),
            ("fr", "adjectives", 0.0),
            ("fr", "settings", 1.0),
        )
    ]
    out = metrics.cosine_matrix(pd.DataFrame(rows))
    assert out[(out.language_a == "en") & (out.language_b == "fr")]["cosine"].item() == pytest.approx(0.0)


# --- item 9: Appendix F religion and nationality contrasts in the paper profile --------------------


def test_paper_profile_defines_appendix_f_contrasts():
    p = params.load(ROOT / "params" / "paper.yaml")
    by_name = {c.name: c for c in p.metrics.comparisons}
    religion, nationality = by_name["religion"], by_name["nationality"]
    assert (religion.design, religion.condition, {religion.group_m, religion.group_f}) == (
        "bedtime",
        "religion",
        {"muslim", "christian"},
    )
    assert (nationality.design, nationality.condition) == ("bedtime", "nationality") and "chinese" in {
        nationality.group_m,
        nationality.group_f,
    }
    assert religion.log_odds_only and nationality.log_odds_only
    assert {"child_gender", "social_class"} <= set(by_name) and not by_name["child_gender"].log_odds_only


def test_log_odds_only_comparison_gives_words_but_no_distributions(tmp_path, monkeypatch):
    from test_metrics import _synthetic_run

    p = _synthetic_run(tmp_path, monkeypatch)
    only = Comparison(
        name="class_words",
        design="bedtime",
        condition="social_class",
        group_m="wealthy",
        group_f="working_class",
        log_odds_only=True,
    )
    settings = p.profile.metrics.model_copy(update={"comparisons": [*p.profile.metrics.comparisons, only]})
    p.profile = p.profile.model_copy(update={"metrics": settings})
    out = metrics.run(p)
    assert "class_words" in set(out["log_odds"]["comparison"])
    assert "class_words" not in set(out["sc"]["comparison"]) and "class_words" not in set(out["jsd"]["comparison"])


# --- item 10: one extractor for the narrative fields -----------------------------------------------


def _record(adjectives: list[str], income: str) -> dict:
    return {"adjectives_en": adjectives, "settings": ["forest"], "cultural_refs": [], "demo_income_level": income}


def test_narrative_lists_come_from_the_primary_extractor():
    records = [
        _record(["brave", "curious", "kind"], "low"),
        _record(["brave"], "low"),
        _record(["kind", "tall"], "high"),
    ]
    primary = extract.combine(records)
    assert primary["adjectives_en"] == ["brave", "curious", "kind"], "the majority rule would drop 'curious'"
    assert primary["demo_income_level"] == "low", "scalar fields still take the ensemble's majority"


def test_paper_profile_uses_qwen3_14b_alone_for_narrative_fields():
    p = params.load(ROOT / "params" / "paper.yaml")
    assert p.extract.models[0].hub_id == "Qwen/Qwen3-14B"


# --- item 18: studies cited by title, authors and arXiv id; no path outside the repository ---------


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if not f.startswith("tests/")]


def test_no_tracked_file_outside_tests_points_at_shared_papers():
    offenders = []
    for name in _tracked_files():
        path = ROOT / name
        if path.is_file() and "shared/papers" in path.read_text(encoding="utf-8", errors="ignore"):
            offenders.append(name)
    assert offenders == []


def test_readme_cites_the_three_studies_by_arxiv_id():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## The studies") :]
    for needle in ("arXiv:2605.10442", "arXiv:2604.17008", "arXiv:2608.23026", "Ouyang", "Beyond Surface Cues"):
        assert needle in section, needle


def test_cross_lingual_cosine_has_a_bootstrap_interval():
    """Issue #29 item 9: the cosine of two languages' S_C vectors gets a percentile interval from
    resamples of each language's stories. Two languages with the same planted direction (boys agency,
    girls communality) give a cosine near 1 whose interval excludes 0; a language with the reverse
    direction gives a negative one."""
    from storybias.config.params import Comparison

    rng = np.random.default_rng(0)
    rows = []
    for lang, sign in (("en", 1), ("fr", 1), ("zh", -1)):
        for i in range(60):
            boy = i % 2 == 0
            lean = (boy and sign > 0) or (not boy and sign < 0)
            words = ["brave", "bold"] if lean else ["kind", "gentle"]
            words = words + [str(rng.choice(["happy", "smart", "brave", "kind"]))]
            rows.append(
                {"design": "bedtime", "model": "m", "language": lang, "cond_child_gender": "boy" if boy else "girl",
                 "adjectives_en": words, "settings": ["home"]}
            )  # fmt: skip
    data = pd.DataFrame(rows)
    comparison = Comparison(
        name="child_gender", design="bedtime", condition="child_gender", group_m="boy", group_f="girl"
    )
    out = metrics.narrative_comparison(data, comparison, n_boot=300, seed=1)
    cosine = metrics.cosine_matrix(out["sc"], out["sc_replicates"]).set_index(["language_a", "language_b"])
    same = cosine.loc[("en", "fr")]
    assert same["cosine"] > 0.9 and same["ci_low"] > 0.5 and same["ci_low"] <= same["cosine"] <= same["ci_high"]
    assert cosine.loc[("en", "zh"), "ci_high"] < 0
    assert cosine.loc[("en", "en"), "ci_low"] == pytest.approx(1.0)
    assert np.isnan(metrics.cosine_matrix(out["sc"]).iloc[0]["ci_low"])  # no replicates: no interval
