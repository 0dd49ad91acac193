"""The commands that time or size a run: the benches, decode-ceiling, stage-times, plan and gold-variants."""

from __future__ import annotations

import argparse
import sys

from storybias.cli.common import load_profile
from storybias.config.models import ModelError
from storybias.core import paths
from storybias.engines import EngineError
from storybias.tools.bench import bench_associations, bench_generate, bench_served
from storybias.tools.bench import bench_ray as run_bench_ray
from storybias.tools.bench_engine import bench_engine
from storybias.tools.bench_import import bench_import
from storybias.tools.bench_llamacpp import bench_llama_cpp
from storybias.tools.decode_ceiling import NUMERICS as CEILING_NUMERICS
from storybias.tools.decode_ceiling import SEQUENCES as CEILING_SEQUENCES
from storybias.tools.decode_ceiling import measure as measure_decode_ceiling
from storybias.tools.gold_variants import gold_variants
from storybias.tools.planning import format_plan, profile_plan
from storybias.tools.stage_times import StageTimesError
from storybias.tools.stage_times import collect as collect_stage_times
from storybias.tools.stage_times import format_table as stage_times_table
from storybias.tools.stage_times import machine_lines as stage_machines


def bench_generate_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    run_bench = bench_llama_cpp if args.llama_cpp else bench_served if args.served else bench_generate
    run_bench(load_profile(args.params), n_prompts=args.n_prompts, repeats=args.repeats, max_tokens=args.max_tokens)
    return 0


def bench_engine_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    load_profile(args.params)  # a bad profile is named before any trial starts
    bench_engine(args.params, n_prompts=args.n_prompts, max_tokens=args.max_tokens, repeats=args.repeats)
    return 0


def decode_ceiling_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    load_profile(args.params)  # a bad profile is named (exit 2) before anything is timed, as for bench-engine
    try:
        measure_decode_ceiling(
            args.params,
            args.sequences or list(CEILING_SEQUENCES),
            args.n_prompts,
            args.max_tokens,
            numerics=args.numerics or list(CEILING_NUMERICS),
        )
    except (ModelError, ValueError) as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 1
    return 0


def stage_times_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    run_name = load_profile(args.params).run_name
    try:
        rows = collect_stage_times(paths.reports_dir(run_name), paths.run_dir(run_name))
    except StageTimesError as exc:  # a run with no finished notebook to time
        print(f"storybias: {exc}", file=sys.stderr)
        return 2
    machines = stage_machines(paths.run_dir(run_name))
    print("\n".join([*machines, ""] if machines else []) + stage_times_table(rows))
    return 0


def bench_ray_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        run_bench_ray(load_profile(args.params), n_prompts=args.n_prompts)
    except EngineError as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 1
    return 0


def plan_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    print(format_plan(profile_plan(p), p.planning))
    return 0


def bench_import_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    r = bench_import(n_stories=args.n_stories, n_models=args.n_models, log=lambda m: print(m, flush=True))
    return 0 if r["meets_target"] else 1


def gold_variants_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        print(gold_variants(load_profile(args.params), args.variant, args.table_only, args.n_boot))
    except (ValueError, FileNotFoundError) as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 2
    return 0


def bench_associations_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
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
