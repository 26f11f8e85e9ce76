--[[ claim.lua: the library's function claim: take the pending usage of
one or more tenants, each as one batch for the worker.

For each tenant: if a batch is already in flight (a worker died, or
another one is flushing it), that batch is returned again, unchanged, so
that it is recorded in Postgres exactly once (by its sequence, below).
Otherwise the pending usage is moved to the flushing hash, tagged with the
new batch id and sequence: the pending hash is renamed, and the "p" fields
of the state hash (state.lua) are moved (summed into the same fields when
both hold an hour and meter; a "units,requests" field into its |u and |r)
and deleted from it (each_pending, lua/pending_fields.lua). Admissions from
then on count from zero again. All in one call: nothing is counted twice
or lost between the two.

One call claims many tenants (the worker sends up to 64): the call itself
costs Redis more than a tenant's claim does. On a single server the
tenants may be any; in a cluster they share a hash slot (their keys must).

KEYS, three a tenant (its hash tag {t:<id>}), tenant after tenant:
  <prefix>:v1:{t:<id>}:pending   hash "<hour unix s>|<meter>|u|r|x|o" -> count
  <prefix>:v1:{t:<id>}:flushing  hash: the same fields plus "batch" -> batch id, "seq" -> sequence
  <prefix>:v2:{t:<id>}           the state hash: "p<hour>|<meter>|" ... fields
ARGV
  [1] TTL of the flushing hashes, ms (bounds an abandoned batch)
  then two a tenant, tenant after tenant:
  a new batch id (used only when no batch is in flight)
  the id of a batch of this tenant that Postgres recorded and the worker
      has not dropped yet, or "": if it is the batch in flight, it is
      dropped first (as finish.lua would), so the claim takes what is
      pending since. The worker drops the batches it recorded this way, in
      its next claim of the tenant, rather than by a call of their own.
Return: an array with one answer a tenant, in order: {} when there is
nothing to flush, else the flat HGETALL of the flushing hash (its "batch"
field names the batch, its "seq" field is the batch's sequence, its
"prev" field, when the claim was marked, the sequence of the batch
claimed before it, 0 for none).

The state hash keeps the sequence of the tenant's last claimed batch
("lc"), written in the same call as the claim (the claim is marked; a
tenant whose hash holds pending fields only is not): a batch's "prev" is
the last batch Redis claimed of the tenant before it, which the ledger
recorded last, unless Redis went back to older data since (a restart from
files behind its last writes, a failover to a replica that lagged): then
"prev" is an earlier recorded batch, and the batch holds usage the ledger
recorded already, in batches Redis forgot it claimed (internal/billing,
newBatches: it is not recorded).

The sequence orders a tenant's batches for the ledger, which remembers the
last it recorded of each tenant (usage_flushed) and records a batch, once,
only if its sequence is greater: Redis' clock in microseconds, which grows
from one batch of a tenant to the next (a batch is claimed only after the
one before it was recorded and dropped). Should the clock go back, the
ledger still records a batch it finds in flight and has not recorded
(internal/billing, rescue). A batch claimed by a release before sequences
has no "seq": the ledger records it by its id, in usage_batches, as that
release did.
]]
do
-- hincrby adds n to field name of the hash key (each_pending's f).
local function hincrby(key, name, n)
  redis.call('HINCRBY', key, name, n)
end

-- claim_one claims one tenant's usage: pending, flushing and state are its
-- keys, id the new batch id, seq its sequence, ttl the flushing hash's,
-- drop the recorded batch to drop first ("" for none).
local function claim_one(pending, flushing, state, id, seq, ttl, drop)
  local in_flight
  if drop ~= '' and redis.call('HGET', flushing, 'batch') == drop then
    redis.call('DEL', flushing)
    in_flight = false
  else
    in_flight = redis.call('EXISTS', flushing) == 1
  end
  if not in_flight then
    local moved = {}
    local prev
    local h = redis.call('HGETALL', state)
    for i = 1, #h, 2 do
      if string.byte(h[i], 1) == 112 then -- 'p'
        moved[#moved + 1] = h[i]
      elseif h[i] == 'lc' then
        prev = h[i + 1]
      end
    end
    local has_pending = redis.call('EXISTS', pending) == 1
    if #moved == 0 and not has_pending then
      return {}
    end
    if has_pending then
      redis.call('RENAME', pending, flushing)
    end
    each_pending(h, hincrby, flushing)
    if #moved > 0 then
      redis.call('HDEL', state, unpack(moved))
    end
    -- The mark, only on a tenant with limit state: no hash is made for
    -- it, nor kept alive by it once the pending fields left.
    if #h / 2 > #moved then
      redis.call('HSET', state, 'lc', seq)
      redis.call('HSET', flushing, 'batch', id, 'seq', seq, 'prev', prev or '0')
    else
      redis.call('HSET', flushing, 'batch', id, 'seq', seq)
    end
    redis.call('PEXPIRE', flushing, ttl)
  end
  return redis.call('HGETALL', flushing)
end

function FN.claim()
  -- (one clock reading a call: each tenant's batches are claimed one
  -- call after another, so its sequences grow all the same)
  local t = redis.call('TIME')
  local seq = t[1] .. string.format('%06d', tonumber(t[2]))
  local out = {}
  for i = 1, #KEYS / 3 do
    out[i] = claim_one(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[2 * i], seq, ARGV[1], ARGV[2 * i + 1])
  end
  return out
end
end
