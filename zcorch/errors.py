"""The user-mistake family: every ZcorchError is printed by the CLI without a traceback; anything else that
escapes is a bug and crashes loudly. Stdlib-only: deployed with the worker."""
from __future__ import annotations


class ZcorchError(Exception):
    """A problem the user can fix (bad input, missing tool, unreachable host...)."""

    exit_status = 1


class ConfigError(ZcorchError):
    """An experiment file (or a command-line value) is invalid. Exit status 2, as argparse."""

    exit_status = 2

    def __init__(self, problems: "list[str] | str"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class WorkerError(ZcorchError):
    """The native transfer core refused or failed (code and text from the C library)."""

    def __init__(self, code: int, message: str):
        self.code = code
        super().__init__(message)


class HostError(ZcorchError):
    """A host could not be reached, or a command on it failed (names the host)."""


class DeployError(HostError):
    """Upload or remote build of the worker failed (names the host, carries compiler output)."""


class PreflightError(HostError):
    """A host lacks something the sweep needs; the message names the host and the fix."""


class LabError(ZcorchError):
    """The network-namespace lab could not be set up or torn down."""


class ResultsError(ZcorchError):
    """A result set is missing, malformed, or of an unknown format version."""

    exit_status = 2  # an input error, as a bad experiment file: 1 is a regression or a failed run


class ResultsWriteError(ResultsError):
    """A result set could not be written (disk full, permissions): the sweep failed, the input was fine."""

    exit_status = 1


class ResultSetBusy(ResultsError):
    """Another `zcorch run` holds the result set (its lock): exit status 75 (EX_TEMPFAIL: try again later)."""

    exit_status = 75


class SignalInterrupt(KeyboardInterrupt):
    """A signal other than SIGINT that ends a sweep as Ctrl-C does (SIGTERM), saying which it was."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def interrupt_name(exc: BaseException) -> str:
    """What interrupted: "SIGTERM" (or another signal's name) for a SignalInterrupt, "SIGINT (Ctrl-C)" else."""
    import signal

    if isinstance(exc, SignalInterrupt):
        try:
            return signal.Signals(exc.signum).name
        except ValueError:
            return f"signal {exc.signum}"
    return "SIGINT (Ctrl-C)"
