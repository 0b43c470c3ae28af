"""Options shared by several commands (not a command itself): --hosts and --set of `zcorch run` and `zcorch plan`;
--metric, --threshold and --alpha of `zcorch compare` and `zcorch history`."""
from __future__ import annotations

import argparse
import os

from zcorch import metrics
from zcorch.config.inventory import ENV_VAR, FLAG, from_environment, select
from zcorch.errors import ConfigError


def add_hosts_and_set(p: argparse.ArgumentParser, resume: bool = False) -> None:
    """--hosts and --set, shared by `zcorch run` and `zcorch plan`."""
    env = f"; the env {ENV_VAR} does the same (this flag wins)"
    hosts = p.add_argument(FLAG, dest="hosts", metavar="INVENTORY[:PAIR]",
                           help="run on a pair of hosts of an inventory file instead of the experiment's hosts: "
                                f"PAIR, or the only/first pair{env}" +
                                ("; with --resume: instead of the hosts the result set recorded (the env is "
                                 "not read then)" if resume else ""))
    hosts.completer = _complete_hosts   # argcomplete: the file, then the pair names after `FILE:`
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="change the experiment: a dotted key (repeats, baselines.dd.count, matrix.send_mode) "
                        "or a parameter (bytes: the matrix axis if there is one, else params.bytes) = a YAML "
                        "value (64MiB, [write,splice]); repeatable, validated as the file is")


def _complete_hosts(prefix: str, **kwargs) -> "list[str]":
    if ":" in prefix:
        from zcorch.config.inventory import complete_spec

        return complete_spec(prefix)
    from argcomplete.completers import FilesCompleter

    return list(FilesCompleter()(prefix, **kwargs))


def hosts_from_args(args: argparse.Namespace, environ=None):
    """The inventory pair of --hosts, else of ZCORCH_HOSTS (not with --resume: the recorded hosts), else None."""
    if getattr(args, "resume", None):
        return select(args.hosts) if args.hosts is not None else None
    return from_environment(args.hosts, os.environ if environ is None else environ)


def add_regression_options(p: argparse.ArgumentParser, what: str, threshold: float, alpha: float) -> None:
    """--metric, --threshold, --alpha: how `compare` and `history` decide a regression (each command its defaults:
    zcorch.analysis.gate); the metrics are those of zcorch.metrics with a better direction."""
    higher = [m for m in metrics.DIRECTED if metrics.get(m).better == "higher"]
    p.add_argument("--metric", choices=metrics.DIRECTED, default="gbit_s", metavar="METRIC",
                   help=f"what to {what} (default gbit_s): one of {', '.join(metrics.DIRECTED)}; higher is better "
                        f"for {', '.join(higher)}, lower for the others (CPU: a rise is a regression)")
    p.add_argument("--threshold", type=float, default=threshold, metavar="PCT",
                   help=f"ignore changes up to this many percent (default {threshold:g})")
    p.add_argument("--alpha", type=float, default=alpha,
                   help=f"significance level (default {alpha:g})")


def check_regression_options(args: argparse.Namespace) -> None:
    if args.threshold < 0:
        raise ConfigError(f"--threshold must be >= 0, got {args.threshold}")
    if not 0 < args.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, got {args.alpha}")
