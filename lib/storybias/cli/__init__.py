"""Command line used by the Makefile: ``python -m storybias.cli <command> ...``.

check-params PARAMS        validate a profile (exit 2 with the problems, naming key and file; every key
                           variable a served model's api_key_env names must be set), then
                           print stage 04's minimum detectable lift for its planned stories (a corpus:
                           its own rows, read without the text), the lenses its size cannot feed and, for
                           served models, the requests and tokens the run will ask for (its cost when priced)
with-servers PARAMS -- CMD ...   run CMD with each local model of the profile loaded once and kept up (a
                           model host started by the first stage that needs it, storybias.engines.host, or
                           a vLLM server, storybias.engines.local_servers), stopped when CMD ends, fails or is
                           interrupted
hold-run PARAMS -- CMD ...  run CMD (Make's sub-make of a stage goal or of the paper) holding the run's lock
                           from its first stage to its last; the stages inherit it, clean-run is refused
serve-mode PARAMS          print 1 when the profile keeps its models up across stages (shared_server), else 0
stamps PARAMS              write data/<run>/.params/<stage>.params (content changes only): each stage's
                           parameters digest and the sha256 of every file the profile names that it reads
run-name PARAMS            print the run's name
prepare-model [--model K]  assemble, verify and convert the embedded models, bf16 and int8 (once; default: every one)
generate PARAMS            stage 01 outside a notebook (the notebook calls the same function)
bench-generate PARAMS      time stage 01's engine path against a bare LLM.chat call (--served: against the
                           local vLLM server; --llama-cpp: the CPU vLLM engine beside llama.cpp's llama-server)
bench-engine PARAMS        engine start-up and tokens/s: compiled, eager, eager with tcmalloc + Intel
                           OpenMP preloaded, a process per trial, alternated (docs/measurements)
decode-ceiling PARAMS      the most tokens/s this CPU's matrix units allow the profile's first model at
                           32-256 sequences and in one bench-engine trial (vLLM's own CPU linear, timed
                           alone; bf16 and int8 weights: --numerics), and the machine
stage-times PARAMS         a Markdown table of the run's stages: papermill's time per executed notebook and,
                           from the manifests, what it went to (engine start-ups, tokens/s, stories/s)
bench-ray PARAMS           time a smoke generation through Ray Data's vLLM processor against the
                           in-process engine (start-up separately), and kill-and-resume it
plan PARAMS                stage 01's work per design and model: requests, tokens, wall time on planning.gpus
bench-associations         time stage 04's association tests at paper scale on synthetic extractions
bench-import               time importing a paper-scale synthetic StereoTales release and stages 02-04 on it
gold-variants PARAMS --variant NAME[:key=value,...] ...   stage 03's extract settings on the gold set, each
                           against the first (paired bootstrap), with tokens and seconds per variant
explorer PARAMS [--max-stories N]   write figures/<run>/explorer.html (stories + associations browser)
run-stage STAGE NOTEBOOK PARAMS [--target FILE] [--report-only]   what Make runs: the notebook under
                           the run's lock (--report-only: the target is up to date, only its executed
                           notebook is missing; the target keeps its time)
clean-run PARAMS           delete the run's own folders (data/<run>, reports/<run>, figures/<run>), each
                           only if it is the run's own (storybias.core.run_folders) and no make holds the
                           run; a file git tracks is kept, and named
where PARAMS [--make]      print the run's name and folders (absolute paths; --make: as the Makefile's
                           RUN, DATA, REPORTS, FIGURES and STAMPS, which it reads from here)
data-contract              print docs/data-contract.md, generated from the artifact registry
stages-mk                  print make/stages.mk, the Makefile's per-stage rules, generated from the stage registry
stage-table                print the stage table (docs/pipeline.md, the data contract's index), from the registry
outputs STAGE PARAMS       print the files Make tracks for STAGE (storybias.core.artifacts.MAKE_TARGETS)
publish-notebooks PARAMS   copy the outputs of the run's executed notebooks (reports/<run>/) into notebooks/
what-moved PARAMS          the named values that differ between a run with overrides and its base run

Every command that takes PARAMS reads the overrides in STORYBIAS_SET (``key.path=value`` items separated
by spaces, storybias.config.overrides), which the Makefile sets from SET: the profile with them is a run
of its own, named from them, that starts from a copy of its base run (storybias.core.derived_runs).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from storybias.core.locks import RUN_REFUSALS, refusal_status

# --- the parser -----------------------------------------------------------------------------------


def _add_profile_commands(sub: argparse._SubParsersAction) -> None:
    """The commands that take a profile only, and prepare-model."""
    for name in ("check-params", "stamps", "run-name", "generate", "clean-run", "serve-mode"):
        sub.add_parser(name).add_argument("params")
    where = sub.add_parser("where")
    where.add_argument("params")
    where.add_argument("--make", action="store_true", help="as Make assignments (RUN, DATA, REPORTS, FIGURES, STAMPS)")
    prep = sub.add_parser("prepare-model")
    prep.add_argument("--model", action="append", help="an embedded model's key (repeatable; default: every one)")


def _add_bench_commands(sub: argparse._SubParsersAction) -> None:
    """bench-generate, bench-ray, plan and bench-associations: timing and sizing a run."""
    bench = sub.add_parser("bench-generate")
    bench.add_argument("params")
    bench.add_argument("--n-prompts", type=int, default=24)
    bench.add_argument("--repeats", type=int, default=2)
    bench.add_argument("--max-tokens", type=int, default=200)
    bench.add_argument(
        "--served",
        action="store_true",
        help="compare the in-process engine with the local vLLM server over HTTP (storybias.engines.local_servers)",
    )
    bench.add_argument(
        "--llama-cpp",
        action="store_true",
        help="compare the CPU vLLM engine with llama.cpp's llama-server (storybias.tools.bench_llamacpp)",
    )
    sub.add_parser("stage-times").add_argument("params")
    ceiling = sub.add_parser("decode-ceiling")
    ceiling.add_argument("params")
    ceiling.add_argument("--sequences", type=int, nargs="+", default=None, help="default: 32 64 128 256")
    ceiling.add_argument("--n-prompts", type=int, default=64)
    ceiling.add_argument("--max-tokens", type=int, default=128)
    ceiling.add_argument("--numerics", nargs="+", default=None, help="bf16, int8 or both (default)")
    bench_engine = sub.add_parser("bench-engine")
    bench_engine.add_argument("params")
    bench_engine.add_argument("--n-prompts", type=int, default=64)
    bench_engine.add_argument("--max-tokens", type=int, default=128)
    bench_engine.add_argument("--repeats", type=int, default=2)
    bench_ray = sub.add_parser("bench-ray")
    bench_ray.add_argument("params")
    bench_ray.add_argument("--n-prompts", type=int, default=24)
    sub.add_parser("plan").add_argument("params")
    bench_assoc = sub.add_parser("bench-associations")
    bench_assoc.add_argument("--n-stories", type=int, default=650_000)
    bench_assoc.add_argument("--n-models", type=int, default=23)
    bench_assoc.add_argument("--n-languages", type=int, default=10)
    bench_assoc.add_argument(
        "--n-reference",
        type=int,
        default=100,
        help="tables checked against the 500,000-resample Monte-Carlo Fisher test",
    )
    bench_assoc.add_argument("--jobs", type=int, default=None, help="worker processes (default: every core)")
    variants = sub.add_parser("gold-variants", help="extract prompt variants on the gold set, against the first")
    variants.add_argument("params")
    variants.add_argument("--variant", action="append", required=True, help="NAME or NAME:key=value,... (extract)")
    variants.add_argument("--table-only", action="store_true", help="write the table from the kept results")
    variants.add_argument("--n-boot", type=int, default=2000)
    bench_import = sub.add_parser("bench-import")
    bench_import.add_argument("--n-stories", type=int, default=650_000)
    bench_import.add_argument("--n-models", type=int, default=23)


def _add_run_commands(sub: argparse._SubParsersAction) -> None:
    """explorer, with-servers, run-stage, data-contract and outputs: what Make runs around the stages."""
    explorer = sub.add_parser("explorer")
    explorer.add_argument("params")
    explorer.add_argument(
        "--max-stories", type=int, default=None, help="stories embedded per design x model x language (default 200)"
    )
    hold = sub.add_parser("hold-run")
    hold.add_argument("params")
    hold.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run")
    servers = sub.add_parser("with-servers")
    servers.add_argument("params")
    servers.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run")
    stage = sub.add_parser("run-stage")
    stage.add_argument("stage")
    stage.add_argument("notebook")
    stage.add_argument("params")
    stage.add_argument(
        "--target", default=None, help="the Make target this stage writes (removed if this run fails after writing it)"
    )
    stage.add_argument(
        "--report-only",
        action="store_true",
        help="the target is up to date but the executed notebook is missing: run the notebook to write it, "
        "keeping the target's time so later stages do not rerun",
    )
    sub.add_parser("data-contract")
    sub.add_parser("stages-mk")
    sub.add_parser("stage-table")
    outputs = sub.add_parser("outputs")
    outputs.add_argument("stage")
    outputs.add_argument("params")
    sub.add_parser("publish-notebooks").add_argument("params")
    sub.add_parser("what-moved").add_argument("params")


def _build_parser() -> argparse.ArgumentParser:
    """The ``storybias`` parser: one subcommand per entry of the module docstring."""
    parser = argparse.ArgumentParser(prog="storybias")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_profile_commands(sub)
    _add_bench_commands(sub)
    _add_run_commands(sub)
    return parser


Handler = Callable[[argparse.Namespace, argparse.ArgumentParser], int]

# subcommand -> "module:function" of its handler in this package, imported only when the subcommand runs
# (as pip's command registry does): `make` starts where, serve-mode, hold-run, stamps and run-stage for
# every stage, and importing every command's module (engines, stages and benches: scipy, statsmodels,
# scikit-learn) cost each of them 2.5 CPU-s instead of 1.0 (tests/test_cli.py holds them to their imports).
COMMANDS: dict[str, str] = {
    "where": "run_commands:where_command",
    "run-name": "run_commands:run_name_command",
    "serve-mode": "run_commands:serve_mode_command",
    "hold-run": "run_commands:hold_run_command",
    "stamps": "run_commands:stamps_command",
    "what-moved": "run_commands:what_moved_command",
    "clean-run": "run_commands:clean_run_command",
    "outputs": "run_commands:outputs_command",
    "data-contract": "run_commands:data_contract_command",
    "stages-mk": "run_commands:stages_mk_command",
    "stage-table": "run_commands:stage_table_command",
    "run-stage": "run_commands:run_stage_command",
    "check-params": "stage_commands:check_params_command",
    "with-servers": "stage_commands:with_servers_command",
    "generate": "stage_commands:generate_command",
    "prepare-model": "stage_commands:prepare_model_command",
    "explorer": "stage_commands:explorer_command",
    "publish-notebooks": "stage_commands:publish_notebooks_command",
    "bench-generate": "bench_commands:bench_generate_command",
    "bench-engine": "bench_commands:bench_engine_command",
    "decode-ceiling": "bench_commands:decode_ceiling_command",
    "stage-times": "bench_commands:stage_times_command",
    "bench-ray": "bench_commands:bench_ray_command",
    "plan": "bench_commands:plan_command",
    "bench-associations": "bench_commands:bench_associations_command",
    "bench-import": "bench_commands:bench_import_command",
    "gold-variants": "bench_commands:gold_variants_command",
}


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    module, function = COMMANDS[args.command].split(":")
    handler: Handler = getattr(importlib.import_module(f"storybias.cli.{module}"), function)
    return handler(args, parser)


def entry(argv: list[str] | None = None) -> int:
    """``main`` with a busy run (exit 3) or a run folder that is not the run's (exit 2) reported as a
    message instead of a traceback."""

    try:
        return main(argv)
    except RUN_REFUSALS as exc:
        return refusal_status(exc)
