"""Command line used by the Makefile: ``python -m storybias.cli <command> ...``.

    check-params PARAMS        validate a profile (exit 2 with the problems, naming key and file)
    stamps PARAMS              write data/<run>/.params/<stage>.params (content changes only)
    run-name PARAMS            print the run's name
    prepare-model              assemble, verify and convert the embedded model (once)
    generate PARAMS            stage 01 outside a notebook (the notebook calls the same function)
    bench-generate PARAMS      time stage 01's engine path against a bare LLM.chat call
"""

from __future__ import annotations

import argparse
import sys


def _load(path: str):
    from .params import ParamsError, load

    try:
        return load(path)
    except ParamsError as exc:
        print(f"storybias: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storybias")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("check-params", "stamps", "run-name", "generate"):
        sub.add_parser(name).add_argument("params")
    sub.add_parser("prepare-model")
    bench = sub.add_parser("bench-generate")
    bench.add_argument("params")
    bench.add_argument("--n-prompts", type=int, default=24)
    bench.add_argument("--repeats", type=int, default=2)
    bench.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args(argv)

    if args.command == "check-params":
        p = _load(args.params)
        print(f"{p.source}: OK (run '{p.run_name}'; designs: {', '.join(p.enabled_designs())}; "
              f"models: {', '.join(m.name for m in p.generation.models)})")
    elif args.command == "run-name":
        print(_load(args.params).run_name)
    elif args.command == "stamps":
        from . import paths
        from .params import write_stage_stamps

        p = _load(args.params)
        write_stage_stamps(p, paths.run_dir(p.run_name) / ".params")
    elif args.command == "prepare-model":
        from .models import prepare_embedded

        prepare_embedded()
    elif args.command == "generate":
        from . import generate

        p = _load(args.params)
        generate.prepare_models(p)
        generate.run(p)
    elif args.command == "bench-generate":
        from .bench import bench_generate

        bench_generate(_load(args.params), n_prompts=args.n_prompts, repeats=args.repeats, max_tokens=args.max_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
