"""Task semantics: the engine that plans every verb, leases and their tokens, waiting leases,
policies, schedules, idempotency keys, queue statistics."""
