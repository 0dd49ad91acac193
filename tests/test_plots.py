"""Stage 08 figures: every figure function on small (1 model, 3 languages, some cells empty), large
(23 models x 10-14 languages) and empty synthetic artifacts; the stats each returns against values
computed by hand from its input; save_figure's files."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from storybias.stages import figures as plots
from storybias.stages import metrics

SMALL_MODELS = ["qwen2.5-coder-1.5b"]
SMALL_LANGS = ["en", "fr", "zh"]
LARGE_MODELS = [f"vendor-{i:02d}/a-rather-long-model-name-{i}b-instruct" for i in range(23)]
LARGE_LANGS = ["en", "fr", "es", "it", "pt", "nl", "uk", "ar", "hi", "zh", "ja", "ko", "ru", "sw"]
TEN_LANGS = LARGE_LANGS[:10]
CATS = ["agency", "communality", "intellect", "appearance", "emotion", "morality"]


# --- synthetic artifacts (columns of docs/data-contract.md and the brief of stage 04/06) ----------


def make_vsr(models, languages, skip=()):
    rng = np.random.default_rng(1)
    rows = []
    for design in ("stereotales", "bedtime", "all"):
        for m, lang in itertools.product(models, languages):
            if (m, lang) in skip:
                continue
            n = 24 if design == "all" else 12
            valid = int(rng.integers(0, n + 1))
            rows.append(
                {
                    "design": design,
                    "model": m,
                    "language": lang,
                    "n_stories": n,
                    "n_valid": valid,
                    "vsr": valid / n,
                    "n_empty": 0,
                    "n_truncated": n - valid,
                    "n_refusal": 0,
                    "n_wrong_language": 0,
                    "n_low_confidence": 0,
                }
            )
    return pd.DataFrame(rows)


def make_stories(models, languages, per_cell=6):
    rng = np.random.default_rng(2)
    genders = ["woman", "man", "non_binary", "unknown"]
    ages = ["child", "teenager", "young_adult", "adult", "middle_aged", "elderly", "unknown"]
    origins = [
        "north_america",
        "latin_america",
        "western_europe",
        "eastern_europe",
        "middle_east",
        "north_africa",
        "sub_saharan_africa",
        "south_asia",
        "east_asia",
        "southeast_asia",
        "oceania",
        "other",
        "unknown",
    ]
    incomes = ["low", "middle", "high", "unknown"]
    ext, fil = [], []
    i = 0
    for design in ("stereotales", "bedtime", "occupations"):
        for m, lang in itertools.product(models, languages):
            for k in range(per_cell):
                sid = f"{i:016x}"
                i += 1
                cond = ["gender", "age", "income_level", "religion"][k % 4] if design == "stereotales" else np.nan
                fil.append(
                    {
                        "story_id": sid,
                        "design": design,
                        "model": m,
                        "language": lang,
                        "cond_attribute": cond,
                        "is_valid": True,
                    }
                )
                ext.append(
                    {
                        "story_id": sid,
                        "parse_ok": bool(k != per_cell - 1 or design != "stereotales"),
                        "demo_gender": rng.choice(genders),
                        "demo_age": rng.choice(ages),
                        "demo_geographic_origin": rng.choice(origins),
                        "demo_income_level": rng.choice(incomes),
                        "protagonist_gender": rng.choice(["female", "male", "unknown"], p=[0.45, 0.45, 0.1]),
                    }
                )
    return pd.DataFrame(ext), pd.DataFrame(fil)


def make_values(models, languages):
    rng = np.random.default_rng(3)
    rows = []
    for m, scope in itertools.product(models, ["all", *languages]):
        for j in range(int(rng.integers(0, 8))):
            rows.append(
                {
                    "model": m,
                    "scope": scope,
                    "base_attribute": "income_level",
                    "base_value": ["low", "high"][j % 2],
                    "compared_attribute": "education",
                    "compared_value": f"v{j}",
                    "count": 12,
                    "row_total": 30,
                    "fraction": 0.4,
                    "expected": 5.0,
                    "lift": 2.4,
                    "p_value": 0.001,
                    "p_adjusted": 0.01,
                    "significant": bool(rng.random() < 0.6),
                }
            )
    return pd.DataFrame(rows)


def make_shared(n, n_models):
    rng = np.random.default_rng(4)
    rows = []
    for j in range(n):
        k = int(rng.integers(1, n_models + 1))
        harm = float(rng.integers(1, 6)) if rng.random() < 0.7 else np.nan
        row = {
            "scope": "all" if j % 5 else "fr",
            "base_attribute": "professional_field",
            "base_value": f"value_with_a_long_name_{j}",
            "compared_attribute": "geographic_origin",
            "compared_value": f"region_{j % 7}",
            "n_models": k,
            "models": [f"m{i}" for i in range(k)],
            "mean_fraction": float(rng.uniform(0.1, 0.6)),
            "mean_lift": float(rng.uniform(2, 12)),
            "median_harm": harm,
            "n_ratings": 0 if np.isnan(harm) else 3,
            "share_realistic": 0.5,
            "harmful": (not np.isnan(harm)) and harm >= 4,
        }
        row["association_id"] = "|".join(
            str(row[c]) for c in ("base_attribute", "base_value", "compared_attribute", "compared_value")
        )
        rows.append(row)
    return pd.DataFrame(rows)


def make_sc(models, languages, missing=()):
    rng = np.random.default_rng(5)
    rows = []
    for comp in ("child_gender", "social_class"):
        for m, lang in itertools.product(models, languages):
            if (m, lang) in missing:
                continue
            for c in CATS:
                s = float(np.clip(rng.normal(0, 0.8), -2, 2)) if rng.random() > 0.1 else np.nan
                rows.append(
                    {
                        "comparison": comp,
                        "model": m,
                        "language": lang,
                        "kind": "adjectives",
                        "category": c,
                        "s_c": s,
                        "ci_low": s - 0.3,
                        "ci_high": s + 0.3,
                        "n_m": 10,
                        "n_f": 12,
                        "small_sample": lang == languages[-1],
                        "coverage": 0.5,
                        "note": "",
                    }
                )
            rows.append(
                {
                    "comparison": comp,
                    "model": m,
                    "language": lang,
                    "kind": "settings",
                    "category": "domestic",
                    "s_c": 0.3,
                    "ci_low": 0.0,
                    "ci_high": 0.6,
                    "n_m": 10,
                    "n_f": 12,
                    "small_sample": False,
                    "coverage": 0.5,
                    "note": "",
                }
            )
    return pd.DataFrame(rows)


def make_jsd(models, languages):
    rng = np.random.default_rng(6)
    rows = []
    for m, lang in itertools.product(models, languages):
        j = float(rng.uniform(0.05, 0.4))
        rows.append(
            {
                "comparison": "child_gender",
                "model": m,
                "language": lang,
                "jsd": j,
                "ci_low": j - 0.04,
                "ci_high": j + 0.05,
                "n_m": 20,
                "n_f": 20,
                "small_sample": False,
                "note": "",
            }
        )
    return pd.DataFrame(rows)


def make_log_odds(models, top):
    rng = np.random.default_rng(7)
    rows = []
    for comp, (gm, gf) in (("child_gender", ("boy", "girl")), ("social_class", ("working_class", "upper_class"))):
        for m in models:
            for field in ("adjectives_en", "settings"):
                for group, sign in ((gm, 1), (gf, -1)):
                    for w in range(top):
                        rows.append(
                            {
                                "comparison": comp,
                                "model": m,
                                "field": field,
                                "group": group,
                                "word": f"{field[:3]}word{w}{'_extraordinarily_long' if w == 0 else ''}",
                                "z": sign * float(rng.uniform(0.5, 6)),
                                "count_m": 3,
                                "count_f": 1,
                            }
                        )
    return pd.DataFrame(rows)


def make_aggregates(models, languages):
    rng = np.random.default_rng(8)
    rows = []
    for denominator in ("all outputs", "identified only"):
        for m, lang, task in itertools.product(models, languages, ("explicit", "story", "news")):
            rows.append(
                {
                    "model": m,
                    "language": lang,
                    "task": task,
                    "m_s": float(rng.uniform(-0.3, 0.9)),
                    "m_b": float(rng.uniform(-0.8, 0.8)),
                    "n_occupations": 18,
                    "n_outputs": 900,
                    "denominator": denominator,
                }
            )
    return pd.DataFrame(rows)


def make_anova():
    """metrics_anova.parquet rows (as metrics.type1_anova writes them) for 2 denominators x 2 subsets x 2 outcomes."""
    rng = np.random.default_rng(12)
    rows = []
    for denominator, subset, outcome in itertools.product(
        ("all outputs", "identified only"), ("all available", "common models"), ("m_s", "m_b")
    ):
        for term, df in (("language", 9), ("task", 2), ("language:task", 18), ("model", 22)):
            p = float(rng.uniform(0, 0.2))
            rows.append(
                {
                    "outcome": outcome,
                    "term": term,
                    "df": df,
                    "df_resid": 638,
                    "sum_sq": 1.0,
                    "F": float(rng.uniform(0.5, 9)),
                    "p_value": p,
                    "p_adjusted": min(1.0, 2 * p),
                    "partial_omega_sq": float(rng.uniform(-0.01, 0.3)),
                    "subset": subset,
                    "denominator": denominator,
                    "note": "" if subset == "all available" else "language x task kept",
                }
            )
    return pd.DataFrame(rows)


def make_umap(languages, genres, n_per_group, tiny=()):
    rng = np.random.default_rng(9)
    rows = []
    for lang, genre, label in itertools.product(languages, genres, ("female", "male")):
        n = 3 if (lang, genre, label) in tiny else n_per_group
        centre = (1.5, 0.0) if label == "female" else (-1.5, 0.5)
        xy = rng.normal(centre, 1.0, size=(n, 2))
        for k, (x, y) in enumerate(xy):
            rows.append(
                {
                    "story_id": f"{lang}{genre}{label}{k}",
                    "language": lang,
                    "genre": genre,
                    "label": label,
                    "x": x,
                    "y": y,
                }
            )
    return pd.DataFrame(rows)


def make_probes(languages, genres, skip=()):
    rng = np.random.default_rng(10)
    rows = []
    for lang, genre in itertools.product(languages, genres):
        full = float(rng.uniform(0.9, 1.0))
        cue = float(rng.uniform(0.5, 0.85))
        status = "skipped: fewer than 2 model-occupation groups" if (lang, genre) in skip else "ok"
        for variant, auc in (("full", full), ("cue_deleted", cue), ("delta", cue - full)):
            ok = status == "ok"
            rows.append(
                {
                    "language": lang,
                    "genre": genre,
                    "variant": variant,
                    "n": 200,
                    "n_female": 100,
                    "n_male": 100,
                    "n_groups": 12,
                    "auc": auc if ok else np.nan,
                    "ci_low": auc - 0.05 if ok else np.nan,
                    "ci_high": auc + 0.03 if ok else np.nan,
                    "status": status,
                }
            )
    return pd.DataFrame(rows)


def make_cultural(sources, genres):
    rng = np.random.default_rng(11)
    rows = []
    for s, g, c in itertools.product(sources, genres, ("en", "fr", "zh")):
        rows.append(
            {
                "source_language": s,
                "genre": g,
                "context": c,
                "relevance": float(rng.uniform(4.5, 6.5) if s == c else rng.uniform(1.5, 4.0)),
                "n_narratives": 40,
                "n_markers": 90,
            }
        )
    return pd.DataFrame(rows)


def make_sep(skip_masked=False):
    return pd.DataFrame(
        [
            {
                "version": "original",
                "balanced_accuracy": 0.82,
                "ci_low": 0.78,
                "ci_high": 0.86,
                "chance": 1 / 3,
                "n_markers": 500,
                "n_languages": 3,
                "status": "ok",
            },
            {
                "version": "translated",
                "balanced_accuracy": 0.61,
                "ci_low": 0.56,
                "ci_high": 0.66,
                "chance": 1 / 3,
                "n_markers": 500,
                "n_languages": 3,
                "status": "ok",
            },
            {
                "version": "masked",
                "balanced_accuracy": np.nan if skip_masked else 0.48,
                "ci_low": np.nan if skip_masked else 0.43,
                "ci_high": np.nan if skip_masked else 0.53,
                "chance": 1 / 3,
                "n_markers": 500,
                "n_languages": 3,
                "status": "skipped: spaCy model not installed" if skip_masked else "ok",
            },
        ]
    )


# --- checks ---------------------------------------------------------------------------------------


def texts(fig: Figure) -> list[Text]:
    """Every visible non-empty text, tick labels included (each figure function lays itself out, which
    creates them; no extra draw needed)."""
    found = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    cells = [c.get_text() for ax in fig.axes for table in ax.tables for c in table.get_celld().values()]
    return found + [t for t in cells if t.get_text().strip()]


def check_figure(fig: Figure, legend: bool = False, min_font: float = 8.0) -> None:
    assert isinstance(fig, Figure)
    found = texts(fig)
    small = [(t.get_text(), t.get_fontsize()) for t in found if t.get_fontsize() < min_font]
    assert not small, f"text below {min_font} pt: {small[:5]}"
    titles = [ax.get_title() or ax.get_title(loc="left") for ax in fig.axes] + [
        fig._suptitle.get_text() if fig._suptitle else ""
    ]
    assert any(titles), "no title"
    visible = [ax for ax in fig.axes if ax.get_visible() and ax.name != "polar" and ax.get_label() != "<colorbar>"]
    labelled = [ax for ax in visible if ax.get_xlabel() or ax.get_ylabel()]
    tables = [ax for ax in visible if ax.tables]
    assert labelled or tables or not visible, "no axis labels"
    if legend:
        assert fig.legends or any(ax.get_legend() for ax in fig.axes), "no legend"


def check_no_data(fig: Figure, stats: dict) -> None:
    assert isinstance(fig, Figure)
    assert any(t.get_text().startswith("no data: ") for t in texts(fig))
    assert stats["no_data"]


def assert_stats(stats: dict, expected: dict) -> None:
    for key, value in expected.items():
        if isinstance(value, float):
            assert stats[key] == pytest.approx(value), key
        else:
            assert stats[key] == value, key


# --- registry and saving ---------------------------------------------------------------------------


def test_registry_is_ordered_unique_and_names_existing_stems():
    stems = [s for s, _ in plots.FIGURES]
    assert stems == sorted(stems) and len(set(stems)) == len(stems)
    assert all(isinstance(d, str) and d for _, d in plots.FIGURES)
    assert stems[0] == "01_vsr_heatmap"


def test_save_figure_writes_png_and_pdf_atomically(tmp_path):
    fig, _ = plots.vsr_heatmap(make_vsr(SMALL_MODELS, SMALL_LANGS))
    written = plots.save_figure(fig, tmp_path / "figs", "01_vsr_heatmap")
    assert [p.name for p in written] == ["01_vsr_heatmap.png", "01_vsr_heatmap.pdf"]
    png, pdf = (p.read_bytes() for p in written)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert pdf.startswith(b"%PDF") and len(pdf) > 2000
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == [
        "01_vsr_heatmap.pdf",
        "01_vsr_heatmap.png",
    ]  # no temp left
    # 200 dpi: the PNG's pixel width is the figure's saved width in inches x 200
    width = int.from_bytes(png[16:20], "big")
    assert width > 4 * 200
    with pytest.raises(ValueError):
        plots.save_figure(fig, tmp_path, "../escape")


def test_save_figure_closes_a_pyplot_figure(tmp_path):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.add_subplot().set_title("t")
    plots.save_figure(fig, tmp_path, "x")
    assert fig.number not in plt.get_fignums()


def test_a_failed_save_leaves_the_previous_file(tmp_path):
    fig, _ = plots.vsr_heatmap(make_vsr(SMALL_MODELS, SMALL_LANGS))
    plots.save_figure(fig, tmp_path, "f")
    before = (tmp_path / "f.png").read_bytes()

    class Broken(Figure):
        def savefig(self, *a, **k):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        plots.save_figure(Broken(), tmp_path, "f")
    assert (tmp_path / "f.png").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png"]


# --- one test per figure: small, large, empty ---------------------------------------------------------


def test_vsr_heatmap():
    small = make_vsr(SMALL_MODELS, SMALL_LANGS, skip={(SMALL_MODELS[0], "zh")})
    fig, stats = plots.vsr_heatmap(small)
    check_figure(fig)
    sub = small[small["design"] == "bedtime"]  # Table 3 is the bedtime design, never the pooled "all" rows
    assert_stats(
        stats,
        {
            "mean_vsr": float(sub["vsr"].mean()),
            "pooled_vsr": float(sub["n_valid"].sum() / sub["n_stories"].sum()),
            "min_vsr": float(sub["vsr"].min()),
            "n_models": 1,
            "n_languages": 2,
            "n_empty_cells": 0,
        },
    )
    texts_ = [t.get_text() for t in texts(fig)]
    assert f"{sub['vsr'].iloc[0] * 100:.1f}" in texts_  # cells annotated with the percentage
    large = make_vsr(LARGE_MODELS, LARGE_LANGS, skip={(LARGE_MODELS[3], "sw"), (LARGE_MODELS[4], "hi")})
    fig, stats = plots.vsr_heatmap(large)
    check_figure(fig)
    assert stats["n_models"] == 23 and stats["n_languages"] == 14 and stats["n_empty_cells"] == 2
    assert stats["mean_vsr"] == pytest.approx(large.loc[large["design"] == "bedtime", "vsr"].mean())
    fig, stats = plots.vsr_heatmap(large, design="stereotales")
    assert stats["mean_vsr"] == pytest.approx(large.loc[large["design"] == "stereotales", "vsr"].mean())
    check_no_data(*plots.vsr_heatmap(pd.DataFrame()))
    check_no_data(*plots.vsr_heatmap(large, design="occupations"))
    with pytest.raises(KeyError, match="vsr"):
        plots.vsr_heatmap(large.drop(columns=["vsr"]))


def test_attribute_distributions():
    ext, fil = make_stories(SMALL_MODELS, SMALL_LANGS)
    fig, stats = plots.attribute_distributions(ext, fil, dimensions=("gender", "age"))
    check_figure(fig, legend=True)
    data = ext.merge(fil, on="story_id")
    data = data[data["parse_ok"]]
    stereo = data[data["design"] == "stereotales"]
    age = stereo.loc[stereo["cond_attribute"] != "age", "demo_age"]
    known = age[age != "unknown"].value_counts()
    assert_stats(
        stats,
        {
            "n_stories": len(stereo),
            "n_models": 1,
            "top_age": known.idxmax(),
            "top_share_age": known.max() / len(age),
            "share_unknown_age": float((age == "unknown").mean()),
            "share_female": float((data["protagonist_gender"] == "female").mean()),
        },
    )
    ext, fil = make_stories(LARGE_MODELS, TEN_LANGS, per_cell=4)
    fig, stats = plots.attribute_distributions(ext, fil)
    check_figure(fig, legend=True)
    assert stats["n_models"] == 23 and "top_geographic_origin" in stats
    # no stereotales stories: the dimension panels say so, the gender panel is still drawn
    fig, stats = plots.attribute_distributions(ext, fil.assign(design="bedtime"), dimensions=("gender",))
    assert stats["n_stories"] == 0 and any(t.get_text().startswith("no data") for t in texts(fig))
    assert stats["share_female"] == pytest.approx(
        float((ext.merge(fil, on="story_id").query("parse_ok")["protagonist_gender"] == "female").mean())
    )
    check_no_data(*plots.attribute_distributions(ext.iloc[0:0], fil))
    check_no_data(*plots.attribute_distributions(pd.DataFrame(), pd.DataFrame()))


def test_association_counts():
    small = make_values(SMALL_MODELS, SMALL_LANGS)
    fig, stats = plots.association_counts(small)
    check_figure(fig)
    sig = small["significant"]
    assert_stats(
        stats,
        {
            "n_significant_all": int(sig[small["scope"] == "all"].sum()),
            "n_significant_languages": int(sig[small["scope"] != "all"].sum()),
            "n_tested": len(small),
            "n_models": 1,
        },
    )
    large = make_values(LARGE_MODELS, TEN_LANGS)
    large["significant"] = large["significant"].astype(object)
    large.loc[large.index[:5], "significant"] = None  # missing flags count as not significant
    fig, stats = plots.association_counts(large)
    check_figure(fig, legend=True)
    flag = large["significant"].fillna(False).astype(bool)
    assert stats["n_significant_all"] == int(flag[large["scope"] == "all"].sum())
    per_model = large[flag & (large["scope"] == "all")].groupby("model").size()
    assert stats["top_model"] == per_model.idxmax()
    check_no_data(*plots.association_counts(pd.DataFrame(columns=["model", "scope", "significant"])))


def test_top_associations_table_and_lift_share_plot():
    shared = make_shared(8, 1)
    fig, stats = plots.top_associations_table(shared, k=20)
    check_figure(fig)
    scope = shared[shared["scope"] == "all"]
    assert_stats(
        stats,
        {
            "n_associations": len(scope),
            "n_shown": len(scope),
            "max_mean_lift": float(scope["mean_lift"].max()),
            "n_rated": int(scope["median_harm"].notna().sum()),
            "n_harmful": int(scope["harmful"].sum()),
        },
    )
    cells = [t.get_text() for t in texts(fig)]
    assert any("professional_field=value_with_a_long_name_1 → geographic_origin=region_1" in c for c in cells)
    assert "–" in cells or scope["median_harm"].notna().all()
    large = make_shared(400, 23)
    fig, stats = plots.top_associations_table(large, k=20)
    check_figure(fig)
    scope = large[large["scope"] == "all"]
    assert stats["n_shown"] == 20 and stats["n_associations"] == len(scope)
    assert stats["max_n_models"] == int(scope["n_models"].max())
    first_row = scope.sort_values(["n_models", "mean_lift"], ascending=False).iloc[0]
    assert any(f"{first_row['mean_lift']:.2f}" == t.get_text() for t in texts(fig))
    for frame in (shared, large):
        fig, stats = plots.lift_share_plot(frame)
        check_figure(fig, legend=True)
        assert stats["n_shown"] == int((frame["scope"] == "all").sum())
    check_no_data(*plots.top_associations_table(pd.DataFrame()))
    check_no_data(*plots.top_associations_table(shared, scope="zz"))
    check_no_data(*plots.lift_share_plot(pd.DataFrame()))


def test_bias_fingerprints():
    small = make_sc(SMALL_MODELS, SMALL_LANGS)
    fig, stats = plots.bias_fingerprints(small)
    check_figure(fig, legend=True)
    adj = small[(small["kind"] == "adjectives") & (small["comparison"] == "child_gender")]
    means = adj.groupby("category")["s_c"].mean()
    assert_stats(
        stats,
        {
            "comparison": "child_gender",
            "n_models": 1,
            "n_languages": 3,
            "max_abs_s_c": float(adj["s_c"].abs().max()),
            "most_positive_category": means.idxmax(),
            "most_negative_category": means.idxmin(),
            "n_small_sample_cells": 1,
        },
    )
    assert len(fig.axes[0].lines) == 1 + 3  # zero circle + one polygon per language
    fig, stats = plots.bias_fingerprints(small, comparison="social_class")
    assert stats["comparison"] == "social_class"
    large = make_sc(LARGE_MODELS, TEN_LANGS, missing={(LARGE_MODELS[0], "zh")})
    fig, stats = plots.bias_fingerprints(large)
    check_figure(fig, legend=True)
    assert stats["n_models"] == 23 and stats["n_languages"] == 10
    assert sum(ax.get_visible() for ax in fig.axes) == 23
    check_no_data(*plots.bias_fingerprints(pd.DataFrame()))
    check_no_data(*plots.bias_fingerprints(small, comparison="nope"))


def _degenerate_sc(clipped: bool, small: bool, models=SMALL_MODELS):
    """metrics_sc rows as the default run's 12 bedtime stories give them: 2 stories per group per
    language; ``clipped``: every category seen in one group only (S_C = +-2)."""
    rows = []
    for m, lang in itertools.product(models, SMALL_LANGS):
        for j, c in enumerate(CATS):
            s = (2.0 if j % 2 else -2.0) if clipped else 0.4 * (j - 2.5)
            rows.append(
                {
                    "comparison": "child_gender",
                    "model": m,
                    "language": lang,
                    "kind": "adjectives",
                    "category": c,
                    "s_c": s,
                    "ci_low": s,
                    "ci_high": s,
                    "n_m": 2 if small else 30,
                    "n_f": 2 if small else 31,
                    "small_sample": small,
                    "coverage": 0.5,
                    "note": "",
                }
            )
    return pd.DataFrame(rows)


def _texts_of(fig):
    return " ".join(t.get_text().replace("\n", " ") for t in texts(fig))


@pytest.mark.parametrize("clipped,small", [(True, True), (True, False), (False, True)])
def test_bias_fingerprints_say_too_few_stories_instead_of_drawing_clipped_values(clipped, small):
    fig, stats = plots.bias_fingerprints(_degenerate_sc(clipped, small))
    shown = _texts_of(fig)
    assert "too few stories" in shown and "need ≥ 20" in shown
    assert ("n_m = 2, n_f = 2" in shown) == small and ("n_m = 30, n_f = 31" in shown) == (not small)
    assert ("±2 clip" in shown) == clipped
    assert len(fig.axes[0].lines) == 0  # no polygon, not even the zero circle
    assert stats["n_too_small_panels"] == 1 and stats["too_small"] and stats["no_data"]
    assert np.isnan(stats["max_abs_s_c"])  # a quote prints n/a, not a clipped 2.00
    assert plots.quote_stats("Largest |S_C| = {max_abs_s_c:.2f}", stats) == "Largest |S_C| = n/a"
    check_figure(fig)


def test_bias_fingerprints_guard_each_panel_and_keep_the_others():
    sc = pd.concat([_degenerate_sc(True, True, ["tiny"]), _degenerate_sc(False, False, ["big"])], ignore_index=True)
    fig, stats = plots.bias_fingerprints(sc, min_stories=25)
    assert stats["n_too_small_panels"] == 1 and "too_small" not in stats and "no_data" not in stats
    big = sc[sc["model"] == "big"]
    assert stats["max_abs_s_c"] == pytest.approx(float(big["s_c"].abs().max()))  # the drawn panel only
    polar = [ax for ax in fig.axes if ax.name == "polar" and ax.get_visible()]
    assert [len(ax.lines) for ax in polar] == [1 + 3, 0]  # big: zero circle + 3 languages; tiny: text
    assert "need ≥ 25" in _texts_of(fig)
    # the usual input (some small cells only) still draws every panel
    assert plots.bias_fingerprints(make_sc(SMALL_MODELS, SMALL_LANGS))[1]["n_too_small_panels"] == 0


def test_jsd_figure_says_too_few_stories_when_every_jsd_is_ln2():
    rows = [
        {
            "comparison": "child_gender",
            "model": "m",
            "language": lang,
            "jsd": float(np.log(2)),
            "ci_low": float(np.log(2)),
            "ci_high": float(np.log(2)),
            "n_m": 2,
            "n_f": 2,
            "small_sample": True,
            "note": "",
        }
        for lang in SMALL_LANGS
    ]
    fig, stats = plots.jsd_by_grammatical_gender(pd.DataFrame(rows))
    shown = _texts_of(fig)
    assert "too few stories" in shown and "ln 2" in shown and "en n_m = 2, n_f = 2" in shown and "need ≥ 20" in shown
    assert not any(ax.patches for ax in fig.axes)  # no box drawn
    assert stats["too_small"] and np.isnan(stats["median_jsd_G"]) and stats["n_G"] + stats["n_N"] == 3
    fig, stats = plots.vsr_vs_jsd(pd.DataFrame(rows).assign(vsr=0.9), min_stories=30)
    assert "too few stories" in _texts_of(fig) and "need ≥ 30" in stats["too_small"] and np.isnan(stats["max_jsd"])
    assert stats["n_points"] == 3 and not any(ax.collections for ax in fig.axes)
    rows[0]["jsd"] = 0.3  # one informative cell: drawn as usual
    fig, stats = plots.jsd_by_grammatical_gender(pd.DataFrame(rows))
    assert "too_small" not in stats and np.isfinite(stats["median_jsd_N"])
    assert "too_small" not in plots.vsr_vs_jsd(pd.DataFrame(rows).assign(vsr=0.9))[1]


def _power_table(testable: bool):
    from storybias.summaries import ALL_COMPARED

    rows = [
        {
            "model": "m",
            "scope": "all",
            "base_attribute": "gender",
            "compared_attribute": ALL_COMPARED,
            "n_values": 3,
            "row_values": ["man", "non_binary", "woman"],
            "row_sizes": [18, 18, 18],
            "testable": True,
            "reason": "",
            "min_detectable_lift": np.nan,
            "power_note": "",
            "n_family": 18,
            "n_simulations": 200,
        }
    ]
    for dim, reason in (
        ("age", "rows < 10 known stories: 3 of 3 values"),
        ("religion", "all unknown"),
        ("income_level", "all unknown"),
        ("education", "" if testable else "one known value"),
    ):
        rows.append(
            {
                **rows[0],
                "compared_attribute": dim,
                "row_sizes": [4, 3, 5],
                "testable": not reason,
                "reason": reason,
                "min_detectable_lift": 3.0 if not reason else np.nan,
            }
        )
    rows.append({**rows[1], "scope": "en", "reason": "one prompted value"})  # per-language rows are not quoted
    return pd.DataFrame(rows)


def test_association_figures_quote_the_power_table_when_stage_04_tested_nothing():
    power = _power_table(testable=False)
    for fig, stats in (
        plots.association_counts(pd.DataFrame(columns=["model", "scope", "significant"]), power=power),
        plots.top_associations_table(pd.DataFrame(), power=power),
        plots.lift_share_plot(pd.DataFrame(), power=power),
    ):
        check_no_data(fig, stats)
        shown = _texts_of(fig)
        assert "gender (18/18/18 stories per prompted value): 0 of 4 compared dimensions testable" in stats["no_data"]
        assert "all unknown (2 dimensions)" in stats["no_data"] and "one known value (1 dimension)" in stats["no_data"]
        assert "rows < 10 known stories: 3 of 3 values (1 dimension)" in stats["no_data"]
        assert "one prompted value" not in stats["no_data"] and "18/18/18" in shown
    tested = plots.power_reason(_power_table(testable=True))
    assert "1 of 4 compared dimensions testable; smallest detectable lift 3" in tested
    # without a power table the old reason stays
    assert "associations_values table is empty" in plots.association_counts(pd.DataFrame())[1]["no_data"]
    assert plots.power_reason(pd.DataFrame()) is None


def test_cosine_heatmaps():
    small_sc = make_sc(SMALL_MODELS, SMALL_LANGS)
    small = metrics.cosine_matrix(small_sc)
    fig, stats = plots.cosine_heatmaps(small)
    check_figure(fig)
    off = small[(small["comparison"] == "child_gender") & (small["language_a"] != small["language_b"])]
    assert_stats(
        stats,
        {
            "n_models": 1,
            "n_languages": 3,
            "mean_cosine": float(off["cosine"].mean()),
            "min_cosine": float(off["cosine"].min()),
        },
    )
    large = metrics.cosine_matrix(make_sc(LARGE_MODELS, LARGE_LANGS))
    fig, stats = plots.cosine_heatmaps(large)
    check_figure(fig)
    off = large[(large["comparison"] == "child_gender") & (large["language_a"] != large["language_b"])]
    assert stats["mean_cosine"] == pytest.approx(off.groupby("model")["cosine"].mean().mean())
    assert stats["most_consistent_model"] == off.groupby("model")["cosine"].mean().idxmax()
    check_no_data(*plots.cosine_heatmaps(pd.DataFrame()))


def test_jsd_by_grammatical_gender():
    small = make_jsd(SMALL_MODELS, SMALL_LANGS + ["sw"])
    fig, stats = plots.jsd_by_grammatical_gender(small)
    check_figure(fig, legend=True)
    g = small.loc[small["language"].isin(metrics.GRAMMATICAL_GENDER["G"]), "jsd"]
    n = small.loc[small["language"].isin(metrics.GRAMMATICAL_GENDER["N"]), "jsd"]
    assert_stats(
        stats,
        {"median_jsd_G": float(g.median()), "median_jsd_N": float(n.median()), "n_G": 1, "n_N": 2, "n_ungrouped": 1},
    )
    fig, stats = plots.jsd_by_grammatical_gender(small, ["fr", "zh"])  # a list: the rest is N
    assert stats["n_G"] == 2 and stats["n_N"] == 2 and stats["n_ungrouped"] == 0
    large = make_jsd(LARGE_MODELS, LARGE_LANGS)
    fig, stats = plots.jsd_by_grammatical_gender(large)
    check_figure(fig, legend=True)
    assert stats["n_models"] == 23 and stats["n_G"] == 23 * 8 and stats["n_N"] == 23 * 4 and stats["n_ungrouped"] == 2
    check_no_data(*plots.jsd_by_grammatical_gender(pd.DataFrame()))
    check_no_data(*plots.jsd_by_grammatical_gender(small[small["language"] == "sw"]))


def test_distinctive_words():
    small = make_log_odds(SMALL_MODELS, 4)
    fig, stats = plots.distinctive_words(small, top=10)  # every model, as BiasedTales-ML's Figs. 10-12
    check_figure(fig, legend=True)
    n = len(SMALL_MODELS)
    assert_stats(
        stats,
        {
            "models": ", ".join(sorted(SMALL_MODELS)),
            "n_panels": 4 * n,
            "n_words": 4 * n * 8,
            "max_abs_z": float(small["z"].abs().max()),
        },
    )
    large = make_log_odds(LARGE_MODELS[:3], 30)
    fig, stats = plots.distinctive_words(large, top=10, model=LARGE_MODELS[2])
    check_figure(fig, legend=True)
    part = large[large["model"] == LARGE_MODELS[2]]
    assert stats["n_words"] == 4 * 2 * 10 and stats["max_abs_z"] == pytest.approx(float(part["z"].abs().max()))
    fig, stats = plots.distinctive_words(large, top=500, model=LARGE_MODELS[0])  # capped
    assert stats["n_words"] == 4 * 2 * 25
    refs = make_log_odds(SMALL_MODELS[:1], 3)
    refs = pd.concat([refs, refs[refs["field"] == "settings"].assign(field="cultural_refs")], ignore_index=True)
    fig, stats = plots.distinctive_words(refs)  # the cultural references get their own column
    assert stats["n_panels"] == 2 * 3
    check_no_data(*plots.distinctive_words(pd.DataFrame()))
    check_no_data(*plots.distinctive_words(small, model="absent"))


def test_vsr_vs_jsd():
    jsd = make_jsd(SMALL_MODELS, SMALL_LANGS)
    small = jsd.assign(vsr=[0.9, np.nan, 0.5], n_stories=24)
    fig, stats = plots.vsr_vs_jsd(small)
    check_figure(fig, legend=True)
    ok = small.dropna(subset=["vsr"])
    assert_stats(
        stats,
        {
            "n_points": 2,
            "n_missing": 1,
            "mean_vsr": 0.7,
            "mean_jsd": float(ok["jsd"].mean()),
            "max_jsd": float(ok["jsd"].max()),
        },
    )
    assert {"en", "zh"} <= {t.get_text() for t in texts(fig)}
    large = make_jsd(LARGE_MODELS, LARGE_LANGS)
    large["vsr"] = np.random.default_rng(0).uniform(0.2, 1.0, len(large))
    fig, stats = plots.vsr_vs_jsd(large)
    check_figure(fig, legend=True)
    assert stats["n_points"] == 23 * 14 and stats["mean_vsr"] == pytest.approx(large["vsr"].mean())
    check_no_data(*plots.vsr_vs_jsd(pd.DataFrame()))
    check_no_data(*plots.vsr_vs_jsd(small.assign(vsr=np.nan)))


def test_balance_stereotype_and_anova_table():
    small = make_aggregates(SMALL_MODELS, SMALL_LANGS)
    fig, stats = plots.balance_stereotype(small)
    check_figure(fig, legend=True)
    sub = small[small["denominator"] == "all outputs"]
    assert_stats(
        stats,
        {
            "n_points": len(sub),
            "n_languages": 3,
            "n_tasks": 3,
            "n_ellipses": 0,  # one model: no ellipse
            "mean_m_s": float(sub["m_s"].mean()),
            "mean_m_b": float(sub["m_b"].mean()),
            "max_m_s": float(sub["m_s"].max()),
        },
    )
    large = make_aggregates(LARGE_MODELS, TEN_LANGS)
    fig, stats = plots.balance_stereotype(large, denominator="identified only")
    check_figure(fig, legend=True)
    assert stats["n_ellipses"] == 10 * 3 and stats["n_points"] == 23 * 10 * 3
    check_no_data(*plots.balance_stereotype(pd.DataFrame()))
    check_no_data(*plots.balance_stereotype(small, denominator="nope"))

    anova = make_anova()
    fig, stats = plots.anova_table(anova)
    check_figure(fig)
    assert_stats(
        stats,
        {
            "n_rows": len(anova),
            "n_significant": int((anova["p_adjusted"] < 0.05).sum()),
            "max_partial_omega_sq": float(anova["partial_omega_sq"].max()),
        },
    )
    check_no_data(*plots.anova_table(pd.DataFrame()))


def test_umap_display_trim_keeps_the_15th_to_90th_percentiles_per_label_and_cell():
    # one cell, one label: x = 0..100, y constant -> x in [15, 90] is kept (76 points); a second label in the
    # same cell is trimmed on its own percentiles, and y is trimmed too (either coordinate)
    a = pd.DataFrame({"language": "en", "genre": "story", "label": "female", "x": np.arange(101.0), "y": 0.0})
    b = pd.DataFrame({"language": "en", "genre": "story", "label": "male", "x": 0.0, "y": np.arange(1000.0, 1101.0)})
    kept = plots.trim_for_display(pd.concat([a, b], ignore_index=True))
    female, male = kept[kept.label == "female"], kept[kept.label == "male"]
    assert (female["x"].min(), female["x"].max(), len(female)) == (15.0, 90.0, 76)
    assert (male["y"].min(), male["y"].max(), len(male)) == (1015.0, 1090.0, 76)
    assert len(plots.trim_for_display(a, None)) == 101
    both = pd.concat([a, b], ignore_index=True).assign(x=lambda d: d.x + np.sin(d.y))
    fig, stats = plots.umap_density(both)  # the figure trims by default
    assert (
        stats["n_points"] == len(plots.trim_for_display(both)) < 202 and stats["n_points"] + stats["n_trimmed"] == 202
    )


def test_umap_density():
    small = make_umap(SMALL_LANGS, ["story", "news"], 12, tiny={("zh", "news", "male")})
    fig, stats = plots.umap_density(small, percentiles=None)
    check_figure(fig, legend=True)
    assert_stats(
        stats,
        {
            "n_points": len(small),
            "n_female": int((small["label"] == "female").sum()),
            "n_panels": 6,
            "n_contoured_groups": 11,
            "n_skipped_groups": 1,
        },
    )
    assert sum(bool(ax.collections) for ax in fig.axes) == 6
    large = make_umap(TEN_LANGS, ["story", "news"], 25)
    fig, stats = plots.umap_density(
        large.assign(label=np.where(large.index % 17 == 0, "unknown", large["label"])), percentiles=None
    )
    check_figure(fig, legend=True)
    assert stats["n_panels"] == 20 and stats["n_contoured_groups"] == 40
    assert sum(ax.get_visible() for ax in fig.axes) == 20
    assert stats["n_points"] == int((large.index % 17 != 0).sum())
    check_no_data(*plots.umap_density(pd.DataFrame()))


def test_probe_auc():
    small = make_probes(SMALL_LANGS, ["story", "news"], skip={("zh", "news")})
    fig, stats = plots.probe_auc(small)
    check_figure(fig, legend=True)
    ok = small[small["status"] == "ok"]
    delta = ok[ok["variant"] == "delta"]
    assert_stats(
        stats,
        {
            "n_cells": 6,
            "n_ok_cells": 5,
            "n_skipped_rows": 3,
            "mean_auc_full": float(ok.loc[ok["variant"] == "full", "auc"].mean()),
            "mean_auc_cue_deleted": float(ok.loc[ok["variant"] == "cue_deleted", "auc"].mean()),
            "mean_delta": float(delta["auc"].mean()),
            "largest_drop": float(delta["auc"].min()),
        },
    )
    words = [t.get_text() for t in texts(fig)]
    assert "skipped (fewer than 2 model-occupation groups)" in words  # both variants skipped: one line
    assert "Δ skipped (fewer than 2 model-occupation groups)" in words or any(w.startswith("Δ skipped") for w in words)
    partial = small.copy()
    cue = (partial["language"] == "en") & (partial["genre"] == "story") & (partial["variant"] == "cue_deleted")
    partial.loc[cue, ["auc", "ci_low", "ci_high"]] = np.nan
    partial.loc[cue, "status"] = "too few cue-deleted texts"
    fig, stats = plots.probe_auc(partial)
    assert "cue-deleted: skipped (too few cue-deleted texts)" in [t.get_text() for t in texts(fig)]
    assert stats["n_ok_cells"] == 4 and stats["n_skipped_rows"] == 4
    assert any(
        abs(x - 0.5) < 1e-9 for line in fig.axes[0].lines for x in np.atleast_1d(line.get_xdata())
    )  # chance line
    large = make_probes([*LARGE_LANGS, "all"], ["story", "news"])
    fig, stats = plots.probe_auc(large)
    check_figure(fig, legend=True)
    assert stats["n_cells"] == 30 and stats["n_ok_cells"] == 30
    check_no_data(*plots.probe_auc(pd.DataFrame()))


def test_cultural_relevance_and_separability():
    small = make_cultural(["en", "fr", "zh"], ["story", "news"])
    fig, stats = plots.cultural_relevance(small)
    check_figure(fig)
    own = small["source_language"] == small["context"]
    assert_stats(
        stats,
        {
            "n_genres": 2,
            "n_source_languages": 3,
            "mean_self_relevance": float(small.loc[own, "relevance"].mean()),
            "self_context_advantage": float(small.loc[own, "relevance"].mean() - small.loc[~own, "relevance"].mean()),
            "n_markers": 6 * 90,
            "n_narratives": 6 * 40,
        },
    )
    large = make_cultural(LARGE_LANGS, ["explicit", "story", "news"])
    fig, stats = plots.cultural_relevance(large.iloc[1:])  # one cell missing
    check_figure(fig)
    assert stats["n_source_languages"] == 14
    check_no_data(*plots.cultural_relevance(pd.DataFrame()))

    fig, stats = plots.separability(make_sep())
    check_figure(fig, legend=True)
    assert_stats(
        stats,
        {"ba_original": 0.82, "ba_translated": 0.61, "ba_masked": 0.48, "chance": 1 / 3, "n_ok": 3, "n_skipped": 0},
    )
    fig, stats = plots.separability(make_sep(skip_masked=True))
    check_figure(fig, legend=True)
    assert np.isnan(stats["ba_masked"]) and stats["n_skipped"] == 1
    assert any("skipped" in t.get_text() and "spaCy model not installed" in t.get_text() for t in texts(fig))
    check_no_data(*plots.separability(pd.DataFrame()))


def make_findings(models: list[str], languages: list[str]) -> pd.DataFrame:
    """associations_findings: model i has i harmful of 4 + i significant in the pooled pass (the first none,
    one unrated); per language, one harmful association in every other cell, language-only."""
    rows = []
    for i, model in enumerate(models):
        pooled = {
            "n_stories": 100,
            "n_tables": 10,
            "n_retained": 3,
            "n_significant": 4 + i,
            "n_rated": 4 + i - (i == 0),
        }
        rows.append({"model": model, "scope": "all", **pooled, "n_harmful": i, "n_harmful_only_here": None})
        for j, language in enumerate(languages):
            counts = {"n_stories": 50, "n_tables": 8, "n_retained": 2, "n_significant": 2, "n_rated": 2}
            harm = (i + j) % 2
            rows.append({"model": model, "scope": language, **counts, "n_harmful": harm, "n_harmful_only_here": harm})
    return pd.DataFrame(rows).astype({"n_harmful_only_here": "Int64"})


def test_headline_findings_shows_significant_and_harmful_with_n():
    table = make_findings(["m1", "m2", "m3"], ["en", "fr"])
    fig, stats = plots.headline_findings(table)
    check_figure(fig, legend=True)
    assert_stats(
        stats,
        {"n_models": 3, "n_models_harmful": 2, "n_harmful_all": 3, "n_harmful_languages": 3,
         "n_harmful_only_here": 3, "n_unrated": 1},
    )  # fmt: skip
    assert any("0 / 4 (n = 100), 1 unrated" in t.get_text() for t in texts(fig))
    assert any(t.get_text() == "1 / 2\n(1)" for t in texts(fig))
    check_no_data(*plots.headline_findings(pd.DataFrame()))
    only_pooled = table[table["scope"] == "all"]
    assert any("no per-language pass" in t.get_text() for t in texts(plots.headline_findings(only_pooled)[0]))


def test_every_figure_saves(tmp_path):
    """Each registered figure, drawn from small inputs, saves to non-empty PNG and PDF."""
    ext, fil = make_stories(SMALL_MODELS, SMALL_LANGS)
    sc = make_sc(SMALL_MODELS, SMALL_LANGS)
    jsd = make_jsd(SMALL_MODELS, SMALL_LANGS)
    agg = make_aggregates(SMALL_MODELS, SMALL_LANGS)
    anova = make_anova()
    figures = {
        "01_vsr_heatmap": plots.vsr_heatmap(make_vsr(SMALL_MODELS, SMALL_LANGS)),
        "02_attribute_distributions": plots.attribute_distributions(ext, fil),
        "03_association_counts": plots.association_counts(make_values(SMALL_MODELS, SMALL_LANGS)),
        "04_top_associations_table": plots.top_associations_table(make_shared(8, 1)),
        "05_lift_share": plots.lift_share_plot(make_shared(8, 1)),
        "06_bias_fingerprints": plots.bias_fingerprints(sc),
        "07_cosine_heatmaps": plots.cosine_heatmaps(metrics.cosine_matrix(sc)),
        "08_jsd_grammatical_gender": plots.jsd_by_grammatical_gender(jsd),
        "09_distinctive_words": plots.distinctive_words(make_log_odds(SMALL_MODELS, 5)),
        "10_vsr_vs_jsd": plots.vsr_vs_jsd(jsd.assign(vsr=0.8)),
        "11_balance_stereotype": plots.balance_stereotype(agg),
        "12_anova_table": plots.anova_table(anova[anova["denominator"] == "all outputs"].head(8)),
        "13_umap_density": plots.umap_density(make_umap(SMALL_LANGS, ["story"], 10)),
        "14_probe_auc": plots.probe_auc(make_probes(SMALL_LANGS, ["story"])),
        "15_cultural_relevance": plots.cultural_relevance(make_cultural(["en", "fr", "zh"], ["story"])),
        "16_separability": plots.separability(make_sep()),
        "17_crosslens": plots.crosslens_heatmap(*make_crosslens()),
        "18_harm_agreement": plots.harm_agreement(*make_harm()),
        "19_self_context_advantage": plots.self_context_advantage(*make_advantage()),
        "20_glm_table": plots.glm_table(make_glm()),
        "21_headline_findings": plots.headline_findings(make_findings(SMALL_MODELS, SMALL_LANGS)),
    }
    assert list(figures) == [s for s, _ in plots.FIGURES]
    for stem, (fig, stats) in figures.items():
        assert isinstance(stats, dict) and stats and "no_data" not in stats, stem
        png, pdf = plots.save_figure(fig, tmp_path, stem, dpi=72)  # 200 dpi is checked above; here every figure saves
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000, stem
        assert pdf.read_bytes()[:4] == b"%PDF" and pdf.stat().st_size > 1000, stem
    fig, _ = plots.umap_density(pd.DataFrame())
    png, pdf = plots.save_figure(fig, tmp_path, "empty")  # a no-data figure saves too
    assert png.stat().st_size > 0 and pdf.read_bytes()[:4] == b"%PDF"


def make_crosslens() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A cross-lens table of 3 models x 2 languages whose measures rise with the model's index (one
    cell without M_s), and its agreement table."""
    from storybias.stages.crosslens import measures as X
    from storybias.stats.concordance import lens_agreement

    rows = []
    for i, model in enumerate(("a", "b", "c")):
        for j, language in enumerate(("en", "fr")):
            row: dict = {"model": model, "language": language}
            for k, measure in enumerate(X.MEASURES):
                value = float("nan") if (model, language, measure) == ("a", "en", "m_s") else i + 0.1 * j + 0.01 * k
                row |= {measure: value, f"{measure}_low": value - 0.1, f"{measure}_high": value + 0.1}
                row |= {f"n_{measure}": 30, f"reason_{measure}": "" if value == value else "too few"}
            rows.append(row)
    table = pd.DataFrame(rows)
    table["share_harmful"] = [0.5, 0.1, 0.4, 0.2, 0.3, 0.6]  # unrelated to the model: the least concordant
    return table, lens_agreement(table, list(X.MEASURES), n_permutations=100, lenses=X.LENS_OF)


