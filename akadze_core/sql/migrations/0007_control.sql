-- Remote control (Celery's app.control / inspect): requests to live workers, their replies.
-- The sender picks the targets among the live workers; each target answers once by writing
-- its reply row (NULL reply: handled, nothing to say), so a request is never run twice by a
-- worker and a dead worker simply never answers. Both tables stay tiny: expired requests
-- and their replies are pruned by the workers.

CREATE TABLE akadze.control_requests (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    command    text        NOT NULL,
    arguments  jsonb       NOT NULL DEFAULT '{}',
    -- akadze.workers ids, chosen by the sender among the live workers.
    targets    bigint[]    NOT NULL,
    reply      boolean     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Past it no worker takes the request up any more (Celery's control_queue_ttl).
    expires_at timestamptz NOT NULL
);

-- No foreign key to the requests: a reply written as its request is pruned must not fail
-- (a worker would take that for a broken schema); orphans are pruned with the requests.
CREATE TABLE akadze.control_replies (
    request_id  bigint      NOT NULL,
    worker_id   bigint      NOT NULL,
    worker_name text        NOT NULL,
    reply       jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, worker_id)
);
