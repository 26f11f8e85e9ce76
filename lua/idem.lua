--[[ idem.lua: the library's function idem: the answer half of an
idempotency record (see admit.lua), and the tenant's room for records.

admit.lua writes the record of a first request with an Idempotency-Key as
'run' while the request is in flight. Once the answer is known, the API node
either stores it ('store': the record becomes 'done', and later requests
with the key are answered from it) or gives the key back ('release': the
request was refunded, so it did not happen and a retry must run again).
Both act only on the record of the same request (same fingerprint) still in
'run': a record that expired and was taken by a newer request is left alone.

The room (quota.AnswerLimits) bounds a tenant's records and the bytes of
their answers. Every request that may write a record holds a claim: a
member of the sorted set KEYS[1], named by the request's claim id (random,
one per request), scored by the time the room frees (ms), with its bytes
in the hash KEYS[2] (field: the claim id; field '$': the sum of all).
  'claim', before the admission: a live record of the key that decides the
    request (another fingerprint: 422; in flight: 409; an answer: a
    replay) takes no room (answer 0). Otherwise the
    request may write a record: it takes one record and reserve bytes (the
    largest answer it may store), scored the record's 24 hours from now
    plus MARGIN (the admission comes after the claim), and answers 1; or,
    when that would pass max answers or max bytes, takes nothing and
    answers -1 with the wait until enough claims expire.
  'count', after an admission that wrote a record without a claim (the
    record that decided at the claim expired, was released or passed its
    lease by the admission): the claim is taken without the bound, which
    still holds for the records Redis keeps (the new record replaces the
    one that decided, whose claim goes with it, or when it expires).
  'unclaim', after an admission that wrote no record: the claim goes.
  'store' scores the claim by the record's own expiry and sizes it to the
    stored answer (status, headers and body: never more than the
    reservation); 'release' drops it. Both drop the claim when the record
    is no longer this request's (a newer request that took the key holds
    its own).
  'room' answers the claims and bytes held.
Claims past their score are dropped at the start of every call (at most
PURGE of them per call, so that no call runs long; the rest go with the
next calls): a record frees its room when it expires. A claim whose node
died before storing or releasing frees its room at its own score, MARGIN
after its record expires. Both keys live as long as their longest claim.

KEYS
  KEYS[1] <prefix>:v1:{t:<id>}:idemroom   sorted set: claim id -> ms the room frees
  KEYS[2] <prefix>:v1:{t:<id>}:idembytes  hash: claim id -> bytes; '$' -> the sum
  KEYS[3] <prefix>:v1:{t:<id>}:idem2:<sha256 hex of the key>  the record
          (admit.lua), all but for 'room'

ARGV
  [1] op      'claim' | 'count' | 'unclaim' | 'store' | 'release' | 'room'
  [2] now     explicit time in ms; 0 = Redis TIME (tests only)
  [3] claim   the request's claim id (not for 'room')
  [4] fp      the request's fingerprint (not for 'room')
  for 'claim': [5] reserve bytes, [6] max answers, [7] max bytes
  for 'count': [5] reserve bytes
  for 'store': [5] status, [6] headers ("name: value" lines joined by
               "\n"), [7] body, [8] the reservation: an answer (headers and
               body) larger than it is an error (the Go side bounds both)

Return
  'claim': {code, retry ms, claims, bytes}: code 1 taken, 0 a live record
           decides (nothing taken), -1 full (nothing taken; retry: the wait
           until the expiries alone make room, at least; -1 when none
           would); claims and bytes after the call
  'count', 'unclaim': 1
  'store', 'release': 1 when the record was changed, 0 when it was not
           this request's
  'room': {claims, bytes}
The record keeps the expiry admit.lua gave it (24 h after the first
decision).

Units: times are integer ms since the Unix epoch (the record's 'lease' and
'at' are admit.lua's us); bytes are string lengths.
]]

do
local DAY_MS = 86400000
local MARGIN_MS = 300000 -- the claim's lead over its record: the admission (and a queue's wait) follows the claim
local PURGE = 1024       -- claims dropped per call at most
local WALK = 64          -- claims a refusal walks to find when the bytes free

-- The keys and values of the call running, set at idem's entry (Redis
-- runs one function at a time): the keys, the claim id and fingerprint,
-- now (ms) and shift, which moves the keys' expiry of an explicit past
-- time to as long as it would have lived (tests).
local ROOM, BYTES, REC, id, fp, now, shift

local function total()
  return tonumber(redis.call('HGET', BYTES, '$') or '0')
end

-- drop removes claims (their bytes off the sum).
local function drop(ids)
  if #ids == 0 then return end
  local sizes = redis.call('HMGET', BYTES, unpack(ids))
  local sum = 0
  for _, v in ipairs(sizes) do
    if v then sum = sum + tonumber(v) end
  end
  redis.call('ZREM', ROOM, unpack(ids))
  redis.call('HDEL', BYTES, unpack(ids))
  if sum ~= 0 then redis.call('HINCRBY', BYTES, '$', fmt(-sum)) end
