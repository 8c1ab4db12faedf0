"""The master's view of the data nodes: node records, placement of new payloads, re-
replication, blob garbage collection, decommissioning."""
