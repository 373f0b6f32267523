"""What a job is and the pure rules about it: the Job record, its errors, its JSON, the
retry rule, how a run ended, task ids, and how to name a database without its password.
Nothing here opens a connection or imports another room of akadze_core."""