def test_crosslens_heatmap_marks_missing_cells_and_picks_the_extreme_pairs():
    from storybias.stages.crosslens.measures import MEASURES

    table, agreement = make_crosslens()
    fig, stats = plots.crosslens_heatmap(table, agreement)
    assert stats["n_cells"] == 6 and stats["n_measures"] == len(MEASURES) and stats["n_missing"] == 1
    assert stats["r_most"] == pytest.approx(1.0) and "share_harmful" not in stats["most_concordant"]
    assert "share_harmful" in stats["least_concordant"] and abs(stats["r_least"]) < 0.5
    heat = fig.axes[0]
    assert [t.get_text() for t in heat.texts].count("×") == 1
    assert "Feng\nM_s" in [t.get_text() for t in heat.get_xticklabels()]
    assert "a · en" in [t.get_text() for t in heat.get_yticklabels()]
    # without any assessed pair: the pairs with most cells in common, said to be not assessed
    unassessed = agreement.assign(r_within_language=np.nan)
    _, stats = plots.crosslens_heatmap(table, unassessed)
    assert stats["n_pairs_assessed"] == 0 and np.isnan(stats["r_most"]) and stats["n_most"] == 6
    titles = [" ".join(ax.get_title().split()) for ax in plots.crosslens_heatmap(table, unassessed)[0].axes]
    assert any("not assessed (6 cells in common)" in t for t in titles)


