"""The story explorer (storybias.stages.explorer: its page and its data): payload counts, the
prompt key and the per-cell sample, safe embedding of hostile story text, missing artifacts, the CLI, and
the page itself (its list, associations and compare view) driven in headless Chromium through Selenium.

The browser test needs Debian's chromium and chromium-driver (scripts/install-browser.sh); without
them it fails, naming the install command, instead of skipping. Those tests carry the `browser`
marker, so `make test-fast` (-m "not slow and not browser") deselects them where there
is no Chromium, while `make test` installs it and runs them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from storybias import cli
from storybias.config.params import load
from storybias.config.prompts import LANGUAGES
from storybias.core import paths
from storybias.stages.explorer import data as explorer_data
from storybias.stages.explorer import page as explorer

HOSTILE = '</script><img src=x onerror="window.__xss=1"><!--<script>alert(1)</script>'
HOSTILE_ID = "st-m1-en-stereotales_gender=woman_s0-0"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DEMO_DIMS = ("gender", "age", "professional_field")
A_NURSE = "gender|woman|professional_field|healthcare"
A_ENGINEER_FR = "gender|man|professional_field|trades_manual"  # scope fr, m1
A_ENGINEER_ALL = "gender|man|professional_field|trades_manual"  # scope all, m2


def _story(design, model, language, prompt_id, sample, text, **cond):
    sid = f"{design[:2]}-{model}-{language}-{prompt_id.replace('/', '_')}-{sample}"
    return {
        "story_id": sid,
        "design": design,
        "language": language,
        "model": model,
        "prompt_id": prompt_id,
        "sample": sample,
        "prompt": f"Write a story ({prompt_id}, {language}).",
        "text": text,
        "finish_reason": "stop",
        "is_valid": True,
        "invalid_reason": None,
        **cond,
    }


def synthetic_run() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """30 stories (en 16, fr 14): stereotales 2 models x 2 languages x 6, bedtime m1 x en/fr x 2,
    occupations m2 x en x 2. Association examples: nurse 7 (8 minus one unparsed), engineer-fr 3,
    engineer-all 6."""
    rows, ext = [], []
    for model in ("m1", "m2"):
        for language in ("en", "fr"):
            for i in range(6):
                woman = i < 3
                value = "woman" if woman else "man"
                text = f"A story about a {value} ({model}, {language}, {i})."
                if model == "m1" and language == "en" and i == 0:
                    text = HOSTILE + " " + text
                if model == "m2" and language == "fr" and i == 5:
                    text = "Once upon a time. " * 80  # long: collapsed on the page
                row = _story(
                    "stereotales",
                    model,
                    language,
                    f"stereotales/gender={value}/s{i}",
                    0,
                    text,
                    cond_attribute="gender",
                    cond_value=value,
                    cond_scenario_category="work",
                    cond_scenario=f"s{i}",
                )
                rows.append(row)
                field = ("healthcare" if i < 2 else "trades_manual") if woman else "trades_manual"
                ext.append(
                    {
                        "story_id": row["story_id"],
                        "parse_ok": not (model == "m1" and language == "en" and i == 1),
                        "demo_gender": value,
                        "demo_age": "adult" if i % 2 else "unknown",
                        "demo_professional_field": field,
                        "protagonist_gender": "female" if woman else "male",
                        "protagonist_name": HOSTILE if row["text"].startswith(HOSTILE) else f"Name{i}",
                        "adjectives_en": ["kind", "<b>bold</b>"],
                        "settings": ["city"],
                        "story_cut": False,
                        "markers": [{"text": "Paris", "text_en": "Paris", "keep": True, "category": "toponyms"}],
                        "extractors": ["fake"],
                        "raw": "{}",
                    }
                )
    for language in ("en", "fr"):
        for i, (nat, gender) in enumerate((("egyptian", "boy"), ("french", "girl"))):
            row = _story(
                "bedtime",
                "m1",
                language,
                f"bedtime/mother/{nat}/muslim/working_class/{gender}",
                0,
                f"Bedtime {nat} {gender}.",
                cond_nationality=nat,
                cond_religion="muslim",
                cond_social_class="working_class",
                cond_parent_role="mother",
                cond_child_gender=gender,
            )
            if language == "fr" and i == 1:
                row.update(is_valid=False, invalid_reason="truncated", finish_reason="length")
            rows.append(row)
    for i in range(2):
        rows.append(
            _story(
                "occupations",
                "m2",
                "en",
                f"occupations/nurse/{'story' if i else 'news'}",
                0,
                f"Occupation story {i}.",
                cond_occupation="nurse",
                cond_task="story" if i else "news",
                cond_occupation_gender="female",
            )
        )
    stories = pd.DataFrame(rows)
    extractions = pd.DataFrame(ext)
    shared = pd.DataFrame(
        [
            {
                "scope": "all",
                "base_attribute": "gender",
                "base_value": "woman",
                "compared_attribute": "professional_field",
                "compared_value": "healthcare",
                "association_id": A_NURSE,
                "n_models": 2,
                "models": ["m1", "m2"],
                "mean_fraction": 0.66,
                "mean_lift": 2.5,
                "median_harm": 4.0,
                "n_ratings": 3,
                "share_realistic": 0.5,
                "harmful": True,
            },
            {
                "scope": "fr",
                "base_attribute": "gender",
                "base_value": "man",
                "compared_attribute": "professional_field",
                "compared_value": "trades_manual",
                "association_id": A_ENGINEER_FR,
                "n_models": 1,
                "models": ["m1"],
                "mean_fraction": 1.0,
                "mean_lift": 3.1,
                "median_harm": np.nan,
                "n_ratings": 0,
                "share_realistic": np.nan,
                "harmful": False,
            },
            {
                "scope": "all",
                "base_attribute": "gender",
                "base_value": "man",
                "compared_attribute": "professional_field",
                "compared_value": "trades_manual",
                "association_id": A_ENGINEER_ALL,
                "n_models": 1,
                "models": ["m2"],
                "mean_fraction": 1.0,
                "mean_lift": 2.0,
                "median_harm": 2.0,
                "n_ratings": 3,
                "share_realistic": 1.0,
                "harmful": False,
            },
        ]
    )
    values = pd.DataFrame(
        [
            {
                "model": m,
                "scope": "all",
                "base_attribute": "gender",
                "base_value": "woman",
                "compared_attribute": "professional_field",
                "compared_value": "healthcare",
                "count": 4,
                "row_total": 6,
                "fraction": 4 / 6,
                "expected": 1.6,
                "lift": 2.5,
                "p_value": 0.01,
                "p_adjusted": 0.03,
                "significant": True,
            }
            for m in ("m1", "m2")
        ]
    )
    return stories, extractions, shared, values


EXPECTED_EXAMPLES = [7, 3, 6]  # per row of `shared`


@pytest.fixture()
def frames():
    return synthetic_run()


# --------------------------------------------------------------------------------------------------
# payload
# --------------------------------------------------------------------------------------------------
def test_payload_counts(frames):
    stories, extractions, shared, values = frames
    payload = explorer.explorer_payload(stories, extractions, shared, values, run_name="syn")
    assert payload["n_total"] == payload["n_embedded"] == len(payload["stories"]) == 30
    by_lang = pd.Series([s["language"] for s in payload["stories"]]).value_counts().to_dict()
    assert by_lang == {"en": 16, "fr": 14}
    cells = {(c["design"], c["model"], c["language"]): c for c in payload["cells"]}
    assert len(cells) == 7
    assert cells[("stereotales", "m1", "en")] | {} == {
        "design": "stereotales",
        "model": "m1",
        "language": "en",
        "n_stories": 6,
        "n_valid": 6,
        "n_extracted": 6,
        "n_parsed": 5,
        "n_embedded": 6,
    }
    assert cells[("bedtime", "m1", "fr")]["n_valid"] == 1 and cells[("bedtime", "m1", "fr")]["n_extracted"] == 0
    assert [a["n_examples"] for a in payload["associations"]] == EXPECTED_EXAMPLES
    assert [a["id"] for a in payload["associations"]] == [A_NURSE, A_ENGINEER_FR, A_ENGINEER_ALL]
    nurse = payload["associations"][0]
    assert [r["model"] for r in nurse["per_model"]] == ["m1", "m2"] and nurse["per_model"][0]["lift"] == 2.5
    assert payload["associations"][1]["median_harm"] is None and payload["associations"][1]["per_model"] == []
    by_id = {s["id"]: s for s in payload["stories"]}
    st = by_id["st-m1-en-stereotales_gender=woman_s0-0"]
    assert st["cond"] == {"attribute": "gender", "value": "woman", "scenario_category": "work", "scenario": "s0"}
    assert st["facets"][0] == ["stereotales:gender", "woman"]
    assert st["x"]["demo"] == {"gender": "woman", "professional_field": "healthcare"}  # 'unknown' dropped
    bedtime = [s for s in payload["stories"] if s["design"] == "bedtime"]
    assert all(s["x"] is None for s in bedtime)
    assert ["bedtime:nationality", "egyptian"] in bedtime[0]["facets"]
    json.dumps(payload, allow_nan=False)  # plain JSON: no NaN, no numpy types


def test_sample_caps_cells_and_keeps_association_examples_first(frames):
    stories, extractions, shared, values = frames
    payload = explorer.explorer_payload(stories, extractions, shared, values, max_stories_per_cell=2)
    assert payload["n_total"] == 30
    cells = {(c["design"], c["model"], c["language"]): c["n_embedded"] for c in payload["cells"]}
    assert cells == {("stereotales", m, lang): 2 for m in ("m1", "m2") for lang in ("en", "fr")} | {
        ("bedtime", "m1", "en"): 2,
        ("bedtime", "m1", "fr"): 2,
        ("occupations", "m2", "en"): 2,
    }
    assert payload["n_embedded"] == 14
    examples = explorer_data.association_examples(stories, extractions, shared)
    example_ids = set(examples["story_id"])
    embedded_st = [s["id"] for s in payload["stories"] if s["design"] == "stereotales"]
    # examples first: m1 en has a single example (its other nurse story did not parse), the others >= 2
    assert (
        sorted(s[:8] for s in embedded_st if s in example_ids)
        == ["st-m1-en"] + ["st-m1-fr"] * 2 + ["st-m2-en"] * 2 + ["st-m2-fr"] * 2
    )
    # m1 fr: round robin, one example of the nurse association and one of engineer-fr (not two nurses)
    assoc_of = examples.groupby("story_id")["assoc"].apply(set)
    for cell, both in (("st-m1-fr", {0, 1}), ("st-m2-en", {0, 2}), ("st-m2-fr", {0, 2})):
        assert set().union(*(assoc_of[s] for s in embedded_st if s.startswith(cell))) == both
    # the run-wide counts do not shrink with the sample
    assert [a["n_examples"] for a in payload["associations"]] == EXPECTED_EXAMPLES
    assert explorer_data.sample_story_ids(stories, examples, None) == stories["story_id"].tolist()
    assert explorer_data.sample_story_ids(stories, examples, 0) == []


def _grid(prompts: int = 3, samples: int = 2) -> pd.DataFrame:
    """Stereotales stories of m1 and m2 in en and fr: every prompt x sample in each of the four cells."""
    return pd.DataFrame(
        [
            _story(
                "stereotales",
                model,
                language,
                f"stereotales/gender=woman/s{p}",
                k,
                f"{model} {language} s{p} {k}",
                cond_attribute="gender",
                cond_value="woman",
                cond_scenario=f"s{p}",
            )
            for model in ("m1", "m2")
            for language in ("en", "fr")
            for p in range(prompts)
            for k in range(samples)
        ]
    )


def test_prompt_key_groups_a_prompt_across_models_and_languages():
    """The compare view groups stories by prompt_key: the same prompt_id (the language-independent
    grid cell) of the same design, whatever the model, language and sample."""
    stories = _grid()
    # another design's prompt with the same prompt_id string is another prompt
    stories = pd.concat([stories, pd.DataFrame([_story("bedtime", "m1", "en", "stereotales/gender=woman/s0", 0, "x")])])
    payload = explorer.explorer_payload(stories, None, None)
    groups: dict[str, list[tuple[str, str, int]]] = {}
    for story in payload["stories"]:
        groups.setdefault(story["prompt_key"], []).append((story["model"], story["language"], story["sample"]))
    every_side = [(m, lang, k) for m in ("m1", "m2") for lang in ("en", "fr") for k in (0, 1)]
    assert sorted(groups) == ["bedtime|stereotales/gender=woman/s0"] + [
        f"stereotales|stereotales/gender=woman/s{p}" for p in range(3)
    ]
    assert all(sorted(groups[f"stereotales|stereotales/gender=woman/s{p}"]) == every_side for p in range(3))
    assert groups["bedtime|stereotales/gender=woman/s0"] == [("m1", "en", 0)]
    assert (
        explorer_data.prompt_key("occupations", "occupations/nurse/explicit")
        == "occupations|occupations/nurse/explicit"
    )
    assert explorer_data.prompt_key("stereotales", None) is None and explorer_data.prompt_key("bedtime", pd.NA) is None
    assert (
        explorer.explorer_payload(stories.drop(columns=["prompt_id"]), None, None)["stories"][0]["prompt_key"] is None
    )


def test_sample_embeds_the_same_prompts_in_every_cell():
    """Under the per-cell cap every model x language embeds the same prompts (sample 0 of each first),
    so that the compare view finds both sides of a prompt; the choice ignores the frame's row order."""
    stories = _grid(prompts=10, samples=3)
    none = explorer_data.association_examples(stories, None, None)

    def picked(frame: pd.DataFrame, cap: int) -> pd.Series:
        keep = explorer_data.sample_story_ids(frame, none, cap)
        chosen = frame[frame["story_id"].isin(keep)]
        return chosen.groupby(["model", "language"]).apply(
            lambda g: frozenset(zip(g["prompt_id"], g["sample"], strict=True)), include_groups=False
        )

    four = picked(stories, 4)
    assert len(four) == 4 and len(set(four)) == 1  # the same four prompts in each cell
    assert len({p for p, _ in four.iloc[0]}) == 4 and {k for _, k in four.iloc[0]} == {0}
    twelve = picked(stories, 12)
    assert len(set(twelve)) == 1 and sorted(k for _, k in twelve.iloc[0]) == [0] * 10 + [1] * 2
    assert picked(stories.sample(frac=1, random_state=0), 4).equals(four)
    # a cell that lacks a prompt embeds the next one; the others keep theirs
    dropped = sorted(four.iloc[0])[0][0]
    gap = stories[~((stories["model"] == "m2") & (stories["language"] == "fr") & (stories["prompt_id"] == dropped))]
    with_gap = picked(gap, 4)
    assert with_gap.drop(("m2", "fr")).map(lambda c: c == four.iloc[0]).all()
    assert len(with_gap[("m2", "fr")] & four.iloc[0]) == 3


