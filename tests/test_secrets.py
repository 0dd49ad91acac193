"""Issue #58 item 5: an API key never reaches a message, a log or an executed notebook. A key whose value holds
a control character is refused at check-params and at engine start, naming the variable and not the value
(it used to reach reports/<run>/04_associations.log inside httpx's ``Illegal header value b'Bearer sk-...'``),
and every error text from the HTTP client is scrubbed of header values before it is raised or stored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import nbformat
import openai
import pytest
import yaml

from fake_openai import FakeOpenAI
from stage_notebooks import tiny_stage_notebook
from storybias.config import checks, params
from storybias.config.params import ModelSpec
from storybias.core import paths, secrets
from storybias.engines import EngineError, openai_endpoint
from storybias.tools.notebook_runner import run_stage

ROOT = paths.repo_root()
SECRET = "sk-SECRET-do-not-print-4711"
INJECTED = SECRET + "\nX-Injected: 1"


def _profile(tmp_path: Path, base_url: str, run: str = "pytest-secrets") -> Path:
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = run
    raw["generation"]["models"] = [
        {
            "name": "api",
            "source": "openai",
            "base_url": base_url,
            "model_id": "m-1",
            "api_key_env": "STORYBIAS_TEST_KEY",
        }
    ]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("value", [INJECTED, SECRET + "\r", SECRET + "\x00", "sk live key", "sk-clé"])
def test_a_key_that_cannot_be_a_header_is_refused_naming_the_variable_not_the_value(value):
    problem = secrets.key_problem("STORYBIAS_TEST_KEY", value)
    assert problem is not None and "$STORYBIAS_TEST_KEY" in problem
    assert value not in problem and "sk-" not in problem
    assert secrets.key_problem("STORYBIAS_TEST_KEY", SECRET) is None


def test_check_params_refuses_a_key_with_a_newline(tmp_path):
    path = _profile(tmp_path, "http://127.0.0.1:9/v1")
    env = dict(os.environ, STORYBIAS_TEST_KEY=INJECTED, STORYBIAS_DATA=str(tmp_path / "data"))
    result = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "check-params", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout
    assert "generation.models[0].api_key_env" in result.stderr and "$STORYBIAS_TEST_KEY" in result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_the_engine_refuses_a_key_with_a_newline_before_any_request(monkeypatch):
    monkeypatch.setenv("STORYBIAS_TEST_KEY", INJECTED)
    spec = ModelSpec(
        name="api", source="openai", base_url="http://127.0.0.1:9/v1", model_id="m-1", api_key_env="STORYBIAS_TEST_KEY"
    )
    with pytest.raises(EngineError) as exc:
        openai_endpoint.endpoint_of(spec)
    assert "STORYBIAS_TEST_KEY" in str(exc.value) and SECRET not in str(exc.value)
    monkeypatch.setenv("STORYBIAS_TEST_KEY", SECRET)
    assert SECRET not in repr(openai_endpoint.endpoint_of(spec)), "the endpoint's repr holds no key"


def test_client_errors_quoting_a_header_are_scrubbed():
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    quoted = f"Illegal header value b'Bearer {SECRET}\\nX-Injected: 1'"
    connection = openai.APIConnectionError(message=quoted, request=request)
    status = openai.BadRequestError(
        message=f"Error code: 400 - Authorization: Bearer {SECRET}",
        response=httpx.Response(400, request=request),
        body=None,
    )
    for exc in (connection, status, httpx.LocalProtocolError(quoted)):
        text = openai_endpoint._describe(exc)
        assert SECRET not in text and secrets.SCRUBBED in text, text
    endpoint = openai_endpoint.Endpoint(name="api", base_url="http://x/v1", model_id="m", api_key=SECRET)
    raised = openai_endpoint._without_key(RuntimeError(f"boom {SECRET!r}"), endpoint)
    assert isinstance(raised, EngineError) and SECRET not in str(raised)


def test_a_failing_stage_leaves_the_key_in_no_log_and_no_notebook(tmp_path, monkeypatch):
    """Stage 01 on a served model at a loopback endpoint (tests/fake_openai.py), run as `make` runs it, with a
    key holding a newline: the stage fails, and no file it left holds the key."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("STORYBIAS_TEST_KEY", INJECTED)
    notebook = tmp_path / "01_generate.ipynb"
    nbformat.write(
        tiny_stage_notebook(
            'params_file = ""',
            "from storybias.config import params\nfrom storybias.stages import generate\n"
            "generate.run(params.load(params_file), progress=False)",
        ),
        notebook,
    )
    with FakeOpenAI(key=INJECTED) as api:
        profile = _profile(tmp_path, api.base_url)
        code = run_stage("generate", notebook, profile, "pytest-secrets", log=lambda m: None)
    assert code != 0
    written = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in written) and any(p.suffix == ".ipynb" for p in written)
    log = next(p for p in written if p.suffix == ".log").read_text()
    assert "STORYBIAS_TEST_KEY" in log, log[-2000:]
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), f"{path} holds the key"
    assert checks.missing_key_variables(params.load(profile).profile)  # check-params would have said so


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"Authorization: Bearer {SECRET}", "Authorization: Bearer"),
        (f"authorization: {SECRET} more", "more"),
        (f"Illegal header value b'Bearer {SECRET}\\nX-Injected: 1'", "Illegal header value"),
        ("the endpoint refused a 1-token test request (basic (e.g. x))", "1-token test request (basic (e.g. x))"),
    ],
)
def test_scrub_removes_header_values_and_keeps_the_rest_of_the_message(text, kept):
    clean = secrets.scrub(text)
    assert SECRET not in clean and kept in clean