# --- 18-20: judges vs humans (StereoTales), self-context advantage and GLMs (Feng et al.) ----------

HARM_ATTRIBUTES = ["income_level", "education", "gender", "religion"]


def make_harm(n: int = 12) -> tuple[pd.DataFrame, dict]:
    """associations_shared with the judges' median harm (one association unrated, one repeated in a
    second scope) and a manifest with stage 04's human agreement and the three tables it does not write yet."""
    rows = []
    for i in range(n):
        attribute = HARM_ATTRIBUTES[i % 4]
        rows.append({"association_id": f"{attribute}|v{i}|education|x", "scope": "all", "median_harm": 1.0 + i % 5})
    rows.append({**rows[0], "scope": "fr"})  # the same association in a language scope: counted once
    rows.append({"association_id": "age|v|education|x", "scope": "all", "median_harm": np.nan})  # unrated
    shared = pd.DataFrame(rows)
    human = [{"association_id": r["association_id"], "median_harm": min(5.0, r["median_harm"] + 0.5)} for r in rows[:n]]
    human[0]["association_id"] = "not|rated|by|judges"  # only in the human file: not a point
    gap = [
        {"base_attribute": a, "n_associations": 3, "gap": g, "gap_ci_low": g - 0.2, "gap_ci_high": g + 0.2}
        for a, g in zip(HARM_ATTRIBUTES, [0.9, -0.4, -1.1, np.nan])  # religion: no gap (left out)
    ]
    own = [
        {
            "judge": "m-a",
            "n_compared": 5,
            "gap": -0.6,
            "gap_ci_low": -0.9,
            "gap_ci_high": -0.3,
            "self_share_harmful": 0.2,
        },
        {
            "judge": "m-b",
            "n_compared": 4,
            "gap": 0.2,
            "gap_ci_low": np.nan,
            "gap_ci_high": np.nan,
            "self_share_harmful": 0.5,
        },
    ]
    manifest = {
        "human_agreement": {"rho": 0.62, "ci_low": 0.5, "ci_high": 0.7, "n": 11, "note": ""},
        "harmful_human_vs_llm": {"n": 11, "cohen_kappa": 0.41},
        "human_summary": human,
        "harm_gap": gap,
        "self_judgement": own,
    }
    return shared, manifest