def test_hostile_text_is_escaped(frames):
    stories, extractions, shared, values = frames
    stories.loc[0, "prompt"] = HOSTILE
    stories.loc[0, "model"] = "m1"  # model names are data too
    page = explorer.render_html(explorer.explorer_payload(stories, extractions, shared, values, run_name="<run>&"))
    assert "<img" not in page and "<!--" not in page
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "document.write" not in page
    assert "<title>storybias explorer: &lt;run&gt;&amp;</title>" in page
    # exactly the page's two script elements; the data one round-trips to the original text
    assert page.count("</script>") == 2 and page.count("<script") == 2
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S)
    hostile = {s["id"]: s for s in json.loads(match.group(1))["stories"]}[HOSTILE_ID]
    assert hostile["text"].startswith(HOSTILE) and hostile["prompt"] == HOSTILE and hostile["x"]["name"] == HOSTILE
    assert "<" not in match.group(1) and ">" not in match.group(1) and "&" not in match.group(1)
    # no network: a CSP that allows the page's own script only, and no external reference
    assert "Content-Security-Policy" in page and "script-src 'sha256-" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)


SCRIPT_BREAKOUT = "</script><script>alert(1)</script>"


def test_compare_view_is_on_the_page_and_story_text_stays_escaped(frames):
    """The page has the compare view's elements and each story its prompt key; a story that tries to
    close the data element stays inside it, and the CSP's hash is still the script's."""
    import base64
    import hashlib

    stories, extractions, shared, values = frames
    target = stories.loc[1, "story_id"]
    stories.loc[1, "text"] = SCRIPT_BREAKOUT + " Then the story."
    page = explorer.render_html(explorer.explorer_payload(stories, extractions, shared, values, run_name="syn"))
    for element in (
        '<section id="compare-section">',
        '<select id="c-prompt">',
        '<select id="c-left">',
        '<select id="c-right">',
        '<div id="compare-cols" hidden>',
        'id="compare-note"',
    ):
        assert element in page, element
    assert SCRIPT_BREAKOUT not in page and page.count("<script") == 2 and page.count("</script>") == 2
    data_text = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S).group(1)
    data = json.loads(data_text)
    assert {s["id"]: s for s in data["stories"]}[target]["text"].startswith(SCRIPT_BREAKOUT)
    assert all(s["prompt_key"] == f"{s['design']}|{s['prompt_id']}" for s in data["stories"])
    script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    assert "openCompare" in script and "innerHTML" not in script
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    assert f"script-src 'sha256-{digest}';" in page


