"""The commands Make runs for every stage (where, serve-mode, hold-run, stamps, run-stage, ...) and the registry
printers: light imports only (a profile, paths, locks), since each ``make`` call starts several of them."""

from __future__ import annotations

import argparse
import sys

from storybias.cli.common import command_after_dashes, load_profile, refused
from storybias.config.checks import local_models, stage_key_problems
from storybias.config.params import ParamsError, write_stage_stamps
from storybias.core import paths
from storybias.core.artifacts import outputs as stage_outputs
from storybias.core.derived_runs import format_what_moved, seed, what_moved
from storybias.core.integrity import invalidate_corrupt
from storybias.core.locks import RunBusy, clean_run, hold_run, refusal_status
from storybias.core.make_rules import stages_mk
from storybias.core.registry_docs import data_contract, stage_table
from storybias.core.run_folders import claim
from storybias.tools.notebook_runner import run_stage


def data_contract_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(data_contract())
    return 0


def stages_mk_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(stages_mk())
    return 0


def stage_table_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(stage_table())
    return 0


def outputs_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    print(" ".join(str(path) for path in stage_outputs(args.stage, p.run_name)))
    return 0


def serve_mode_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    print(1 if p.generation.engine.shared_server and local_models(p.profile) else 0)
    return 0


def hold_run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    cmd = command_after_dashes(args, parser)
    return hold_run(p.run_name, cmd, log=lambda m: print(m, file=sys.stderr, flush=True), base_run=p.base_run)


def clean_run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    try:
        removed, kept = clean_run(p.run_name)
    except (RunBusy, ValueError) as exc:  # ValueError: a folder not the run's own (RunFolderError) or a bad name
        return refusal_status(exc)
    print("\n".join(f"removed {path}" for path in removed) if removed else f"run '{p.run_name}': nothing to remove")
    if kept:
        print(f"kept {len(kept)} file(s) git tracks (committed, not the run's to delete): " + ", ".join(map(str, kept)))
    return 0


def where_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
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


def run_name_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    print(load_profile(args.params).run_name)
    return 0


def stamps_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    try:
        seed(p.base_run, p.run_name)  # a run with overrides starts from its base run's files (once)
        write_stage_stamps(p, claim(p.run_name) / ".params")
        invalidate_corrupt(p.run_name, paths.run_dir(p.run_name) / ".params", log=lambda m: print(m, file=sys.stderr))
    except ParamsError as exc:  # a file the profile names vanished after it loaded
        print(f"storybias: {exc}", file=sys.stderr)
        return 2
    return 0


def what_moved_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    print(format_what_moved(p.base_run, p.run_name, what_moved(p.base_run, p.run_name)))
    return 0


def run_stage_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    if not args.report_only and refused(p, stage_key_problems(p.profile, args.stage)):  # keys before work
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