def _panel_words(fig: Figure) -> list[str]:
    return [" ".join(t.get_text().split()) for t in texts(fig)]


def test_harm_agreement_draws_the_three_comparisons_from_the_manifest():
    shared, manifest = make_harm()
    fig, stats = plots.harm_agreement(shared, manifest)
    check_figure(fig)
    assert_stats(
        stats,
        {
            "n_rated": 12,
            "n_human_compared": 11,  # the human file's 12th association was not rated by the judges
            "rho": 0.62,
            "rho_ci_low": 0.5,
            "rho_ci_high": 0.7,
            "n_rho": 11,
            "kappa_harmful": 0.41,
            "n_attributes": 3,
            "max_gap": 0.9,
            "max_gap_attribute": "income_level",
            "min_gap": -1.1,
            "min_gap_attribute": "gender",
            "n_self_judges": 2,
            "mean_self_gap": -0.2,
            "min_self_gap": -0.6,
            "min_self_gap_judge": "m-a",
        },
    )
    scatter, gaps, own = fig.axes
    assert "Spearman ρ = 0.62 [0.50, 0.70], n = 11" in " ".join(scatter.get_title().split())
    assert sum(len(c.get_offsets()) for c in scatter.collections) == len(
        {(min(5.0, h + 0.5), h) for h in shared["median_harm"].iloc[1:12]}
    )  # one bubble per distinct (human, judges) pair
    assert [t.get_text() for t in gaps.get_yticklabels()] == [
        "income_level (n = 3)",
        "education (n = 3)",
        "gender (n = 3)",
    ]
    assert [t.get_text().split("\n")[0] for t in own.get_yticklabels()] == ["m-a", "m-b"]
    assert "n = 5, 20% self-rated harmful" in [t.get_text().split("\n")[1] for t in own.get_yticklabels()]


