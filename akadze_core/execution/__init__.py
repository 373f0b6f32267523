"""Running one job's body: the executor and the job context, on the event loop, on threads or
in child processes, behind the gate that holds a worker to its concurrency."""
