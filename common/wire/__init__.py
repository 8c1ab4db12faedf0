"""The wire contract: pydantic models of the v1 protocol, names and pids, the payload batch
frame."""
