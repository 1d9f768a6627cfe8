-- idemproxy's inbox and fence for PostgreSQL (docs/database.md).
-- Every client ships a byte-identical copy of this file; apply it once per
-- database, with your own migration tool or psql -f. Both tables may live in
-- any schema on the search_path.

-- One row per key whose effect is committed: a second delivery of the key
-- (a copy, a redelivery, or a Redis that forgot its done mark) finds it and
-- changes nothing.
CREATE TABLE IF NOT EXISTS idemproxy_inbox (
    key      text        PRIMARY KEY,
    stream   text        NOT NULL,
    entry_id text        NOT NULL,
    token    bigint      NOT NULL,             -- fencing token it was written under, 0 without fencing
    done_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per lock (Delivery.lock): the highest fencing token that has
-- written. A holder with a lower token lost its lease to that one, and its
-- transaction is refused.
CREATE TABLE IF NOT EXISTS idemproxy_fence (
    lock  text   PRIMARY KEY,
    token bigint NOT NULL
);
