"""What a run's models ran on, recorded with the stage's times (issue #43).

A stage's time on the CPU path is set by the CPU's bf16 matrix units: almost all of an engine's time
is the decoder's matrix multiplies, and two machines sold as the same kind can differ there by a large
factor (the measurements are in docs/benchmarks.md, `make decode-ceiling`; storybias.tools.decode_ceiling).
So a time means little without its machine: the stages that run models record :func:`describe` in
their manifests, and `make stage-times` prints it.

- ``cpu``, ``vendor``, ``family``, ``model``: from ``/proc/cpuinfo`` (a virtual machine often shows a
  bare brand; the family and model numbers still tell generations apart: AMD family 25 (19h) model 17
  (11h) is Zen 4, family 26 (1Ah) is Zen 5);
- ``isa``: which of the instruction sets vLLM's CPU kernels pick between the CPU has;
- ``bf16_gflops``, ``threads``: a measured rate, one decoder-sized bf16 matrix multiply (64 rows, a
  1.5B model's MLP projection), the best of five 0.1-second windows in a process of its own, on
  torch's default threads (the cores);
- ``gpus``: ``nvidia-smi``'s names and memory, where it exists (the paper path).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
# the instruction sets vLLM's CPU build chooses its kernels by (AVX2 only, AVX-512, AVX-512 bf16, AMX), and
# the int8 units its W8A8 kernels use (AVX-512 VNNI, AMX int8: storybias.config.int8_weights)
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
# the probe's shape: a batch of 64 decoding sequences through a 1.5B decoder's MLP projection
PROBE_ROWS, PROBE_IN, PROBE_OUT = 64, 1536, 8960


@dataclass(frozen=True)
class Machine:
    """One machine as a stage saw it; :meth:`record` is what the manifests store."""

    cpu: str
    vendor: str
    family: int | None
    model: int | None
    cores: int
    memory_gb: float
    isa: tuple[str, ...]
    bf16_gflops: float | None = None
    threads: int | None = None
    gpus: tuple[str, ...] = field(default_factory=tuple)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "isa": list(self.isa), "gpus": list(self.gpus)}

    def summary(self) -> str:
        return summary(self.record())


def read_cpuinfo(text: str) -> dict[str, Any]:
    """The first processor's brand, vendor, family, model and flags from ``/proc/cpuinfo``'s text (x86
    layout; another architecture's file gives what it has, the rest empty)."""
    first = text.split("\n\n", 1)[0]
    fields: dict[str, str] = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())

    def number(key: str) -> int | None:
        return int(fields[key]) if fields.get(key, "").isdigit() else None

    return {
        "cpu": fields.get("model name", platform.processor() or platform.machine()),
        "vendor": fields.get("vendor_id", ""),
        "family": number("cpu family"),
        "model": number("model"),
        "flags": set(fields.get("flags", "").split()),
    }


def best_seconds_per_call(call: Callable[[], object], windows: int, window_seconds: float) -> float:
    """Seconds per call of ``call``: the fastest of ``windows`` timed windows (each at least two calls)
    after one window of warm-up, in which oneDNN picks and caches its kernel. The fastest, because what
    is measured is a capability: single windows on one machine vary widely within minutes (docs/benchmarks.md)."""
    per_call = []
    for window in range(windows + 1):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < window_seconds or n < 2:
            call()
            n += 1
        if window:
            per_call.append(elapsed / n)
    return min(per_call)


def bf16_matmul_gflops(windows: int = 5, window_seconds: float = 0.1) -> tuple[float, int] | None:
    """(GFLOP/s, threads) of the probe's bf16 matrix multiply on this process' torch threads
    (:func:`best_seconds_per_call`). None where torch is not installed."""
    try:
        # heavy: torch, only for the probe (installed wherever a model runs)
        import torch
    except ImportError:
        return None
    x = torch.randn(PROBE_ROWS, PROBE_IN, dtype=torch.bfloat16)
    weight = torch.randn(PROBE_OUT, PROBE_IN, dtype=torch.bfloat16)
    seconds = best_seconds_per_call(lambda: torch.nn.functional.linear(x, weight), windows, window_seconds)
    return round(2 * PROBE_ROWS * PROBE_IN * PROBE_OUT / seconds / 1e9, 1), torch.get_num_threads()


def probe_apart(timeout: float = 120.0) -> tuple[float, int] | None:
    """:func:`bf16_matmul_gflops` in a fresh Python process: the stage's own process keeps its OpenMP
    runtime untouched for the engine it may start next (the thread binding of vLLM's CPU engine). None
    where the probe fails or has no torch."""
    command = [sys.executable, "-m", "storybias.core.machine"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True).stdout
        measured = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return (float(measured[0]), int(measured[1])) if measured else None


def gpu_names() -> tuple[str, ...]:
    """``nvidia-smi``'s 'name, memory' per GPU; empty where there is no NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return ()
    query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


def available_cores() -> int:
    """Cores this process may run on: its affinity (taskset, a cpuset) where the OS tells (Linux), else the
    machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def describe(probe: bool = True) -> Machine:
    """This machine, with the bf16 probe measured unless ``probe`` is false."""
    info = read_cpuinfo(CPUINFO.read_text(encoding="utf-8", errors="replace") if CPUINFO.is_file() else "")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    measured = probe_apart() if probe else None
    return Machine(
        cpu=info["cpu"],
        vendor=info["vendor"],
        family=info["family"],
        model=info["model"],
        cores=available_cores(),
        memory_gb=round(memory, 1),
        isa=tuple(f for f in ISA_FLAGS if f in info["flags"]),
        bf16_gflops=measured[0] if measured else None,
        threads=measured[1] if measured else None,
        gpus=gpu_names(),
    )


def record_for(sources: Sequence[str], probe: bool = True) -> dict[str, Any] | None:
    """What a stage's manifest stores as ``machine`` when the models of ``sources`` (each model's
    ``source``) have work: None where none has. The probe runs only if ``probe`` and some model runs
    here (an endpoint's time is its server's; a stand-in engine's, in the tests, is no model's)."""
    if not sources:
        return None
    return describe(probe=probe and any(source != "openai" for source in sources)).record()


def summary(record: dict[str, Any]) -> str:
    """One line for a manifest's ``machine`` record: what `make stage-times` prints above its table."""
    cpu = record.get("cpu") or "unknown CPU"
    if record.get("family") is not None:
        cpu += f" (family {record['family']}, model {record.get('model')})"
    parts = [cpu, f"{record.get('cores')} cores", f"{_number(record.get('memory_gb'))} GB"]
    if record.get("isa"):
        parts.append(", ".join(record["isa"]))
    if record.get("bf16_gflops") is not None:
        parts.append(f"bf16 matmul {_number(record['bf16_gflops'])} GFLOP/s on {record.get('threads')} threads")
    parts += list(record.get("gpus") or [])
    return "; ".join(parts)


def _number(value: Any) -> str:
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":  # the probe, run apart by probe_apart: one JSON line, [GFLOP/s, threads] or null
    print(json.dumps(bf16_matmul_gflops()))
