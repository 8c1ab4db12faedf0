"""A master set: the quorum-replicated log, epochs, the elector and the leader's role."""
