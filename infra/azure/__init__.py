"""Azure pieces: Event Hubs namespaces and their hubs."""