def test_harm_agreement_says_what_stage_04_did_not_write():
    shared, manifest = make_harm()
    # the default run: no human ratings file, no self-judgement table
    fig, stats = plots.harm_agreement(shared, {"human_agreement": None})
    check_figure(fig)
    words = _panel_words(fig)
    assert words.count("no human ratings: set associations.human_ratings") == 2
    assert any("stage 04 writes no self-judgement contrast (manifest key 'self_judgement'" in w for w in words)
    assert stats["n_rated"] == 12 and stats["n_human_compared"] == 0 and np.isnan(stats["rho"])
    assert stats["n_attributes"] == stats["n_self_judges"] == 0 and np.isnan(stats["mean_self_gap"])
    assert "no_data" not in stats and not any("no data" in w for w in words)  # a figure with data, panels saying why
    # human agreement in the manifest but no per-association medians or gap: the panels say which key is missing
    fig, stats = plots.harm_agreement(shared, {"human_agreement": manifest["human_agreement"]})
    words = _panel_words(fig)
    assert any(
        w.startswith("Spearman ρ = 0.62 [0.50, 0.70], n = 11. Stage 04 writes no per-association") for w in words
    )
    assert any("no per-attribute harm gap (manifest key 'harm_gap'" in w for w in words)
    assert stats["rho"] == 0.62 and stats["n_human_compared"] == 0
    # no significant association, or none rated: the whole figure says no data
    check_no_data(*plots.harm_agreement(pd.DataFrame()))
    fig, stats = plots.harm_agreement(shared.assign(median_harm=np.nan), manifest)
    check_no_data(fig, stats)
    assert "no association was rated" in stats["no_data"] and stats["n_rated"] == 0 and np.isnan(stats["rho"])
    with pytest.raises(KeyError, match=r"manifest_associations\.json: missing column\(s\) gap_ci_low"):
        plots.harm_agreement(
            shared, {**manifest, "harm_gap": [{"base_attribute": "x", "n_associations": 1, "gap": 1.0}]}
        )


