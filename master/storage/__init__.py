"""The master's durable state: the write-ahead log, the LMDB index, and the group commit that
joins them."""
