"""squall master: task metadata, leases and placement, durable in a WAL with an LMDB index."""
