"""The data node's blob store: payloads as CRC32C-checked chunks in LMDB, its writer, reads,
uploads and scrubbing."""