def make_advantage() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Feng et al.'s six cells (their Sec. 4.3 means) with +-0.4 intervals, and a validation_markers
    table holding their high-agreement subset."""
    values = {("en", "story"): 2.42, ("fr", "story"): 4.26, ("zh", "story"): 2.94}
    values |= {("en", "news"): 2.64, ("fr", "news"): 4.78, ("zh", "news"): -0.3}  # one negative, its CI across 0
    advantage = pd.DataFrame(
        [
            {
                "source_language": lang,
                "genre": g,
                "advantage": a,
                "ci_low": a - 0.4,
                "ci_high": a + 0.4,
                "n_narratives": 50,
            }
            for (lang, g), a in values.items()
        ]
    )
    validation = pd.DataFrame(
        [
            {"metric": "spearman", "estimate": 0.555, "ci_low": 0.466, "ci_high": 0.641, "n_markers": 178},
            {"metric": plots.SUBSET_ADVANTAGE, "estimate": 3.28, "ci_low": 2.53, "ci_high": 3.95, "n_markers": 54},
            {
                "metric": plots.SUBSET_SELF_HIGHEST,
                "estimate": 0.778,
                "ci_low": 0.648,
                "ci_high": 0.889,
                "n_markers": 54,
            },
        ]
    )
    return advantage, validation


def test_self_context_advantage_per_cell_and_on_the_high_agreement_subset():
    advantage, validation = make_advantage()
    fig, stats = plots.self_context_advantage(advantage, validation)
    check_figure(fig, legend=True)
    assert_stats(
        stats,
        {
            "n_cells": 6,
            "n_positive": 5,
            "n_ci_above_zero": 5,
            "mean_advantage": float(advantage["advantage"].mean()),
            "min_advantage": -0.3,
            "min_advantage_cell": "zh / news",
            "max_advantage": 4.78,
            "max_advantage_cell": "fr / news",
            "n_narratives": 300,
            "subset_advantage": 3.28,
            "subset_ci_low": 2.53,
            "subset_ci_high": 3.95,
            "n_subset_markers": 54,
            "subset_share_self_highest": 0.778,
        },
    )
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "English · story (n = 50)" and labels[-1] == "high-agreement markers, pooled (n = 54 markers)"
    assert any(np.allclose(line.get_xdata(), 0) for line in ax.lines)  # the zero line
    assert any("strictly highest for 77.8%" in w for w in _panel_words(fig))
    # without human marker ratings, and with ratings but no subset rows: no second series, and why
    fig, stats = plots.self_context_advantage(advantage)
    assert stats["n_cells"] == 6 and stats["n_subset_markers"] == 0 and np.isnan(stats["subset_advantage"])
    assert any("no human marker ratings (probes.human_validation.markers)" in w for w in _panel_words(fig))
    assert len(fig.axes[0].get_yticklabels()) == 6
    fig, stats = plots.self_context_advantage(advantage, validation.iloc[:1])
    assert any("stage 06 does not compute it" in w for w in _panel_words(fig)) and np.isnan(stats["subset_advantage"])
    check_no_data(*plots.self_context_advantage(pd.DataFrame()))
    check_no_data(*plots.self_context_advantage(advantage.assign(advantage=np.nan)))


def make_glm(adjusted: bool = False) -> pd.DataFrame:
    """Stage 05's GLM table as the default run writes it (a negative Wald chi2 on one intercept)."""
    terms = ["Intercept", "C(language, Sum)", "C(task, Sum)", "C(language, Sum):C(task, Sum)", "C(model, Sum)"]
    rows = []
    for outcome, chi2s, ps in (
        ("female", [-132.7, 8.0, 0.01, 25.0, 5.7], [1.0, 0.018, 0.94, 1e-5, 0.017]),
        ("identified", [9.1, 2.0, 0.03, 3.0, 0.4], [0.003, 0.37, 0.86, 0.22, 0.52]),
    ):
        for term, chi2, p in zip(terms, chi2s, ps):
            rows.append({"outcome": outcome, "term": term, "chi2": chi2, "p_value": p, "df": 2, "n_trials": 80})
    table = pd.DataFrame(rows)
    if adjusted:
        table["p_adjusted"] = np.minimum(1.0, table["p_value"] * 3)
    return table


