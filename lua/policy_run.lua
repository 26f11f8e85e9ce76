--[[ policy_run.lua: the library's function policy_run: policies decided on
their own, outside a tenant's admission: the reservation of policies whose
keys live in another Redis Cluster slot than the tenant's (scopes global
and ip), its rollback, the release of concurrency leases, and the tests
that hold each algorithm to its Go model. It uses state.lua (clock, idiv,
fmt), policy.lua (the framework) and the algorithms (policy_windows.lua,
policy_rates.lua), earlier in the library.

KEYS[1..n] the policies' keys (one slot each call in Redis Cluster)
ARGV
  [1] now_us   explicit time in us; 0 = Redis TIME
  [2] mode     'admit' (decide all; commit all when every enforced and
               degrade policy admits), 'dry' (decide, write nothing),
               'undo' (roll back an admission of the same id and weights),
               'release' (end the leases of id)
  [3] id       the request's id
  [4] n        the number of policies
  [5..]        n groups of policy.lua's POLICY_ARGS
  [5+7n] chan  optional: the pub/sub channel on which 'release' and 'undo'
               announce a slot that came back to a full queue policy
               (how 1) whose release returns true (concurrency), the
               policy's key as the message; absent or '' announces nothing

Return: allowed (1/0: every enforced policy admits, none degrades), now
(us), retry (us, the longest of the enforced refusals; -1 never), degraded
(1/0), then policy.lua's POLICY_ITEM integers per policy ('admit' and
'dry'; none for 'undo' and 'release').
]]

function FN.policy_run()
policies_begin()
local now = clock(ARGV[1] + 0)
local mode, id, n = ARGV[2], ARGV[3], ARGV[4] + 0
if mode == 'undo' or mode == 'release' then
  -- waiters of a queue policy wait for its slots: tell them of one only
  -- when it was full (a PUBLISH reaches every API node, and in a Redis
  -- Cluster crosses the cluster bus)
  local chan = ARGV[5 + n * POLICY_ARGS] or ''
  for i = 0, n - 1 do
    local j = 5 + i * POLICY_ARGS
    local impl = policy_impl(ARGV[j])
    local p = {ARGV[j + 3] + 0, ARGV[j + 4] + 0, ARGV[j + 5] + 0, ARGV[j + 6] + 0, id = id}
    local f = impl and impl[mode]
    if f and f(KEYS[1 + i], now, ARGV[j + 2] + 0, p) and ARGV[j + 1] + 0 == 1 and chan ~= '' then
      redis.call('PUBLISH', chan, KEYS[1 + i])
    end
  end
  return {1, now, 0, 0}
end
local pass, degraded, retry, recs = policies_check(1, 5, n, now, id)
local ok = pass and not degraded
if ok and mode == 'admit' then policies_commit(recs, now) end
local res = {ok and 1 or 0, now, ok and 0 or retry, degraded and 1 or 0}
return policies_report(res, recs, ok and mode == 'admit')
end
