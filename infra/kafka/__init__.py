"""Self-managed Kafka pieces: the mirror's ACLs."""
