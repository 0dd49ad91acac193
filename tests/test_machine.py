"""The machine a run's models ran on (storybias.core.machine), recorded by stages 01 and 03 and printed
by `make stage-times` (issue #43: the same code took 28 minutes on one 2-core machine and 49 on another)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from storybias.core import machine
from storybias.tools import stage_times

# The first processor of /proc/cpuinfo as a 2-core KVM guest printed it on 2026-12-06 (flags shortened)
GUEST_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
cpu MHz\t\t: 2596.146
flags\t\t: fpu sse sse2 avx f16c avx2 bmi2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni
bogomips\t: 5192.29

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse
"""

# An Arm server's: no vendor_id, family or model name lines
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
"""


def test_cpuinfo_gives_the_first_processor_s_family_model_and_instruction_sets():
    info = machine.read_cpuinfo(GUEST_CPUINFO)
    assert (info["cpu"], info["vendor"], info["family"], info["model"]) == ("AMD EPYC", "AuthenticAMD", 25, 17)
    assert {"avx2", "avx512f", "avx512_bf16"} <= info["flags"] and "amx_bf16" not in info["flags"]
    # the instruction sets a record names: the Zen 4's int8 unit (VNNI) too, which the int8 weights use
    assert [f for f in machine.ISA_FLAGS if f in info["flags"]] == ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"]
    arm = machine.read_cpuinfo(ARM_CPUINFO)
    assert arm["family"] is None and arm["model"] is None and arm["vendor"] == "" and arm["cpu"]


def test_the_summary_names_what_tells_two_epyc_machines_apart():
    record = machine.Machine(
        cpu="AMD EPYC", vendor="AuthenticAMD", family=25, model=17, cores=2, memory_gb=25.3,
        isa=("avx2", "avx512f", "avx512_bf16"), bf16_gflops=344.4, threads=2,
    ).record()  # fmt: skip
    line = machine.summary(record)
    assert line == (
        "AMD EPYC (family 25, model 17); 2 cores; 25.3 GB; avx2, avx512f, avx512_bf16; "
        "bf16 matmul 344.4 GFLOP/s on 2 threads"
    )
    unprobed = machine.summary(record | {"bf16_gflops": None, "isa": [], "gpus": ["NVIDIA H100, 81559 MiB"]})
    assert "GFLOP/s" not in unprobed and "avx" not in unprobed and unprobed.endswith("NVIDIA H100, 81559 MiB")


def test_this_machine_is_described_and_its_bf16_rate_measured_in_a_process_of_its_own():
    here = machine.describe()
    flags = machine.read_cpuinfo(Path("/proc/cpuinfo").read_text())["flags"]
    assert here.cores == len(os.sched_getaffinity(0)) and here.memory_gb > 1
    assert set(here.isa) == flags & set(machine.ISA_FLAGS)
    assert here.bf16_gflops is not None and here.bf16_gflops > 1 and here.threads >= 1
    assert machine.describe(probe=False).bf16_gflops is None


def test_a_stage_records_no_machine_when_no_model_ran_and_no_rate_for_an_endpoint():
    assert machine.record_for([]) is None
    assert machine.record_for(["openai"])["bf16_gflops"] is None, "a served model's time is its server's"
    assert machine.record_for(["embedded"], probe=False)["bf16_gflops"] is None
    assert machine.record_for(["openai", "embedded"])["bf16_gflops"] > 0


def test_stage_times_prints_the_machine_each_model_stage_recorded(tmp_path):
    from storybias.core import io

    ran_on = machine.describe(probe=False).record()
    io.write_json_atomic({"models": [], "machine": ran_on}, tmp_path / "manifest_generate.json")
    io.write_json_atomic({"timings": {}, "machine": None}, tmp_path / "manifest_extract.json")
    assert stage_times.machine_lines(tmp_path) == [
        f"01_generate ran on: {machine.summary(ran_on)}",
        "03_extract: no model ran (all came from the run's cache or a published corpus)",
    ]
    io.write_json_atomic({"models": []}, tmp_path / "manifest_generate.json")  # a run from before the record
    assert stage_times.machine_lines(tmp_path)[0].startswith("01_generate: its manifest does not record")
    assert stage_times.machine_lines(tmp_path / "nothing") == []


def test_the_timing_keeps_the_fastest_window_and_leaves_out_the_warm_up():
    durations = iter([0.02] * 2 + [0.004] * 1000)  # the warm-up window's calls are slow, like a first oneDNN call
    calls = []

    def call():
        calls.append(1)
        time.sleep(next(durations))

    seconds = machine.best_seconds_per_call(call, windows=2, window_seconds=0.02)
    assert 0.004 <= seconds < 0.01, "the fastest window, not the average with the slow warm-up"
    assert len(calls) >= 2 + 2 * 2, "at least two calls in each window, warm-up included"
