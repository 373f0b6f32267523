"""The worker: its lifecycle and settings, and the rooms it is built of (the lease, the
producer, the runs in flight, the completer, remote control, the maintenance services)."""
