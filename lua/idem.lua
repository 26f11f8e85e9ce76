--[[ idem.lua: the answer half of an idempotency record (see admit.lua).

admit.lua writes the record of a first request with an Idempotency-Key as
'run' while the request is in flight. Once the answer is known, the API node
either stores it ('store': the record becomes 'done', and later requests
with the key are answered from it) or gives the key back ('release': the
request was refunded, so it did not happen and a retry must run again).
Both act only on the record of the same request (same fingerprint) still in
'run': a record that expired and was taken by a newer request is left alone.

KEYS
  KEYS[1] <prefix>:v1:{t:<id>}:idem2:<sha256 hex of the key>  hash (admit.lua)

ARGV
  [1] op      'store' | 'release'
  [2] fp      the request's fingerprint
  for 'store':
  [3] status  HTTP status of the answer
  [4] hdr     the stored headers, "name: value" lines joined by "\n"
  [5] body    the answer's body (the Go side bounds its size)

Return: 1 when the record was changed, 0 when it was not this request's.
The record keeps the expiry admit.lua gave it (24 h after the first
decision).
]]
local h = redis.call('HMGET', KEYS[1], 'fp', 'st')
if h[1] ~= ARGV[2] or h[2] ~= 'run' then
  return 0
end
if ARGV[1] == 'release' then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'st', 'done', 'status', ARGV[3], 'hdr', ARGV[4], 'body', ARGV[5])
end
return 1