def test_glm_table_shades_significant_terms_and_flags_negative_wald_statistics():
    glm = make_glm()
    fig, stats = plots.glm_table(glm)
    check_figure(fig)
    # significant terms: female language (.018), language x genre, model; never an intercept or a negative chi2
    assert_stats(
        stats,
        {
            "n_rows": 10,
            "n_terms": 8,
            "n_significant": 3,
            "n_negative_chi2": 1,
            "max_chi2": 25.0,
            "max_chi2_term": "female: language × genre",
            "p_column": "p_value",
        },
    )
    words = [t.get_text() for t in texts(fig)]
    assert "-132.70†" in words and "language × genre" in words and "genre" in words
    assert any(w.startswith("† Wald χ² < 0") for w in words)
    (ax,) = fig.axes
    (table,) = ax.tables
    shaded = [
        r for (r, c), cell in table.get_celld().items() if c == 0 and r > 0 and cell.get_facecolor()[:3] != (1, 1, 1)
    ]
    assert sorted(shaded) == [2, 4, 5]
    _, stats = plots.glm_table(make_glm(adjusted=True))  # adjusted p when the table has it: only 3e-5 stays
    assert stats["p_column"] == "p_adjusted" and stats["n_significant"] == 1
    check_no_data(*plots.glm_table(pd.DataFrame()))


# --- notebook 08 helpers -----------------------------------------------------------------------------


def test_quote_stats_formats_and_marks_missing_values():
    from storybias.stages.figures import quote_stats

    assert (
        quote_stats("mean {mean_vsr:.1%} over {n_models}", {"mean_vsr": 0.8125, "n_models": 3}) == "mean 81.2% over 3"
    )
    assert quote_stats("mean {mean_vsr:.1%}; {absent:.2f}", {"mean_vsr": float("nan")}) == "mean n/a; n/a"
    assert quote_stats("{stats}", {"a": 0.12345, "b": "x"}) == "a = 0.123, b = x"


def test_gallery_saves_indexes_and_flags_empty_figures(tmp_path):
    import json

    from storybias.stages import figures as plots

    gallery = plots.Gallery(tmp_path, dpi=72)
    fig, stats = plots.vsr_heatmap(
        pd.DataFrame(
            {
                "model": ["m", "m"],
                "language": ["en", "fr"],
                "design": ["bedtime", "bedtime"],
                "n_stories": [10, 10],
                "n_valid": [8, 5],
                "vsr": [0.8, 0.5],
            }
        )
    )
    record = gallery.show("01_vsr_heatmap", fig, stats, quote="Mean {mean_vsr:.1%}")
    assert record["quote"] == "Mean 65.0%" and not record["no_data"]
    empty = gallery.show("16_separability", *plots.separability(pd.DataFrame()))
    assert empty["no_data"]
    index = json.loads(gallery.write_index({"dpi": 72}).read_text())
    assert [f["stem"] for f in index["figures"]] == ["01_vsr_heatmap", "16_separability"]
    assert (tmp_path / "01_vsr_heatmap.pdf").read_bytes()[:4] == b"%PDF" and index["params"] == {"dpi": 72}


