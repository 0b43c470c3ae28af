"""Command transport: `Host` runs argv lists on localhost (subprocess) or over SSH (paramiko)."""
from zcorch.hosts.local import CommandResult, Host, LocalHost, Process

__all__ = ["CommandResult", "Host", "LocalHost", "Process"]
