"""What every command module of the command line shares: reading the profile, reporting its problems."""

from __future__ import annotations

import argparse
import os
import sys

from storybias.config.overrides import SET_ENV
from storybias.config.params import Params, ParamsError, load


def load_profile(path: str) -> Params:
    """The profile at ``path`` with the overrides in STORYBIAS_SET (Make's SET); exit 2 naming the problem."""
    try:
        return load(path, os.environ.get(SET_ENV, ""))
    except ParamsError as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def refused(p: Params, problems: list[str]) -> bool:
    """Print ``problems`` as check-params does; True when there is one."""
    if problems:
        print(
            f"storybias: {p.source}: invalid parameters:\n" + "\n".join(f"  - {u}" for u in problems), file=sys.stderr
        )
    return bool(problems)


def command_after_dashes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The command a wrapper subcommand (hold-run, with-servers) runs: what follows ``--``; a usage error
    naming the subcommand when there is none."""
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error(f"{args.command}: give the command after --")
    return cmd
