--[[ policy_run.lua: policies decided on their own, outside a tenant's
admission script: the reservation of policies whose keys live in another
Redis Cluster slot than the tenant's (scopes global and ip), its rollback,
the release of concurrency leases, and the tests that hold each algorithm to
its Go model. Preludes: state.lua (clock, idiv, fmt), policy.lua (the
framework) and the algorithms (policy_windows.lua, policy_rates.lua).

KEYS[1..n] the policies' keys (one slot each call in Redis Cluster)
ARGV
  [1] layout   unused here (state.lua reads it)
  [2] now_us   explicit time in us; 0 = Redis TIME
  [3] mode     'admit' (decide all; commit all when every enforced and
               degrade policy admits), 'dry' (decide, write nothing),
               'undo' (roll back an admission of the same id and weights),
               'release' (end the leases of id)
  [4] id       the request's id
  [5] n        the number of policies
  [6..]        n groups of policy.lua's POLICY_ARGS

Return: allowed (1/0: every enforced policy admits, none degrades), now
(us), retry (us, the longest of the enforced refusals; -1 never), degraded
(1/0), then policy.lua's POLICY_ITEM integers per policy ('admit' and
'dry'; none for 'undo' and 'release').
]]

local now = clock(ARGV[2] + 0)
local mode, id, n = ARGV[3], ARGV[4], ARGV[5] + 0
if mode == 'undo' or mode == 'release' then
  for i = 0, n - 1 do
    local j = 6 + i * POLICY_ARGS
    local impl = policy_impl(ARGV[j])
    local p = {ARGV[j + 3] + 0, ARGV[j + 4] + 0, ARGV[j + 5] + 0, ARGV[j + 6] + 0, id = id}
    local f = impl and impl[mode]
    if f then f(KEYS[1 + i], now, ARGV[j + 2] + 0, p) end
  end
  return {1, now, 0, 0}
end
local pass, degraded, retry, recs = policies_check(1, 6, n, now, id)
local ok = pass and not degraded
if ok and mode == 'admit' then policies_commit(recs, now) end
local res = {ok and 1 or 0, now, ok and 0 or retry, degraded and 1 or 0}
return policies_report(res, recs, ok and mode == 'admit')
