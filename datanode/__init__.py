"""squall data node: stores task payloads in LMDB, replicates them and reports to the master."""
