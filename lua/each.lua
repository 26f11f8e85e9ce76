--[[ each.lua: the library's function each: run one of the worker's
per-tenant functions (claim, finish or pending) for many tenants in one
call (internal/redisfn, each.go: PipelinedEach).

Each item is run exactly as the function runs in a call of its own, with
its own keys and arguments as KEYS and ARGV, one after the other. In a
Redis Cluster every key of the call is in one slot: the items' tenants
share it.

KEYS  each item's k keys, one item after another
ARGV  [1] the function's name: 'claim', 'finish' or 'pending' (any other
      is refused: an error, and nothing runs)
      [2] k, the keys of an item; [3] a, the arguments of an item;
      [4] n, the items; then each item's a arguments, one item after
      another

Return: an array of n answers, each the function's answer to its item
alone (nested arrays for claim's HGETALL; false for a nil answer, which
would cut the array short), or, for an item that raised an error or
answered one, that error after 'EACH ' (the others run as they would
without it; the caller runs that item again alone, for its own answer).
]]
do
-- runs are the functions each may run.
local runs = {claim = true, finish = true, pending = true}

function FN.each()
  local keys, args = KEYS, ARGV
  local name = args[1]
  if not runs[name] then
    return redis.error_reply('ERR each runs claim, finish or pending, not ' .. tostring(name))
  end
  local k, a, n = tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  if not (k and a and n) or k < 0 or a < 0 or n < 0 or #keys ~= k * n or #args ~= 4 + a * n then
    return redis.error_reply('ERR each: ' .. #keys .. ' keys and ' .. #args ..
      ' arguments do not make n items of k keys and a arguments')
  end
  local f = FN[name]
  local out = {}
  for i = 1, n do
    local ik, ia = {}, {}
    for j = 1, k do ik[j] = keys[(i - 1) * k + j] end
    for j = 1, a do ia[j] = args[4 + (i - 1) * a + j] end
    KEYS, ARGV = ik, ia
    local ok, r = pcall(f)
    if not ok or type(r) == 'table' and r.err then
      -- (prefixed: a client reads some errors, such as OOM or MOVED, as
      -- the answer to the whole call)
      local e = type(r) == 'table' and r.err or tostring(r)
      r = redis.error_reply('EACH ' .. e)
    elseif r == nil then
      r = false
    end
    out[i] = r
  end
  return out
end
end
