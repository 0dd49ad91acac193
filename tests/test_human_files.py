"""The one checker of the files people fill in (storybias.evidence.human_files): the check and the stage
read a file with the same reader, every problem names file, row and column, and every such file is
checked when the profile loads (issue #42, item 4)."""

from __future__ import annotations

import pytest
import yaml

from storybias.config import params
from storybias.core import paths
from storybias.evidence import harm_ratings, human_files
from storybias.evidence.judgement_ratings import LABEL_RATINGS, MARKER_RATINGS
from storybias.evidence.support_ratings import SUPPORT_RATINGS

RATINGS = "association_id,rater_id,harm,realism\n"


def write(tmp_path, text, name="f.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_what_the_check_accepts_the_stage_reads(tmp_path):
    # a line of empty cells in the middle of a ratings file: blank for the check and for the reader alike
    # (the former loader read it as a rating with harm '' after the validator had passed it)
    path = write(tmp_path, RATINGS + "a|1|b|2,r1,4,yes\n,,,\na|1|b|2,r2,5,no\n")
    assert harm_ratings.validate_human_ratings(path) == []
    frame = harm_ratings.load_human_ratings(path)
    assert frame["rater_id"].tolist() == ["r1", "r2"] and frame["harm"].tolist() == [4, 5]


def test_one_rater_rating_one_association_twice_is_refused(tmp_path):
    path = write(tmp_path, RATINGS + "a|1|b|2,r1,4,yes\na|1|b|3,r1,2,no\na|1|b|2,r1,5,yes\n")
    problems = harm_ratings.validate_human_ratings(path)
    assert problems == [
        f"{path}: row 4, column rater_id: a second rating of association_id 'a|1|b|2', rater_id 'r1' (first on row 2)"
    ]
    with pytest.raises(ValueError, match="row 4, column rater_id"):
        harm_ratings.load_human_ratings(path)


def test_a_long_cell_is_shortened_in_the_message(tmp_path):
    path = write(tmp_path, RATINGS + "a|1|b|2,r1," + "9" * 5000 + ",yes\n")
    (problem,) = harm_ratings.validate_human_ratings(path)
    assert "row 2, column harm: '999" in problem and "...' is not an integer from 1 to 5" in problem
    assert len(problem) < len(str(path)) + 200


@pytest.mark.parametrize("spec", [harm_ratings.HUMAN_RATINGS, SUPPORT_RATINGS, MARKER_RATINGS, LABEL_RATINGS])
def test_every_file_kind_refuses_a_missing_column_and_a_wrong_width_row_the_same_way(tmp_path, spec):
    header = ",".join(c.name for c in spec.columns if not c.optional)
    short = write(tmp_path, ",".join(header.split(",")[:-1]) + "\nx\n", "short.csv")
    assert human_files.check_file(short, spec)[0].startswith(f"{short}: row 1 (header): missing column(s)")
    wide = write(tmp_path, header + "\n" + ",".join(["x"] * (header.count(",") + 2)) + "\n", "wide.csv")
    assert f"{wide}: row 2: " in human_files.check_file(wide, spec)[0]


def _profile(tmp_path, validation: dict) -> params.Params:
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    raw.setdefault("probes", {})["human_validation"] = validation
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return params.load(path)


def test_stage_06s_files_are_checked_when_the_profile_loads(tmp_path):
    markers = write(tmp_path, "marker_id,language,rater_id,human,automated\nm1,en,r1,9,3\n", "markers.csv")
    labels = write(
        tmp_path, "item_id,language,genre,automated,rater_id,human\ni1,en,poem,female,a,male\n", "labels.csv"
    )
    with pytest.raises(params.ParamsError) as err:
        _profile(tmp_path, {"markers": str(markers), "labels": str(labels)})
    message = str(err.value)
    assert (
        f"probes.human_validation.markers: {markers}: row 2, column human: '9' is not an integer from 1 to 7" in message
    )
    assert f"probes.human_validation.labels: {labels}: row 2, column genre: 'poem' is not story or news" in message
    good = write(tmp_path, "marker_id,language,rater_id,human,automated\nm1,en,r1,5,3\n", "good.csv")
    assert _profile(tmp_path, {"markers": str(good)}).probes.human_validation.markers == str(good)