def test_stage_08_runs_like_every_stage_draws_every_figure_and_writes_its_index(tmp_path, monkeypatch, capsys):
    """Issue #59 item 3: stage 08's run() draws every registered figure from the run's artifacts (a missing
    one says "no data"), writes figures.json, and returns the StageResult notebook 08 shows and records."""
    import json

    from storybias.config import params
    from storybias.core import paths
    from storybias.core.results import StageResult

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("STORYBIAS_FIGURES", str(tmp_path / "figures"))
    p = params.load(paths.params_dir() / "smoke.yaml")
    (tmp_path / "data" / p.run_name).mkdir(parents=True)
    vsr = {"model": ["m", "m"], "language": ["en", "fr"], "design": "bedtime", "n_stories": 10, "n_valid": [8, 5]}
    pd.DataFrame(vsr).assign(vsr=[0.8, 0.5]).to_parquet(tmp_path / "data" / p.run_name / "vsr.parquet")
    result = plots.run(p)
    assert isinstance(result, StageResult) and result.stage == "figures"
    stems = [stem for stem, _ in plots.FIGURES]
    drawn = [spec.stem for spec in plots.FIGURE_SPECS if "vsr" in spec.reads]  # the run has only vsr.parquet
    assert result.values == {"n_figures": len(stems), "n_no_data": len(stems) - len(drawn), "stems": stems}
    assert result["figures"]["figure"].tolist() == stems
    assert result["figures"]["shows"].iloc[0] == (
        "Mean valid-story rate 65.0% over 1 model(s) × 2 language(s); lowest 50.0% (m / fr)."
    )
    index = json.loads((paths.figures_dir(p.run_name) / "figures.json").read_text())
    assert index == result.manifest and index["params"] == p.resolved()["figures"]
    assert all((paths.figures_dir(p.run_name) / f"{stem}.png").is_file() for stem in stems)
    assert any("probes.parquet is missing" in note for note in result.notes)
    record = result["gallery"].display("01_vsr_heatmap")
    assert record["stem"] == "01_vsr_heatmap" and capsys.readouterr().out.endswith(record["quote"] + "\n")
    with pytest.raises(KeyError, match="figure 'nope' was not drawn"):
        result["gallery"].display("nope")
    result.record()
    recorded = json.loads((tmp_path / "data" / p.run_name / "values" / "figures.json").read_text())
    assert recorded == result.values


def test_missing_artifacts_load_as_empty_tables_with_a_note(tmp_path, monkeypatch):
    from storybias.stages import figures as plots

    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    (tmp_path / "r").mkdir()
    pd.DataFrame({"model": ["m"]}).to_parquet(tmp_path / "r" / "vsr.parquet")
    art = plots.load_artifacts("r")
    assert len(art["vsr"]) == 1 and art["probes"].empty
    assert len(art.notes) == len(plots.ARTIFACT_NAMES) + len(plots.MANIFEST_NAMES) - 1 and any(
        "probes.parquet is missing" in n and "stage 'probes'" in n for n in art.notes
    )
    assert art.manifests == {name: {} for name in plots.MANIFEST_NAMES}
    assert any("manifest_probes.json is missing" in n for n in art.notes)
    assert art.manifest_table("manifest_probes", "human_validation", "validation_markers").empty
    # a manifest's table of rows, read back as a frame; a None or absent key is an empty one
    rows = [{"metric": "spearman", "estimate": 0.5}]
    (tmp_path / "r" / "manifest_probes.json").write_text(json.dumps({"human_validation": {"validation_markers": rows}}))
    (tmp_path / "r" / "manifest_associations.json").write_text(json.dumps({"human_agreement": None}))
    art = plots.load_artifacts("r")
    assert len(art.notes) == len(plots.ARTIFACT_NAMES) - 1 and art.manifests["manifest_associations"] == {
        "human_agreement": None
    }
    table = art.manifest_table("manifest_probes", "human_validation", "validation_markers")
    assert table.to_dict(orient="records") == rows
    assert art.manifest_table("manifest_associations", "human_agreement", "x").empty


CENTRED_TEXT = re.compile(r"ax\.text\(\s*0\.5,\s*0\.5,")  # a message drawn in the middle of a panel


def test_figures_live_in_one_module_per_stage_and_share_one_empty_input_guard():
    """Issue #16: the figures are grouped by the stage whose artifacts they draw, and the empty-input
    guard (the centred message panel) is written once, in plots.style, and drawn by every figure."""
    import importlib
    import inspect

    stage_modules = {
        "generation": {"01", "02"},
        "associations": {"03", "04", "05"},
        "metrics": {"06", "07", "08", "09", "10", "11", "12", "20"},
        "probes": {"13", "14", "15", "16", "19"},
        "crosslens": {"17"},
        "judges": {"18"},
        "findings": {"21"},
    }
    names = {
        "01": "vsr_heatmap",
        "02": "attribute_distributions",
        "03": "association_counts",
        "04": "top_associations_table",
        "05": "lift_share_plot",
        "06": "bias_fingerprints",
        "07": "cosine_heatmaps",
        "08": "jsd_by_grammatical_gender",
        "09": "distinctive_words",
        "10": "vsr_vs_jsd",
        "11": "balance_stereotype",
        "12": "anova_table",
        "13": "umap_density",
        "14": "probe_auc",
        "15": "cultural_relevance",
        "16": "separability",
        "17": "crosslens_heatmap",
        "18": "harm_agreement",
        "19": "self_context_advantage",
        "20": "glm_table",
        "21": "headline_findings",
    }
    assert sorted(names) == [stem[:2] for stem, _ in plots.FIGURES]
    for module_name, numbers in stage_modules.items():
        module = importlib.import_module(f"storybias.stages.figures.{module_name}")
        for number in numbers:
            function = getattr(module, names[number])
            assert getattr(plots, names[number]) is function  # still importable as plots.<name>
            # the stage's module or a split-off sibling of it (metrics_jsd.py beside metrics.py)
            home = inspect.getmodule(function)
            assert home is not None and home.__name__.split(".")[-1].startswith(module_name), home
            source = inspect.getsource(home)
            # the message panel is drawn in one place only
            assert not CENTRED_TEXT.search(source) and "no data: " not in source, home.__name__
            fig, stats = function(*[pd.DataFrame()] * _n_tables(function))
            assert stats["no_data"], names[number]
            (ax,) = fig.axes
            assert not ax.get_xticks().size and not ax.get_yticks().size
            assert [" ".join(t.get_text().split()) for t in ax.texts] == [f"no data: {stats['no_data']}"]
    style = inspect.getsource(importlib.import_module("storybias.stages.figures.style"))
    assert len(CENTRED_TEXT.findall(style)) == 2  # the two texts of message_panel, nowhere else


def _n_tables(function) -> int:
    """How many artifact tables a figure function takes before its options (its parameters without a default)."""
    import inspect

    return sum(p.default is inspect.Parameter.empty for p in inspect.signature(function).parameters.values())


def test_a_table_missing_columns_is_refused_with_its_file_name_from_the_registry():
    from storybias.stages import figures as plots

    with pytest.raises(KeyError, match=r"vsr\.parquet: missing column\(s\) n_valid"):
        plots.vsr_heatmap(
            pd.DataFrame({"design": ["d"], "model": ["m"], "language": ["en"], "vsr": [1.0], "n_stories": [1]})
        )


# --- each figure declares what it reads (issue #59 item 2) ------------------------------------------


def test_each_figure_declares_registry_artifacts_and_stage_08_reads_their_union():
    from storybias.core import artifacts

    reads = [name for spec in plots.FIGURE_SPECS for name in spec.reads]
    assert all(spec.reads and len(set(spec.reads)) == len(spec.reads) for spec in plots.FIGURE_SPECS)
    assert all(artifacts.artifact(name).stage != "figures" for name in reads)  # unknown: KeyError naming it
    assert set(plots.ARTIFACT_NAMES) | set(plots.MANIFEST_NAMES) == set(reads)
    assert not set(plots.ARTIFACT_NAMES) & set(plots.MANIFEST_NAMES)
    assert all(artifacts.artifact(name).pattern.endswith(".json") for name in plots.MANIFEST_NAMES)


def test_stage_08s_make_prerequisites_cover_exactly_what_the_figures_read():
    """core.artifacts' STAGES (``reads``, from which the Makefile's prerequisites are generated) lists for
    stage 08 only Make targets a figure reads from, and every table a figure reads is one of them or is
    built before one of them (Make reruns the figures when it changes)."""
    from storybias.core import artifacts
    from storybias.stages.crosslens.registry import upstream

    declared = {artifacts.MAKE_TARGETS[artifacts.artifact(n).stage][0] for n in plots.FIGURE_READS}
    prerequisites = set(artifacts.STAGE_BY_TOKEN["figures"].reads)
    assert prerequisites <= declared
    assert declared <= prerequisites | set().union(*(upstream(t) for t in prerequisites))


def test_a_figure_is_given_only_what_it_declares(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    (tmp_path / "r").mkdir()
    art = plots.load_artifacts("r")
    spec = next(s for s in plots.FIGURE_SPECS if s.stem == "19_self_context_advantage")
    mine = art.only(spec.reads)
    assert set(mine) == {"cultural_advantage"} and set(mine.manifests) == {"manifest_probes"}
    assert mine.notes == art.notes
    with pytest.raises(KeyError, match="artifact 'probes' was not read: add it to the figure's reads"):
        mine["probes"]
    with pytest.raises(KeyError, match="manifest 'manifest_associations' was not read"):
        mine.manifest_table("manifest_associations", "human_agreement")


def test_the_figures_readme_and_notebook_08_list_the_registry():
    from storybias.core.paths import repo_root
    from storybias.stages.figures.registry import figure_list

    readme = (repo_root() / "figures" / "README.md").read_text()
    assert figure_list() in readme, "figures/README.md's table differs from the registry: paste figure_list()"
    notebook = json.loads((repo_root() / "notebooks" / "08_figures.ipynb").read_text())
    shown = [
        m
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
        for m in re.findall(r'gallery\.display\("(\w+)"\)', "".join(cell["source"]))
    ]
    assert shown == [stem for stem, _ in plots.FIGURES]
