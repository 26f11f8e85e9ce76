--[[ group.lua: grouped admissions, the library's function admitn.

Concurrent admissions of one tenant on one node go to Redis as one call
(internal/ratelimit/batch.go): admitn decides them in arrival order, each
exactly as admit (admit.lua) decides it alone, in one atomic call.

KEYS  each request's keys, one request after another (every key carries
      the tenant's hash tag: one Redis Cluster slot)
ARGV  [1] n, the requests; [2 .. 2n+1] for each request in turn its
      number of keys and its number of arguments; then each request's
      arguments, one request after another

Return: an array of n answers, each admit's answer to its request alone:
its integers, or its error reply (a request that raises an error is
answered that error; those before and after it are decided as they would
have been without it, since admit writes nothing before it has decided).
]]

function FN.admitn()
  local keys, args = KEYS, ARGV
  local n = tonumber(args[1])
  local out = {}
  local ki, ai = 0, 1 + 2 * n
  for i = 1, n do
    local nk, na = tonumber(args[2 * i]), tonumber(args[2 * i + 1])
    local k, a = {}, {}
    for j = 1, nk do k[j] = keys[ki + j] end
    for j = 1, na do a[j] = args[ai + j] end
    ki, ai = ki + nk, ai + na
    KEYS, ARGV = k, a
    local ok, r = pcall(FN.admit)
    if not ok then
      if type(r) ~= 'table' then r = redis.error_reply(tostring(r)) end
    end
    out[i] = r
  end
  KEYS, ARGV = keys, args
  return out
end
