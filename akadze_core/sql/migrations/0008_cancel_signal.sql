-- revoke(terminate=True) / `akadze jobs cancel --terminate`: a cancel request that also asks
-- the worker running the job to end the body's process with this signal (its number).
-- NULL: a plain cancel request (the body runs on). A nullable column without a default:
-- adding it does not rewrite the table.

ALTER TABLE akadze.jobs ADD COLUMN cancel_signal smallint;
