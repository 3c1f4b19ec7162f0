"""Command line: ``python -m sbm_pyg train ...``, ``python -m sbm_pyg gps
...``, ``python -m sbm_pyg large ...`` and ``python -m sbm_pyg plot DIR...``.
Bad arguments print a message and exit with code 2."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    # A default shown only where it tells something: not None (required or
    # derived arguments), not twice where the help names it already.
    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        text = action.help or ""
        if action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sbm_pyg",
        epilog="also: python -m sbm_pyg.examples.gps (GPS graph transformers "
               "on a generated long-range ring task; --help for its options)")
    sub = parser.add_subparsers(dest="command", required=True)
    from sbm_pyg.experiments.arguments import add_train_arguments, check_train_arguments
    show_defaults = _DefaultsFormatter
    train_parser = sub.add_parser("train", help="train an SBM-Transformer or a baseline",
                                  formatter_class=show_defaults)
    add_train_arguments(train_parser)
    from sbm_pyg.experiments.gps import GPS_PRESETS, add_gps_arguments
    gps_parser = sub.add_parser("gps", help="GraphGPS on PATTERN or CLUSTER with "
                                "SBM, dense, Performer or no global attention",
                                formatter_class=show_defaults)
    add_gps_arguments(gps_parser)
    from sbm_pyg.experiments.large import add_large_arguments
    large_parser = sub.add_parser("large", help="community classification on one "
                                  "large graph: GPS with SBM, Performer or no "
                                  "attention, SGFormer, Polynormer",
                                  formatter_class=show_defaults)
    add_large_arguments(large_parser)
    plot_parser = sub.add_parser("plot", help="plot loss, accuracy and density of runs",
                                 formatter_class=show_defaults)
    plot_parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    plot_parser.add_argument("--out", type=Path, default=None,
                             help="the PNG to write; without it, runs.png in "
                                  "the runs' common parent directory")
    args = parser.parse_args(argv)
    if args.command == "train" and args.preset is not None:
        # A preset only changes defaults: parse again so that arguments
        # given on the command line still win.
        from sbm_pyg.experiments.arguments import preset_defaults
        train_parser.set_defaults(**preset_defaults(args.preset,
                                                    args.target_density))
        args = parser.parse_args(argv)
    if args.command == "gps":
        return _gps(parser, gps_parser, GPS_PRESETS, args, argv)
    if args.command == "large":
        return _large(large_parser, args)
    if args.command == "train":
        check_train_arguments(train_parser, args)
        if args.resume:
            from sbm_pyg.experiments.resume import resolve_resume
            resolve_resume(train_parser, args,
                           list(sys.argv[1:] if argv is None else argv))
        from sbm_pyg.experiments.train import train
        final = train(args)
        print(json.dumps(final, indent=1))
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # A torchrun worker skips Python's teardown: destroying the gloo
            # process group (torch 2.13) can deadlock, the main thread
            # holding the GIL while joining gloo's thread, which needs the GIL
            # to free the last collective's tensors (seen 1 run in 7).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return 0
    missing = [str(r) for r in args.runs if not (r / "metrics.jsonl").exists()]
    if missing:
        plot_parser.error(f"no metrics.jsonl in {', '.join(missing)}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        plot_parser.error("plotting needs matplotlib: pip install matplotlib "
                          "(or the package's extra, pip install '.[plot]')")
    out = args.out or Path(os.path.commonpath(
        [str(r.resolve().parent) for r in args.runs])) / "runs.png"
    from sbm_pyg.experiments.plot import plot_runs
    print(plot_runs(args.runs, out))
    return 0


def _gps(parser, gps_parser, presets, args, argv) -> int:
    if args.preset is not None:  # defaults only: the command line still wins
        gps_parser.set_defaults(**presets[args.preset])
        args = parser.parse_args(argv)
    from sbm_pyg.experiments.gps import RESUMABLE, train_gps, validate_gps_arguments
    try:
        validate_gps_arguments(args)
    except ValueError as e:
        gps_parser.error(str(e))
    if args.resume:
        from sbm_pyg.experiments.resume import resolve_resume
        resolve_resume(gps_parser, args, list(sys.argv[1:] if argv is None else argv),
                       resumable=RESUMABLE)
    final = train_gps(args)
    print(json.dumps({k: v for k, v in final.items() if k != "args"}, indent=1))
    return 0


def _large(large_parser, args) -> int:
    from sbm_pyg.experiments.large import train_large, validate_large
    try:
        validate_large(args)
    except ValueError as e:
        large_parser.error(str(e))
    final = train_large(args)
    print(json.dumps({k: v for k, v in final.items() if k != "args"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
