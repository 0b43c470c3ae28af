"""The two-host network-namespace rig (`zcorch lab up|down|status`): real sshd hosts on one machine."""
