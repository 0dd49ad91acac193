"""A model entry's ``weights: bf16 | int8`` (the embedded models' W8A8 copy, storybias.config.int8_weights):
validated, in the answer cache's key, the server key and the stage stamps when it is int8, and leaving
all three as they were when it is bf16 (the default), so adding the setting reran and re-asked nothing."""

from __future__ import annotations

import json

import pytest

from profile_files import read_smoke, write_profile
from storybias.config import models, params
from storybias.config.params import ModelSpec, ParamsError
from storybias.engines import cache, local_servers
from storybias.engines.prepare import prepare_models

EMBEDDED = ModelSpec(name="m", source="embedded")
INT8 = ModelSpec(name="m", source="embedded", weights="int8")


def test_int8_is_refused_for_a_model_storybias_does_not_convert(tmp_path):
    raw = read_smoke()
    raw["extract"]["models"][0] = {"name": "mine", "source": "local", "path": str(tmp_path), "weights": "int8"}
    with pytest.raises(ParamsError) as exc:
        params.load(write_profile(tmp_path, raw))
    message = str(exc.value)
    assert "extract.models[0]" in message and "`weights: int8`" in message and "source 'local'" in message
    raw["extract"]["models"][0] = {"name": "m", "source": "embedded", "weights": "int4"}
    with pytest.raises(ParamsError, match=r"extract\.models\[0\]\.weights: .*'bf16' or 'int8'; got 'int4'"):
        params.load(write_profile(tmp_path, raw))


def test_int8_is_accepted_for_an_embedded_model_and_bf16_is_the_default(tmp_path):
    raw = read_smoke()
    raw["generation"]["models"][0]["weights"] = "int8"
    p = params.load(write_profile(tmp_path, raw))
    assert p.generation.models[0].weights == "int8"
    assert params.load(write_profile(tmp_path, read_smoke(), "smoke.yaml")).generation.models[0].weights == "bf16"


def test_int8_answers_are_keyed_apart_and_bf16_keeps_the_keys_stored_before_the_setting():
    """The model part of the cache key names the weights loaded by their pinned sha256 (the int8 copy's
    for int8). For bf16 it is the key the answers were stored under before the setting existed (computed
    with the code of 260ae5e), so no stored answer is asked again."""
    assert cache._digest(cache.model_identity(EMBEDDED)) == "3c228ee13098e566"
    small = EMBEDDED.model_copy(update={"embedded": "qwen2.5-coder-0.5b"})
    assert cache._digest(cache.model_identity(small)) == "2ab8b79fc6100be4"
    assert cache.model_identity(INT8)["embedded"] == models.embedded_weights().int8_sha256
    assert cache._digest(cache.model_identity(INT8)) != cache._digest(cache.model_identity(EMBEDDED))
    assert local_servers.serve_key(INT8) != local_servers.serve_key(EMBEDDED), "one server per set of weights"


def test_int8_reruns_the_stage_of_that_model_and_bf16_keeps_the_stamps(tmp_path):
    """Digests of the smoke profile before the setting existed (the code of 260ae5e): unchanged."""
    smoke = params.load(write_profile(tmp_path, read_smoke(), "smoke.yaml"))
    before = {"generate": "85526ffeeb4bb49a", "extract": "ee3efaf0898e5e71", "associations": "740a5213a3dfec06"}
    assert {stage: smoke.stage_digest(stage)[:16] for stage in before} == before
    raw = read_smoke()
    raw["extract"]["models"][0]["weights"] = "int8"
    changed = params.load(write_profile(tmp_path, raw, "int8.yaml"))
    assert {s for s in before if changed.stage_digest(s) != smoke.stage_digest(s)} == {"extract"}


def test_a_stage_prepares_the_int8_copy_of_the_models_it_runs_in_int8(tmp_path, monkeypatch):
    asked: list[tuple[list[str], list[str]]] = []
    monkeypatch.setattr(
        "storybias.engines.prepare.prepare_embedded_models",
        lambda keys, log=print, int8=(): asked.append((list(keys), list(int8))),
    )
    raw = read_smoke()
    raw["extract"]["models"][0]["weights"] = "int8"
    p = params.load(write_profile(tmp_path, raw))
    prepare_models(p, ("generate",))
    prepare_models(p, ("extract",))
    key = p.extract.models[0].embedded
    assert asked == [([p.generation.models[0].embedded], []), ([key], [key])]


def test_an_int8_copy_not_written_is_named_with_the_command_that_writes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_MODELS", str(tmp_path))
    with pytest.raises(models.ModelError, match="int8 copy of embedded model qwen2.5-coder-1.5b .* `make model`"):
        models.resolve_weights(INT8)
    folder = models.int8_model_dir()
    folder.mkdir()
    stamp = {"sha256": "0" * 64}  # a copy that is not the pinned one is not used
    (folder / models.STAMP).write_text(json.dumps(stamp))
    assert not models.int8_ready()
    (folder / models.STAMP).write_text(json.dumps({"sha256": models.embedded_weights().int8_sha256}))
    assert models.resolve_weights(INT8)[0] == folder and "W8A8 int8 copy" in models.resolve_weights(INT8)[1]
    assert models.pinned_sha256(INT8) != models.pinned_sha256(EMBEDDED) == models.embedded_weights().sha256
