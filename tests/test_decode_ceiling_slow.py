"""`make decode-ceiling` on the embedded model, as a user runs it (the CLI in a process of its own): it
times vLLM's own CPU linear on the model's shapes and writes rows that fit the recorded file."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import yaml

from storybias.core import paths
from storybias.evidence.recorded import RECORDED_COLUMNS

pytestmark = pytest.mark.slow
ROOT = paths.repo_root()


def test_the_ceiling_of_a_small_trial_on_the_embedded_model(tmp_path, embedded_model):
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "pytest-ceiling"
    raw["generation"]["engine"]["max_num_seqs"] = 4  # the trial's batch: 6 prompts decode in two waves
    profile = tmp_path / "ceiling.yaml"
    profile.write_text(yaml.safe_dump(raw, sort_keys=False))
    command = [sys.executable, "-m", "storybias.cli", "decode-ceiling", str(profile)]
    command += ["--sequences", "4", "--n-prompts", "6", "--max-tokens", "8"]
    env = dict(os.environ, STORYBIAS_DATA=str(tmp_path / "data"))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "data" / "pytest-ceiling" / "reports" / "decode_ceiling.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == RECORDED_COLUMNS["decode_ceiling"]
    assert [r["numerics"] for r in rows] == ["bf16", "bf16", "int8", "int8"], "both numerics by default"
    decode, trial, *_ = rows
    assert (decode["what"], decode["sequences"]) == ("decode step", "4")
    assert trial["what"] == "bench-engine trial, 6 prompts x 8 tokens" and trial["sequences"] == "4"
    assert [r["what"] for r in rows[2:]] == [decode["what"], trial["what"]]
    assert rows[3]["prompt_tokens"] == trial["prompt_tokens"], "the same trial, in the other numerics"
    assert all(float(r["gflops"]) > 0 and float(r["ceiling_tokens_per_s"]) > 0 for r in rows)
    # 6 prompts at 4 a time: two waves of 8 decode steps, plus the prefill, in the time the rate implies
    assert float(trial["seconds"]) == pytest.approx(6 * 8 / float(trial["ceiling_tokens_per_s"]), rel=0.01)
    assert float(trial["seconds"]) > 2 * 8 * float(decode["seconds"]), "the prefill comes on top of the decode steps"
    # the two warm-up prompts beyond the first four are counted, less the chat template's shared opening
    assert 0 < int(trial["prompt_tokens"]) < 6 * 400
    assert "cores" in trial["machine"] and "bf16 matmul" in trial["machine"]
    assert "decode-ceiling --n-prompts 6 --max-tokens 8 (pytest-ceiling)" in trial["sitting"]
