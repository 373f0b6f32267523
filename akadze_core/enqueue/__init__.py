"""Putting jobs in the queue: tasks and their ways to enqueue (now, later, in the caller's
transaction, in bulk) and workflows (chains, fan-out/fan-in, errbacks)."""
