"""What a host needs before a cell runs: the deployed worker, scratch directories, source files and
filesystems (each provisioned, described and undone on every exit path)."""
