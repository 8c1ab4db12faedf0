"""Replicated writes and node-to-node traffic: the write pipeline, the peer client, the pace of
repair copies."""