end

local function purge()
  drop(redis.call('ZRANGEBYSCORE', ROOM, '-inf', fmt(now), 'LIMIT', 0, PURGE))
end

-- put sets the claim id to free at ms with bytes; both keys then live past
-- every claim (no claim is scored past now + a day + the margin).
local function put(ms, bytes)
  local old = tonumber(redis.call('HGET', BYTES, id) or '0')
  redis.call('ZADD', ROOM, fmt(ms), id)
  redis.call('HSET', BYTES, id, fmt(bytes))
  if bytes ~= old then redis.call('HINCRBY', BYTES, '$', fmt(bytes - old)) end
  local until_ms = fmt(now + DAY_MS + 2 * MARGIN_MS + shift)
  redis.call('PEXPIREAT', ROOM, until_ms)
  redis.call('PEXPIREAT', BYTES, until_ms)
end

-- decides reports whether a live record of the key answers the request
-- without a new record (admit.lua's idempotency codes 1, 2, 3).
local function decides()
  local h = redis.call('HMGET', REC, 'fp', 'st', 'lease', 'at')
  if not h[1] or tonumber(h[4]) + DAY_MS * 1000 <= now * 1000 then
    return false
  end
  if h[1] ~= fp or h[2] == 'done' then return true end
  return tonumber(h[3]) > now * 1000
end

-- wait is the ms until the claims' expiries alone leave room for one more
-- claim of reserve bytes (at least: a refusal walks WALK claims at most for
-- the bytes), or -1 when none would.
local function wait(n, bytes, reserve, maxn, maxb)
  if reserve > maxb then return -1 end
  local at = now
  if n + 1 > maxn then
    local s = redis.call('ZRANGE', ROOM, n - maxn, n - maxn, 'WITHSCORES')
    if s[2] then at = math.max(at, tonumber(s[2])) end
  end
  local need = bytes + reserve - maxb
  if need > 0 then
    local s = redis.call('ZRANGE', ROOM, 0, WALK - 1, 'WITHSCORES')
    local ids = {}
    for i = 1, #s, 2 do ids[#ids + 1] = s[i] end
    if #ids > 0 then
      local sizes = redis.call('HMGET', BYTES, unpack(ids))
      local freed, last = 0, now
      for i, v in ipairs(sizes) do
        last = tonumber(s[2 * i])
        freed = freed + tonumber(v or '0')
        if freed >= need then break end
      end
      at = math.max(at, last)
    end
  end
  return math.max(at - now, 1)
end

function FN.idem()
ROOM, BYTES, REC = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]
id, fp = ARGV[3], ARGV[4]

local t = redis.call('TIME')
local real = t[1] * 1000 + math.floor(t[2] / 1000)
now = ARGV[2] + 0
if now <= 0 then now = real end
shift = 0
if real > now then shift = real - now end

purge()
if op == 'room' then
  return {redis.call('ZCARD', ROOM), total()}
end

if op == 'claim' then
  local reserve, maxn, maxb = ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0
  local n, bytes = redis.call('ZCARD', ROOM), total()
  if decides() then return {0, 0, n, bytes} end
  if redis.call('ZSCORE', ROOM, id) then
    -- (a claim is taken once per request; taken again, it is the same)
    return {1, 0, n, bytes}
  end
  if n + 1 > maxn or bytes + reserve > maxb then
    return {-1, wait(n, bytes, reserve, maxn, maxb), n, bytes}
  end
  put(now + DAY_MS + MARGIN_MS, reserve)
  return {1, 0, n + 1, bytes + reserve}
end

if op == 'count' then
  put(now + DAY_MS + MARGIN_MS, ARGV[5] + 0)
  return 1
end

if op == 'unclaim' then
  drop({id})
  return 1
end

-- 'store' and 'release' act on the record of this request in 'run' only
local h = redis.call('HMGET', REC, 'fp', 'st', 'at')
if h[1] ~= fp or h[2] ~= 'run' then
  drop({id})
  return 0
end
if op == 'release' then
  redis.call('DEL', REC)
  drop({id})
else
  local size = #ARGV[6] + #ARGV[7]
  if size > ARGV[8] + 0 then
    return redis.error_reply('idem: an answer of ' .. size .. ' bytes passes its reservation')
  end
  redis.call('HSET', REC, 'st', 'done', 'status', ARGV[5], 'hdr', ARGV[6], 'body', ARGV[7])
  -- the claim frees when the record expires: its first decision's time
  -- (us, rounded up to the ms) + 24 h
  put(-math.floor(-tonumber(h[3]) / 1000) + DAY_MS, size)
end
return 1
end
end