def test_missing_artifacts(frames):
    stories, _, _, _ = frames
    payload = explorer.explorer_payload(stories.drop(columns=["is_valid"]), None, None)
    assert payload["associations"] is None and payload["has_extractions"] is False
    assert all(s["x"] is None and s["valid"] is None for s in payload["stories"])
    page = explorer.render_html(payload)
    assert "associations_shared.parquet is not in the" in page and "not extracted" in page
    assert explorer_data.association_examples(stories, None, None).empty
    empty = explorer.explorer_payload(stories, None, frames[2].iloc[:0])
    assert empty["associations"] == []


def _rename_models(frames, names: dict[str, str]):
    """The synthetic run with its models renamed (``{"m1": "hasOwnProperty", ...}``)."""
    stories, ext, shared, values = frames
    stories = stories.assign(model=stories["model"].replace(names))
    shared = shared.assign(models=shared["models"].map(lambda ms: [names.get(m, m) for m in ms]))
    values = values.assign(model=values["model"].replace(names))
    return stories, ext, shared, values


def _write_run(
    tmp_path: Path,
    monkeypatch,
    *,
    associations: bool = True,
    extractions: bool = True,
    models: dict[str, str] | None = None,
):
    stories, ext, shared, values = _rename_models(synthetic_run(), models or {})
    data = tmp_path / "data"
    run = data / "explorer-test"
    run.mkdir(parents=True)
    stories.to_parquet(run / "filtered.parquet")
    if extractions:
        ext.to_parquet(run / "extractions.parquet")
    if associations:
        shared.to_parquet(run / "associations_shared.parquet")
        values.to_parquet(run / "associations_values.parquet")
    profile = tmp_path / "explorer-test.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "generation": {"models": [{"name": (models or {}).get("m1", "m1"), "source": "embedded"}]},
                "designs": {"stereotales": {"languages": ["en", "fr"]}},
            }
        )
    )
    monkeypatch.setenv("STORYBIAS_DATA", str(data))
    monkeypatch.setattr(paths, "figures_dir", lambda run_name: tmp_path / "figures" / run_name)
    return profile


