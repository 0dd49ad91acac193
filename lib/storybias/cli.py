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
import os
import sys
from collections.abc import Callable

from storybias.config.checks import local_models, missing_key_variables, preload_note, stage_key_problems
from storybias.config.lenses import format_shortfalls, lens_shortfalls
from storybias.config.models import EMBEDDED, ModelError, prepare_embedded_models
from storybias.config.overrides import SET_ENV
from storybias.config.params import Params, ParamsError, load, write_stage_stamps
from storybias.core import paths
from storybias.core.artifacts import outputs as stage_outputs
from storybias.core.derived_runs import format_what_moved, seed, what_moved
from storybias.core.integrity import invalidate_corrupt
from storybias.core.locks import RunBusy, clean_run, hold_run
from storybias.core.make_rules import stages_mk
from storybias.core.registry_docs import data_contract, stage_table
from storybias.core.run_folders import RunFolderError, claim
from storybias.engines import EngineError, server_starter
from storybias.engines.local_servers import ServerError, with_servers
from storybias.stages import generate
from storybias.stages.associations.power import format_planned, planned_power
from storybias.stages.associations.tables import MIN_ROW_TOTAL
from storybias.stages.explorer import build_explorer
from storybias.stages.extract.facts import llama_cpp_map_problems
from storybias.tools.bench import bench_associations, bench_generate, bench_served
from storybias.tools.bench import bench_ray as run_bench_ray
from storybias.tools.bench_engine import bench_engine
from storybias.tools.bench_import import bench_import
from storybias.tools.bench_llamacpp import bench_llama_cpp
from storybias.tools.cost import estimate, format_estimate
from storybias.tools.decode_ceiling import NUMERICS as CEILING_NUMERICS
from storybias.tools.decode_ceiling import SEQUENCES as CEILING_SEQUENCES
from storybias.tools.decode_ceiling import measure as measure_decode_ceiling
from storybias.tools.gold_variants import gold_variants
from storybias.tools.notebook_runner import run_stage
from storybias.tools.planning import format_plan, profile_plan
from storybias.tools.publish import publish_notebooks
from storybias.tools.stage_times import StageTimesError
from storybias.tools.stage_times import collect as collect_stage_times
from storybias.tools.stage_times import format_table as stage_times_table
from storybias.tools.stage_times import machine_lines as stage_machines


def _load(path: str) -> Params:
    """The profile at ``path`` with the overrides in STORYBIAS_SET (Make's SET); exit 2 naming the problem."""
    try:
        return load(path, os.environ.get(SET_ENV, ""))
    except ParamsError as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


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
    ceiling.add_argument("--sequences", type=int, nargs="+", default=list(CEILING_SEQUENCES))
    ceiling.add_argument("--n-prompts", type=int, default=64)
    ceiling.add_argument("--max-tokens", type=int, default=128)
    ceiling.add_argument("--numerics", nargs="+", choices=CEILING_NUMERICS, default=list(CEILING_NUMERICS))
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


# --- the subcommands: each takes the parsed arguments and the parser, and returns the exit code ------


