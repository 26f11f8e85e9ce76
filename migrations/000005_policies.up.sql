-- Policies (API.md "Policies (v2)"): extra limits beside the tiers'. Each is
-- stored whole as the JSON of quota.Policy, validated in Go before it is
-- written (the algorithms' fields differ, and Validate names the bad one);
-- the table keeps the name a slug, the spec an object that carries the same
-- name. version counts the row's writes (1 when created).
CREATE TABLE policies (
    name       text PRIMARY KEY CHECK (name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    spec       jsonb NOT NULL CHECK (jsonb_typeof(spec) = 'object' AND spec->>'name' = name),
    version    bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
