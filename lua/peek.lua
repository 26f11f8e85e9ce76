--[[ peek.lua: the library's read-only functions meter_peek and spend_peek:
a tenant's meter quotas and spend cap as they stand, with the call's clock
(Redis TIME), for usage pages and headers outside an admission
(internal/ratelimit's PeekMeterQuotas and PeekSpendCap do the arithmetic).

meter_peek
  KEYS[1] the meter quotas' hash (admit.lua, "Meter quotas")
  ARGV    the fields to read (the meters)
  Return: TIME's seconds and microseconds, then each field's value ('' when
  absent).
spend_peek
  KEYS[1] the state hash (state.lua), KEYS[2] the meter quotas' hash
  Return: TIME's seconds and microseconds, the state's field q (the month's
  id and overage units) and the meter quotas' '$' (their overage
  millicents of a month); '' when absent.
]]

function FN.meter_peek()
  local t = redis.call('TIME')
  local v = redis.call('HMGET', KEYS[1], unpack(ARGV))
  local out = {t[1], t[2]}
  for i = 1, #ARGV do out[#out + 1] = v[i] or '' end
  return out
end

function FN.spend_peek()
  local t = redis.call('TIME')
  return {t[1], t[2], redis.call('HGET', KEYS[1], 'q') or '', redis.call('HGET', KEYS[2], '$') or ''}
end