def test_build_explorer_and_cli(tmp_path, monkeypatch, capsys):
    profile = _write_run(tmp_path, monkeypatch)
    out = explorer.build_explorer(load(profile))
    assert out == tmp_path / "figures" / "explorer-test" / "explorer.html"
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', out.read_text(), re.S).group(1))
    assert data["n_total"] == data["n_embedded"] == 30 and data["max_per_cell"] == 200
    assert [a["n_examples"] for a in data["associations"]] == EXPECTED_EXAMPLES and data["notes"] == []
    assert not list(out.parent.glob(".*.tmp"))  # atomic write left nothing behind

    assert cli.main(["explorer", str(profile), "--max-stories", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', out.read_text(), re.S).group(1))
    assert data["n_total"] == 30 and data["n_embedded"] == 7 and data["max_per_cell"] == 1
    assert [a["n_examples"] for a in data["associations"]] == EXPECTED_EXAMPLES
    assert {s["language"] for s in data["stories"]} == {"en", "fr"}


def test_build_explorer_without_stage_03_and_04(tmp_path, monkeypatch):
    profile = _write_run(tmp_path, monkeypatch, associations=False, extractions=False)
    out = explorer.build_explorer(load(profile))
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', out.read_text(), re.S).group(1))
    assert data["associations"] is None and all(s["x"] is None for s in data["stories"])
    assert any("extractions.parquet is missing" in n for n in data["notes"])
    assert any("associations_shared.parquet is missing" in n for n in data["notes"])
    (tmp_path / "data" / "explorer-test" / "filtered.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="filtered.parquet"):
        explorer.build_explorer(load(profile))


# --------------------------------------------------------------------------------------------------
# the page in a real browser
# --------------------------------------------------------------------------------------------------
def _missing_browser() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return None
    return (
        f"{', '.join(missing)} not found: the explorer's browser test needs Debian's Chromium; "
        "install it with `apt-get install chromium chromium-driver` (scripts/install-browser.sh)"
    )


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, or None when it is not installed: the test then fails (not skips) in its body."""
    if _missing_browser():
        yield None
        return
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile_dir = tempfile.mkdtemp(prefix="storybias-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={profile_dir}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager never runs, so nothing is downloaded.
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)


def _visible_stories(driver) -> int:
    return sum(1 for e in driver.find_elements("css selector", "#stories article.story") if e.is_displayed())


def _count(driver) -> str:
    return driver.find_element("id", "story-count").text


def _assoc_order(driver) -> list[str]:
    rows = driver.find_elements("css selector", "#assoc-body tr")
    return [f"{r.get_attribute('data-scope')}:{r.get_attribute('data-association-id')}" for r in rows]


@pytest.mark.browser
def test_page_in_browser(browser, tmp_path):
    if browser is None:
        pytest.fail(_missing_browser())
    from selenium.webdriver.support.ui import Select

    stories, extractions, shared, values = synthetic_run()
    page = tmp_path / "explorer.html"
    page.write_text(
        explorer.render_html(explorer.explorer_payload(stories, extractions, shared, values, run_name="syn")),
        encoding="utf-8",
    )
    browser.get(page.as_uri())
    assert browser.find_element("tag name", "body").get_attribute("data-ready") == "1"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # no script error, no CSP violation, no blocked resource

    # everything shown at first
    assert _visible_stories(browser) == 30
    assert _count(browser) == "30 of 30 stories shown"
    # hostile text stays text: no <img> was created, its handler never ran, the words are on the page
    assert browser.find_elements("css selector", "#stories img") == []
    assert browser.execute_script("return window.__xss === undefined")
    card = browser.find_element("css selector", f"article.story[data-story-id='{HOSTILE_ID}']")
    assert card.find_element("css selector", ".story-text").text.startswith("</script><img src=x onerror=")
    assert HOSTILE in card.text  # the protagonist's name

    # one language
    Select(browser.find_element("id", "f-language")).select_by_value("fr")
    assert _count(browser) == "14 of 30 stories shown"
    assert _visible_stories(browser) == 14
    # ... and a condition: stories prompted with gender = woman (stereotales, fr: 2 models x 3)
    Select(browser.find_element("id", "f-cond")).select_by_value("stereotales:gender")
    Select(browser.find_element("id", "f-value")).select_by_value("woman")
    assert _count(browser) == "6 of 30 stories shown" and _visible_stories(browser) == 6
    # validity: the truncated bedtime story
    browser.find_element("id", "f-reset").click()
    Select(browser.find_element("id", "f-validity")).select_by_value("invalid")
    assert _count(browser) == "1 of 30 stories shown"
    assert "not extracted" in browser.find_element("css selector", "#stories article.story").text

    # associations: default order = models sharing, then lift; clicking "mean lift" sorts by lift
    assert _assoc_order(browser) == [f"all:{A_NURSE}", f"fr:{A_ENGINEER_FR}", f"all:{A_ENGINEER_ALL}"]
    lift = browser.find_element("css selector", "#assoc-table button.sort[data-sort='mean_lift']")
    lift.click()
    assert _assoc_order(browser) == [f"fr:{A_ENGINEER_FR}", f"all:{A_NURSE}", f"all:{A_ENGINEER_ALL}"]
    assert lift.find_element("xpath", "..").get_attribute("aria-sort") == "descending"
    lift.click()
    assert _assoc_order(browser) == [f"all:{A_ENGINEER_ALL}", f"all:{A_NURSE}", f"fr:{A_ENGINEER_FR}"]
    browser.find_element("css selector", "#assoc-table button.sort[data-sort='median_harm']").click()
    assert _assoc_order(browser) == [f"all:{A_NURSE}", f"all:{A_ENGINEER_ALL}", f"fr:{A_ENGINEER_FR}"]  # unrated last

    # clicking an association lists its example stories (and clears the other filters)
    nurse = browser.find_element("css selector", f"#assoc-body tr[data-scope='all'][data-association-id='{A_NURSE}']")
    button = nurse.find_element("css selector", "button.assoc-show")
    assert button.text == "7 stories"
    button.click()
    assert _count(browser) == "7 of 30 stories shown" and _visible_stories(browser) == 7
    assert Select(browser.find_element("id", "f-validity")).first_selected_option.get_attribute("value") == ""
    assert browser.find_element("id", "assoc-filter").is_displayed()
    shown = browser.find_elements("css selector", "#stories article.story")
    assert all("healthcare" in card.text for card in shown)
    engineer_fr = browser.find_element("css selector", "#assoc-body tr[data-scope='fr'] button.assoc-show")
    engineer_fr.click()
    assert _count(browser) == "3 of 30 stories shown"
    browser.find_element("id", "assoc-clear").click()
    assert _count(browser) == "30 of 30 stories shown"

    # a long story is collapsed and expands on click
    Select(browser.find_element("id", "f-language")).select_by_value("fr")
    browser.find_element("id", "f-search").send_keys("once upon")
    assert _count(browser) == "1 of 30 stories shown"
    card = browser.find_element("css selector", "#stories article.story")
    text = card.find_element("css selector", ".story-text")
    assert len(text.get_attribute("textContent")) == 601
    card.find_element("css selector", "button.toggle").click()
    assert text.get_attribute("textContent") == "Once upon a time. " * 80


@pytest.mark.browser
def test_page_without_associations_in_browser(browser, tmp_path):
    if browser is None:
        pytest.fail(_missing_browser())
    stories, _, _, _ = synthetic_run()
    page = tmp_path / "explorer.html"
    payload = explorer.explorer_payload(stories, None, None, run_name="bare", max_stories_per_cell=1)
    page.write_text(explorer.render_html(payload), encoding="utf-8")
    browser.get(page.as_uri())
    assert browser.find_element("tag name", "body").get_attribute("data-ready") == "1"
    assert "associations_shared.parquet is not in the" in browser.find_element("id", "assoc-note").text
    assert not browser.find_element("id", "assoc-table").is_displayed()
    assert _count(browser) == "7 of 7 stories shown" and _visible_stories(browser) == 7
    assert (
        "This page shows a sample: 7 of 30 stories, at most 1 per design"
        in browser.find_element("id", "sample-note").text
    )
    assert all("not extracted" in c.text for c in browser.find_elements("css selector", "#stories article.story"))


def _compare_columns(driver) -> list[tuple[str, str, str, list[str]]]:
    """(side, model, language, story ids) of each compare column."""
    return [
        (
            c.get_attribute("data-side"),
            c.get_attribute("data-model"),
            c.get_attribute("data-language"),
            [a.get_attribute("data-story-id") for a in c.find_elements("css selector", "article.story")],
        )
        for c in driver.find_elements("css selector", "#compare-cols .compare-col")
        if c.is_displayed()
    ]


def _st(model: str, language: str, i: int) -> str:
    value = "woman" if i < 3 else "man"
    return f"st-{model}-{language}-stereotales_gender={value}_s{i}-0"


@pytest.mark.browser
def test_compare_view_in_browser(browser, tmp_path):
    """ "compare" on a story shows its prompt in two columns: the story's model and language on the
    left, the next model on the right (the next language when the design has one model); a side
    without the story says why, never a blank column."""
    if browser is None:
        pytest.fail(_missing_browser())
    from selenium.webdriver.support.ui import Select

    stories, extractions, shared, values = synthetic_run()
    run = stories[stories["story_id"] != _st("m1", "fr", 0)]  # not in the run
    page_stories = run[run["story_id"] != _st("m2", "en", 0)]  # in the run, not on the page
    payload = explorer.explorer_payload(page_stories, extractions, shared, values, run_name="syn", population=run)
    payload["max_per_cell"] = 5  # as build_explorer sets it
    page = tmp_path / "explorer.html"
    page.write_text(explorer.render_html(payload), encoding="utf-8")
    browser.get(page.as_uri())
    assert browser.find_element("tag name", "body").get_attribute("data-ready") == "1"
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert _compare_columns(browser) == [] and not browser.find_element("id", "compare-cols").is_displayed()

    card = browser.find_element("css selector", f"#stories article.story[data-story-id='{HOSTILE_ID}']")
    card.find_element("css selector", "button.compare").click()
    assert _compare_columns(browser) == [("left", "m1", "en", [HOSTILE_ID]), ("right", "m2", "en", [])]
    prompt = Select(browser.find_element("id", "c-prompt")).first_selected_option
    assert prompt.get_attribute("value") == "stereotales|stereotales/gender=woman/s0"
    left, right = browser.find_elements("css selector", "#compare-cols .compare-col")
    assert left.find_element("css selector", ".prompt-text").text == "Write a story (stereotales/gender=woman/s0, en)."
    assert left.find_element("css selector", ".story-text").text.startswith("</script><img src=x onerror=")
    assert browser.execute_script("return window.__xss === undefined")
    assert left.find_element("css selector", "article.story .badge.valid").text == "valid"  # as in the list
    assert "professional_field\nhealthcare" in left.find_element("css selector", ".extraction").text
    assert right.find_element("css selector", ".compare-missing").text == (
        "no story of m2 in en (English) for this prompt in this page (the page embeds at most 5 per cell)"
    )

    right_side = Select(browser.find_element("id", "c-right"))
    right_side.select_by_visible_text(f"m1 \u00b7 fr ({LANGUAGES['fr']})")
    assert _compare_columns(browser)[1] == ("right", "m1", "fr", [])
    missing = browser.find_element("css selector", "#compare-cols [data-side='right'] .compare-missing")
    assert missing.text == "no story of m1 in fr (French) for this prompt in this run"
    right_side.select_by_visible_text(f"m2 \u00b7 fr ({LANGUAGES['fr']})")
    assert _compare_columns(browser)[1] == ("right", "m2", "fr", [_st("m2", "fr", 0)])
    right = browser.find_element("css selector", "#compare-cols [data-side='right']")
    assert right.find_element("css selector", ".prompt-text").text == "Write a story (stereotales/gender=woman/s0, fr)."
    # another prompt keeps the sides
    Select(browser.find_element("id", "c-prompt")).select_by_value("stereotales|stereotales/gender=man/s4")
    assert _compare_columns(browser) == [
        ("left", "m1", "en", [_st("m1", "en", 4)]),
        ("right", "m2", "fr", [_st("m2", "fr", 4)]),
    ]
    # bedtime has one model: the right side is the next language
    bedtime = "be-m1-en-bedtime_mother_egyptian_muslim_working_class_boy-0"
    browser.find_element("css selector", f"#stories article.story[data-story-id='{bedtime}'] button.compare").click()
    assert _compare_columns(browser) == [
        ("left", "m1", "en", [bedtime]),
        ("right", "m1", "fr", [bedtime.replace("-en-", "-fr-")]),
    ]
    browser.find_element("id", "c-clear").click()
    assert _compare_columns(browser) == []
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.browser
def test_install_script_is_idempotent():
    """With both binaries present the script only reports their versions (no apt call)."""
    if _missing_browser():
        pytest.fail(_missing_browser())
    script = paths.repo_root() / "scripts" / "install-browser.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "apt-get" not in proc.stdout and "Chromium" in proc.stdout


@pytest.mark.browser
@pytest.mark.parametrize(
    "names", [{"m1": "hasOwnProperty", "m2": "constructor"}, {"m1": "toString", "m2": "__proto__"}]
)
def test_models_named_like_javascript_builtins_render(browser, tmp_path, monkeypatch, names):
    """A model called hasOwnProperty passes check-params; the page must still render and filter by it
    (the script once kept seen values in a plain object and called seen.hasOwnProperty(v))."""
    if browser is None:
        pytest.fail(_missing_browser())
    from selenium.webdriver.support.ui import Select

    profile = _write_run(tmp_path, monkeypatch, models=names)
    assert load(profile).generation.models[0].name == names["m1"]  # a valid profile
    page = explorer.build_explorer(load(profile))
    browser.get(page.as_uri())
    assert browser.find_element("tag name", "body").get_attribute("data-ready") == "1"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    assert _count(browser) == "30 of 30 stories shown"
    options = [o.get_attribute("value") for o in Select(browser.find_element("id", "f-model")).options]
    assert options == ["", *sorted(names.values())]  # each model once (a "__proto__" key is not dropped)
    Select(browser.find_element("id", "f-model")).select_by_value(names["m1"])
    assert _count(browser) == "16 of 30 stories shown"  # m1: 12 stereotales + 4 bedtime
    Select(browser.find_element("id", "f-model")).select_by_value(names["m2"])
    assert _count(browser) == "14 of 30 stories shown"
    button = browser.find_element(
        "css selector", f"#assoc-body tr[data-scope='all'][data-association-id='{A_NURSE}'] button.assoc-show"
    )
    assert button.text == "7 stories"
    button.click()
    assert _count(browser) == "7 of 30 stories shown"


def test_payload_marks_associations_published_by_stereotales(frames, tmp_path):
    from storybias.evidence.released_associations import load_associations
    from storybias.stages.associations.comparison import PooledScope, compare_published

    stories, extractions, shared, values = frames
    shared = shared.replace({"healthcare": "healthcare_medicine", "trades_manual": "trades_manual_labor"})
    values = values.replace({"healthcare": "healthcare_medicine"})
    record = {
        "question_id": "q1",
        "base_attribute": {"name": "gender", "value": "woman"},
        "compared_attribute": {"name": "professional_field", "value": "healthcare and medicine"},
        "avg_percentage": 60.0,
        "avg_lift": 2.2,
        "metadata": {"model_list": ["azure_ai/gpt-4o"]},
    }
    path = tmp_path / "questions.json"
    path.write_text(json.dumps([record]), encoding="utf-8")
    pairs = values.groupby(["model", "scope", "base_attribute", "compared_attribute"])
    attributes = pairs.agg(rows=("base_value", "unique"), cols=("compared_value", "unique")).reset_index()
    attributes = attributes.assign(
        retained=True,
        effect_size="large",
        p_adjusted=0.001,
        table=[json.dumps({"rows": list(r), "cols": list(c)}) for r, c in zip(attributes["rows"], attributes["cols"])],
    )
    # what stage 04 writes
    comparison = compare_published(load_associations(path), attributes, values, PooledScope(True, ""))
    payload = explorer.explorer_payload(stories, extractions, shared, values, run_name="syn", published=comparison)
    assert [a["published"] for a in payload["associations"]] == [True, None, False]  # the fr row is not pooled
    assert payload["published"] == {"mode": "any_model", "tested": 1, "reproduced": 1, "not_published": 0}
    assert "published by StereoTales" in explorer.render_html(payload)
    plain = explorer.explorer_payload(stories, extractions, shared, values, run_name="syn")
    assert plain["published"] is None and all(a["published"] is None for a in plain["associations"])


def test_page_parts_are_package_files_and_the_csp_is_unchanged(frames):
    """Issue #16: the page's HTML, CSS and JavaScript are package files (read with importlib.resources,
    shipped as package data), and the content-security policy is the one the inline page had: only
    the script whose sha256 is listed may run, nothing may be fetched."""
    import base64
    import fnmatch
    import hashlib
    import tomllib
    from importlib import resources

    folder = resources.files("storybias.stages.explorer") / "assets"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["explorer.js", "page.html", "style.css"]
    globs = tomllib.loads((paths.repo_root() / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for name in names:
        assert any(fnmatch.fnmatch(f"stages/explorer/assets/{name}", g) for g in globs["storybias"]), name
    script = (folder / "explorer.js").read_text(encoding="utf-8")
    page = explorer.render_html(explorer.explorer_payload(*frames, run_name="syn"))
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert csp == (
        f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
        "img-src 'none'; connect-src 'none'; form-action 'none'; base-uri 'none'"
    )
    assert f"<script>{script}</script>" in page
    assert (folder / "style.css").read_text(encoding="utf-8") in page
