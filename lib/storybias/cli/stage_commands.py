"""The commands that check or serve a run's work: check-params, with-servers, generate, prepare-model,
explorer and publish-notebooks."""

from __future__ import annotations

import argparse
import sys

from storybias.cli.common import command_after_dashes, load_profile, refused
from storybias.config.checks import missing_key_variables, preload_note
from storybias.config.lenses import format_shortfalls, lens_shortfalls
from storybias.config.models import EMBEDDED, prepare_embedded_models
from storybias.core import paths
from storybias.engines import EngineError, server_starter
from storybias.engines.local_servers import ServerError, with_servers
from storybias.stages import generate
from storybias.stages.associations.power import format_planned, planned_power
from storybias.stages.associations.tables import MIN_ROW_TOTAL
from storybias.stages.explorer import build_explorer
from storybias.stages.extract.facts import llama_cpp_map_problems
from storybias.tools.cost import estimate, format_estimate
from storybias.tools.publish import publish_notebooks


def check_params_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    unset = missing_key_variables(p.profile)  # checked here, before a run: a stage reads the key when it runs
    if refused(p, unset):
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

    if refused(p, llama_cpp_map_problems(p)):  # needs the extractor's tokenizer: here, not at every load
        return 2
    rows = estimate(p)
    if rows:
        print(format_estimate(rows))
    return 0


def with_servers_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    cmd = command_after_dashes(args, parser)

    try:
        start = server_starter(p.generation.engine)  # llama.cpp's llama-server, or None for vLLM's
        return with_servers(p, cmd, log=lambda m: print(m, file=sys.stderr, flush=True), start=start)
    except (ServerError, EngineError) as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        return 1


def prepare_model_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    keys = args.model or list(EMBEDDED)
    prepare_embedded_models(keys, int8=keys)  # the int8 copies too: a profile picks one with `weights: int8`
    return 0


def generate_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    p = load_profile(args.params)
    generate.prepare_models(p)
    generate.run(p)
    return 0


def publish_notebooks_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    for path in publish_notebooks(load_profile(args.params).run_name):
        print(f"published {path.relative_to(paths.repo_root())}")
    return 0


def explorer_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    profile = load_profile(args.params)
    limit = profile.figures.explorer_max_stories if args.max_stories is None else args.max_stories
    print(build_explorer(profile, max_stories_per_cell=limit))
    return 0
