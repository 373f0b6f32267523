"""akadze_core's integrations with other frameworks (each imports its framework)."""