def _data_contract(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(data_contract())
    return 0


def _stages_mk(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(stages_mk())
    return 0


def _stage_table(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(stage_table())
    return 0


def _outputs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    print(" ".join(str(path) for path in stage_outputs(args.stage, p.run_name)))
    return 0


def _check_params(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    unset = missing_key_variables(p.profile)  # checked here, before a run: a stage reads the key when it runs
    if unset:
        print(f"storybias: {p.source}: invalid parameters:\n" + "\n".join(f"  - {u}" for u in unset), file=sys.stderr)
        return 2
    print(
        f"{p.source}: OK (run '{p.run_name}'; designs: {', '.join(p.enabled_designs())}; "
        f"models: {', '.join(m.name for m in p.generation.models)})"
    )
    note = preload_note(p.profile)
    if note:
        print(f"note: {note}")

    try:
        stories = generate.plan(p)  # a corpus profile: its rows read and checked, without their text
    except ValueError as exc:  # a corpus row the import would refuse: named by file, row and column
        print(f"storybias: {exc}", file=sys.stderr)
        return 2
    print(format_planned(planned_power(p, stories=stories), p.associations.power_known_share))
    print(format_shortfalls(lens_shortfalls(p, stories, MIN_ROW_TOTAL)))

    if _refused(p, llama_cpp_map_problems(p)):  # needs the extractor's tokenizer: here, not at every load
        return 2
    rows = estimate(p)
    if rows:
        print(format_estimate(rows))
    return 0


def _serve_mode(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    print(1 if p.generation.engine.shared_server and local_models(p.profile) else 0)
    return 0


def _with_servers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("with-servers: give the command after --")

    try:
        start = server_starter(p.generation.engine)  # llama.cpp's llama-server, or None for vLLM's
        return with_servers(p, cmd, log=lambda m: print(m, file=sys.stderr, flush=True), start=start)
    except (ServerError, EngineError) as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 1


def _refused(p: Params, problems: list[str]) -> bool:
    """Print ``problems`` as check-params does; True when there is one."""
    if problems:
        print(
            f"storybias: {p.source}: invalid parameters:\n" + "\n".join(f"  - {u}" for u in problems), file=sys.stderr
        )
    return bool(problems)


def _hold_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("hold-run: give the command after --")
    return hold_run(p.run_name, cmd, log=lambda m: print(m, file=sys.stderr, flush=True), base_run=p.base_run)


def _run_stage(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    if not args.report_only and _refused(p, stage_key_problems(p.profile, args.stage)):  # keys before work
        return 2
    return run_stage(
        args.stage,
        paths.resolve(args.notebook),
        p.source,
        p.run_name,
        target=paths.resolve(args.target) if args.target else None,
        report_only=args.report_only,
        overrides=p.overrides,
    )


def _clean_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    try:
        removed, kept = clean_run(p.run_name)
    except RunBusy as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:  # a folder that is not the run's own (RunFolderError) or a bad name
        print(f"storybias: {exc}", file=sys.stderr)
        return 2
    print("\n".join(f"removed {path}" for path in removed) if removed else f"run '{p.run_name}': nothing to remove")
    if kept:
        print(f"kept {len(kept)} file(s) git tracks (committed, not the run's to delete): " + ", ".join(map(str, kept)))
    return 0


def _where(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    if args.make:  # the Makefile's one reader of the run's name and folders
        try:
            sys.stdout.write(paths.make_variables(p.run_name))
        except ValueError as exc:
            print(f"storybias: {exc}", file=sys.stderr)
            return 2
        return 0
    print(
        f"run {p.run_name}\ndata {paths.run_dir(p.run_name)}\nreports {paths.reports_dir(p.run_name)}\n"
        f"figures {paths.figures_dir(p.run_name)}"
    )
    return 0


def _run_name(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    print(_load(args.params).run_name)
    return 0


def _stamps(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    try:
        seed(p.base_run, p.run_name)  # a run with overrides starts from its base run's files (once)
        write_stage_stamps(p, claim(p.run_name) / ".params")
        invalidate_corrupt(p.run_name, paths.run_dir(p.run_name) / ".params", log=lambda m: print(m, file=sys.stderr))
    except ParamsError as exc:  # a file the profile names vanished after it loaded
        print(f"storybias: {exc}", file=sys.stderr)
        return 2
    return 0


def _what_moved(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    print(format_what_moved(p.base_run, p.run_name, what_moved(p.base_run, p.run_name)))
    return 0


def _prepare_model(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    keys = args.model or list(EMBEDDED)
    prepare_embedded_models(keys, int8=keys)  # the int8 copies too: a profile picks one with `weights: int8`
    return 0


def _generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    generate.prepare_models(p)
    generate.run(p)
    return 0


def _bench_generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    run_bench = bench_llama_cpp if args.llama_cpp else bench_served if args.served else bench_generate
    run_bench(_load(args.params), n_prompts=args.n_prompts, repeats=args.repeats, max_tokens=args.max_tokens)
    return 0


def _bench_engine(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _load(args.params)  # a bad profile is named before any trial starts
    bench_engine(args.params, n_prompts=args.n_prompts, max_tokens=args.max_tokens, repeats=args.repeats)
    return 0


def _decode_ceiling(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _load(args.params)  # a bad profile is named (exit 2) before anything is timed, as for bench-engine
    try:
        measure_decode_ceiling(args.params, args.sequences, args.n_prompts, args.max_tokens, numerics=args.numerics)
    except (ModelError, ValueError) as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 1
    return 0


def _stage_times(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    run_name = _load(args.params).run_name
    rows = collect_stage_times(paths.reports_dir(run_name), paths.run_dir(run_name))
    machines = stage_machines(paths.run_dir(run_name))
    print("\n".join([*machines, ""] if machines else []) + stage_times_table(rows))
    return 0


def _bench_ray(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        run_bench_ray(_load(args.params), n_prompts=args.n_prompts)
    except EngineError as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 1
    return 0


def _plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = _load(args.params)
    print(format_plan(profile_plan(p), p.planning))
    return 0


def _bench_import(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    r = bench_import(n_stories=args.n_stories, n_models=args.n_models, log=lambda m: print(m, flush=True))
    return 0 if r["meets_target"] else 1


def _gold_variants(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        print(gold_variants(_load(args.params), args.variant, args.table_only, args.n_boot))
    except (ValueError, FileNotFoundError) as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 2
    return 0


def _bench_associations(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    r = bench_associations(
        n_stories=args.n_stories,
        n_models=args.n_models,
        n_languages=args.n_languages,
        n_reference=args.n_reference,
        n_jobs=args.jobs,
        log=lambda m: print(m, flush=True),
    )
    check = r["reference_check"]
    print(
        f"summary: global {r['passes']['global']['seconds']:.0f} s + per-language "
        f"{r['passes']['per_language']['seconds']:.0f} s = {r['total_seconds']:.0f} s "
        f"({'meets' if r['meets_target'] else 'misses'} the 600 s target; load average "
        f"{r['load_average_start'][0]:.1f} -> {r['load_average_end'][0]:.1f}); peak RSS "
        f"{r['peak_rss']['self_mb']:.0f} MB main / {r['peak_rss']['largest_child_mb']:.0f} MB worker; "
        "reference check: "
        + (
            f"{check['agreements']}/{check['checked']} agree, {check['disagreements']} disagreement(s), none excused"
            if check
            else "skipped"
        )
    )
    return 0 if (not check or check["disagreements"] == 0) else 1


def _publish_notebooks(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    for path in publish_notebooks(_load(args.params).run_name):
        print(f"published {path.relative_to(paths.repo_root())}")
    return 0


def _explorer(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    profile = _load(args.params)
    limit = profile.figures.explorer_max_stories if args.max_stories is None else args.max_stories
    print(build_explorer(profile, max_stories_per_cell=limit))
    return 0


Handler = Callable[[argparse.Namespace, argparse.ArgumentParser], int]

# subcommand -> its handler (every subcommand the parser knows)
_COMMANDS: dict[str, Handler] = {
    "check-params": _check_params,
    "stamps": _stamps,
    "run-name": _run_name,
    "generate": _generate,
    "clean-run": _clean_run,
    "where": _where,
    "serve-mode": _serve_mode,
    "prepare-model": _prepare_model,
    "bench-generate": _bench_generate,
    "bench-engine": _bench_engine,
    "stage-times": _stage_times,
    "decode-ceiling": _decode_ceiling,
    "bench-ray": _bench_ray,
    "plan": _plan,
    "bench-associations": _bench_associations,
    "bench-import": _bench_import,
    "gold-variants": _gold_variants,
    "explorer": _explorer,
    "with-servers": _with_servers,
    "hold-run": _hold_run,
    "run-stage": _run_stage,
    "data-contract": _data_contract,
    "stages-mk": _stages_mk,
    "stage-table": _stage_table,
    "outputs": _outputs,
    "publish-notebooks": _publish_notebooks,
    "what-moved": _what_moved,
}


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    return _COMMANDS[args.command](args, parser)


def entry(argv: list[str] | None = None) -> int:
    """``main`` with a busy run (exit 3), a run folder that is not the run's or a run with no finished
    notebook to time (exit 2) reported as a message instead of a traceback."""

    try:
        return main(argv)
    except RunBusy as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 3
    except (RunFolderError, StageTimesError) as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(entry())
