"""Configuration: experiment files read with positions (yamlsrc), validated into a typed `Experiment`."""
