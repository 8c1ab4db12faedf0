"""Shared pieces of squall: wire models, names and pids, errors, clocks, configuration."""
