"""squall data node: LMDB-backed payload store (issue 4)."""
