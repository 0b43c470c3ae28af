"""Running a plan on two hosts: the per-run runner, the iperf3/dd baselines and the hosts' metadata."""
