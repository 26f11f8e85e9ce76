--[[ policy_windows.lua: fixed_window, sliding_log, sliding_window and
concurrency (see policy.lua for check/commit/undo/release and the item each
reports). internal/policyalg/windows.go is the pure-Go reference of each;
internal/ratelimit/policy_windows_test.go holds the two to identical
answers, key contents and expiries.

Common ground
  Times are integer us since the epoch (now > 0), weights integers >= 1;
  every quantity is an integer below 2^53, exact in a Lua double (the
  bounds of quota.Policy: windows <= 366 days, sliding_window's limit × bucket
  length < 2^52, sliding_log and concurrency limits <= 100000). Division is
  idiv (floor); a ceiling is -idiv(-x, y). Numbers go to Redis through fmt.
  A limit may be 0 (a param exception): nothing passes, retry -1.
  One key per policy instance, and every write sets or keeps an expiry at
  the time the key's state is empty again (rounded up to a millisecond; no
  other slack), so an abandoned key costs nothing after its window. The
  expiry is absolute in script time, shifted by (Redis TIME - now) when an
  explicit now lies in the past (admit.lua's rule), so that test state lives
  as long as it would have; with Redis time the shift is a few us.
  check writes nothing but the removal of what has expired (sliding_log's
  entries, sliding_window's old buckets, concurrency's dead leases), which
  changes no decision.

undo's now: fixed_window and sliding_window find the window or bucket an
admission went to from now, so undo must be given the admission's own time
(PolicyResult.Now); sliding_log and concurrency find it by p.id.

Everything is inside one block, run once when the library is loaded; only
POL's entries leave it (so that its locals do not count against the
library's 200).
]]

do
  -- pxat returns the PEXPIREAT / SET PXAT milliseconds of us (script time),
  -- rounded up so that a key never disappears before its state is empty;
  -- (TIME - now) is read once per call (policy.lua's POL_SHIFT).
  local function pxat(now, us)
    if not POL_SHIFT then
      local t = redis.call('TIME')
      local real = t[1] * US + t[2]
      POL_SHIFT = 0
      if real > now then POL_SHIFT = real - now end
    end
    return fmt(-idiv(-(us + POL_SHIFT), 1000))
  end

  --[[ fixed_window: p = limit L, window W (us).
  Windows are aligned to the epoch: window x = [x*W, (x+1)*W). The key is a
  string "x,count", the units admitted in window x; a key of another window
  counts as 0. Admit iff count + w <= L. reset = (x+1)*W, the window's end;
  retry = reset - now (the next window is empty and w <= L: it suffices,
  and nothing leaves the current one, so it is the earliest), -1 when w > L.
  remaining = L - count, less w when admitted (0 when L shrank below count).
  Bound: at most L units per aligned window, so at most 2L in any interval
  of length W (L at the end of one window, L at the start of the next: 2L
  is reached). Memory: one short string (MEMORY USAGE 80 bytes with a
  short key name).
  Commands: check GET; commit SET ... PXAT (the window's end).
  undo: subtracts w when the key still holds the window of now (the
  admission's time); at 0 the key goes. ]]
  local function fw_count(k, now, W)
    local x = idiv(now, W)
    local v = redis.call('GET', k)
    if v then
      local kx, c = string.match(v, '^(%-?%d+),(%-?%d+)$')
      if kx and kx + 0 == x then return x, c + 0 end
    end
    return x, 0
  end

  POL.fixed_window = {
    check = function(k, now, w, p)
      local L, W = p[1], p[2]
      local x, count = fw_count(k, now, W)
      local reset = (x + 1) * W
      local room = L - count
      if room < 0 then room = 0 end
      if w > L then return false, -1, L, room, reset, 0 end
      if count + w > L then return false, reset - now, L, room, reset, 0 end
      return true, 0, L, room - w, reset, 0, count
    end,
    commit = function(k, now, w, p, count)
      local W = p[2]
      local x = idiv(now, W)
      redis.call('SET', k, fmt(x) .. ',' .. fmt(count + w), 'PXAT', pxat(now, (x + 1) * W))
    end,
    undo = function(k, now, w, p)
      local x, count = fw_count(k, now, p[2])
      if count <= 0 then return end
      if count - w <= 0 then
        redis.call('DEL', k)
      else
        redis.call('SET', k, fmt(x) .. ',' .. fmt(count - w), 'KEEPTTL')
      end
    end,
  }

  --[[ sliding_log: p = limit L (<= 100000), window W (us).
  Exact: a sorted set of admissions, score = time t (us, >= 1), member
  "<w>|<id>" (unique per admission: ids are unique per request), plus one
  member '#' whose score is minus the sum of the weights of all the other
  members (<= 0, so it sorts first and no time range reaches it). An entry
  counts while t > now - W, and leaves at t + W.
  check: one ZRANGEBYSCORE -inf..now-W reads '#' and the entries that have
  left; when there are any they are removed and '#' is lowered by their
  weights (each entry is read once on its way out: amortised O(1) per
  admission). Admit iff sum + w <= L. retry: the entries are walked from the
  oldest (score, then member: Redis's order) adding up weights until
  sum + w - L is freed; at t + W of the entry that frees it, the request
  fits, and not a us sooner (entries leave in that order). The walk reads
  about sum + w - L entries at most (<= w under an unchanged limit; each
  weighs >= 1), in doubling batches from 16. -1 when w > L.
  reset = the newest entry's t + W (the log is empty again), now when empty.
  remaining = L - sum, less w when admitted.
  Bound: at most L units in ANY interval of length W (the last admission in
  it saw all the others). Memory O(L): at most L entries (each weighs >= 1);
  with 20-byte members ~35 bytes an entry while a listpack (up to 128,
  zset-max-listpack-entries), ~120 to 150 in a skiplist beyond (118 KB for
  1000 entries).
  Commands: check ZRANGEBYSCORE, ZRANGE -1 -1 (the newest), and when entries
  left ZREMRANGEBYSCORE + ZADD '#'; a refusal ZRANGE batches; commit ZADD,
  ZADD '#', PEXPIREAT (the newest + W).
  undo: removes "<w>|<id>" and gives its weight back to '#'. ]]
  local function sl_weight(m)
    return string.match(m, '^(%d+)|') + 0
  end

  POL.sliding_log = {
    check = function(k, now, w, p)
      local L, W = p[1], p[2]
      local edge = now - W -- entries at or before it have left
      local hi = edge
      if hi < 0 then hi = 0 end
      local old = redis.call('ZRANGEBYSCORE', k, '-inf', fmt(hi), 'WITHSCORES')
      local sum, freed, gone = 0, 0, false
      for i = 1, #old, 2 do
        if old[i] == '#' then
          sum = -old[i + 1]
        else
          freed, gone = freed + sl_weight(old[i]), true
        end
      end
      if gone then
        sum = sum - freed
        redis.call('ZREMRANGEBYSCORE', k, '1', fmt(edge))
        redis.call('ZADD', k, fmt(-sum), '#')
      end
      local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
      local newest
      if top[1] and top[1] ~= '#' then newest = top[2] + 0 end
      local room = L - sum
      if room < 0 then room = 0 end
      local reset = now
      if newest then reset = newest + W end
      if w > L then return false, -1, L, room, reset, 0 end
      if sum + w <= L then
        local last = now
        if newest and newest > now then last = newest end
        return true, 0, L, room - w, last + W, 0, {sum, last}
      end
      local excess, acc, from, n = sum + w - L, 0, 1, 16
      while true do
        if n > excess then n = excess end
        local e = redis.call('ZRANGE', k, from, from + n - 1, 'WITHSCORES')
        if #e == 0 then break end
        for i = 1, #e, 2 do
          acc = acc + sl_weight(e[i])
          if acc >= excess then
            return false, e[i + 1] + W - now, L, room, reset, 0
          end
        end
        from, n = from + n, n * 2
      end
      -- (unreachable while '#' matches the entries: their weights add up
      -- to sum >= excess)
      return false, reset - now, L, room, reset, 0
    end,
    commit = function(k, now, w, p, st)
      if redis.call('ZADD', k, fmt(now), fmt(w) .. '|' .. p.id) == 1 then
        redis.call('ZADD', k, fmt(-(st[1] + w)), '#')
      end
      redis.call('PEXPIREAT', k, pxat(now, st[2] + p[2]))
    end,
    undo = function(k, now, w, p)
      if redis.call('ZREM', k, fmt(w) .. '|' .. p.id) == 1 then
        redis.call('ZINCRBY', k, fmt(w), '#')
      end
    end,
  }

  --[[ sliding_window: p = limit L, window W (us), buckets N; bucket width
  bw = W/N (quota.Policy makes it a whole number of us).
  A hash of bucket counters, field = bucket index j (floor(t/bw)), value =
  the units admitted in it. At now, in bucket i at offset off = now - i*bw,
  the estimate is
      est = sum(count(j), j > i-N) + count(i-N) * (bw - off) / bw
  (the oldest bucket weighted by the part of it still inside a window of
  length W that ends at now). In integers, multiplied by bw:
      E = bw * S + count(i-N) * (bw - off),  admit iff E <= (L - w) * bw.
  E <= 2 L bw < 2^53 (any N consecutive buckets hold at most L), and
  (L - w) bw <= L bw < 2^52: exact. Buckets older than i-N no longer count
  and are dropped (HDEL) by check.
  remaining = L - ceil(E / bw) (the most units that fit now), less w when
  admitted. reset = (j + N + 1) * bw for the newest kept bucket j (then E
  is 0), now when none. retry, -1 when w > L: E only falls as time passes;
  it is constant inside a bucket whose oldest bucket i'-N is empty and
  falls linearly in one whose oldest is not. So the kept buckets j (sorted)
  are the only events: in bucket i' = j + N, with S' the units of the
  buckets after j and c = count(j), E(off) = bw S' + c (bw - off) fits from
      off = bw - floor(((L - w) bw - bw S') / c)   (when bw S' <= (L - w) bw)
  (not before the current offset in the current bucket; bw means the next
  bucket's start, where E = bw S'). The first j whose S' fits gives the
  earliest us at which the same request passes; the last j (S' = 0) always
  fits, so the walk over at most N + 1 buckets ends.
  Bound: N consecutive buckets hold at most L units (the last admission in
  the newest of them saw them all), so any interval spanning at most
  (N-1)*bw us holds at most L; an interval of length W (N+1 buckets in
  part) holds at most max(L, 2L - ceil(2L/bw)): with A units of the first
  bucket in it and the last admission of the last bucket at offset
  off <= bw-2, the total is <= L + A off / bw <= L + L (bw-2)/bw; L units at
  the end of bucket j and L - ceil(2L/bw) at offset bw-2 of bucket j+N
  reach it. Memory: at most N+1 fields, ~9 bytes a bucket in a listpack (up
  to 512 fields, hash-max-listpack-entries; ~1 KB for 100 buckets), a hash
  table beyond.
  Commands: check HGETALL (+ HDEL of dropped buckets); commit HINCRBY,
  PEXPIREAT when a newer bucket opens (the newest bucket + N + 1, when E is
  0 again). (Hash-field expiry, HPEXPIRE, needs Redis 7.4; the HDEL in check
  does the same on 7.0, in one code path.)
  undo: HINCRBY -w on the bucket of now (the admission's time) if it is
  still kept; a counter at or below 0 is deleted. ]]
  local function sw_state(k, now, p)
    local N = p[3]
    local bw = idiv(p[2], N)
    local i = idiv(now, bw)
    local h = redis.call('HGETALL', k)
    local js, cs, stale = {}, {}, nil
    local S, old, newest = 0, 0, nil
    for x = 1, #h, 2 do
      local j = h[x] + 0
      if j < i - N then
        stale = stale or {}
        stale[#stale + 1] = h[x]
      else
        local c = h[x + 1] + 0
        js[#js + 1], cs[j] = j, c
        if j == i - N then old = c else S = S + c end
        if not newest or j > newest then newest = j end
      end
    end
    if stale then redis.call('HDEL', k, unpack(stale)) end
    return {bw = bw, i = i, off = now - i * bw, S = S, old = old, newest = newest, js = js, cs = cs}
  end

  POL.sliding_window = {
    check = function(k, now, w, p)
      local L, N = p[1], p[3]
      local s = sw_state(k, now, p)
      local bw, i, off = s.bw, s.i, s.off
      local E = bw * s.S + s.old * (bw - off)
      local room = L + idiv(-E, bw) -- L - ceil(E / bw)
      if room < 0 then room = 0 end
      local reset = now
      if s.newest then reset = (s.newest + N + 1) * bw end
      if w > L then return false, -1, L, room, reset, 0 end
      local R = (L - w) * bw
      if E <= R then
        local last = i
        if s.newest and s.newest > i then last = s.newest end
        return true, 0, L, room - w, (last + N + 1) * bw, 0, s
      end
      local js, cs = s.js, s.cs
      table.sort(js)
      local after = s.S + s.old -- units of the buckets after the current event's
      for x = 1, #js do
        local j = js[x]
        local c = cs[j]
        after = after - c
        local D = R - bw * after
        if D >= 0 then
          local ip = j + N
          local o = bw - idiv(D, c)
          if ip == i and o < off then o = off end
          if o < 0 then o = 0 end
          return false, ip * bw + o - now, L, room, reset, 0
        end
      end
      -- (unreachable: the last bucket leaves after = 0 and R >= 0)
      return false, reset - now, L, room, reset, 0
    end,
    commit = function(k, now, w, p, s)
      local i = s.i
      redis.call('HINCRBY', k, fmt(i), fmt(w))
      if not s.newest or i > s.newest then
        redis.call('PEXPIREAT', k, pxat(now, (i + p[3] + 1) * s.bw))
      end
    end,
    undo = function(k, now, w, p)
      local f = fmt(idiv(now, idiv(p[2], p[3])))
      local c = redis.call('HGET', k, f)
      if not c then return end
      if c - w <= 0 then
        redis.call('HDEL', k, f)
      else
        redis.call('HINCRBY', k, f, fmt(-w))
      end
    end,
  }

  --[[ concurrency: p = limit L (<= 100000), lease B (us). Counts requests
  in flight, 1 each whatever w (quota.Policy refuses cost "units").
  A distributed semaphore with leases: a sorted set, member = the request's
  id, score = its lease's end now + B. A holder that died without releasing
  loses its slot when its lease ends: check drops leases with end <= now,
  then admits iff count < L. release (and undo) remove the id.
  retry when refused = the earliest lease end - now: a slot is free then
  even if nobody releases, and not a us sooner unless someone does (the
  (count-L+1)th earliest when the limit was lowered under the leases held);
  -1 when L = 0. remaining = L - count, less 1 when admitted (0 when
  refused). reset = when the next slot comes back: the earliest lease end
  (after this admission when admitted; the retry's time when refused; now
  when L = 0).
  Bound: at most L leases held at any time. Memory O(L): one entry per
  holder, ~30 bytes with 20-byte ids in a listpack (up to 128 holders),
  ~120 to 150 in a skiplist beyond.
  Commands: check ZREMRANGEBYSCORE, ZCARD, ZRANGE (one entry); commit ZADD, ZRANGE
  -1 -1, PEXPIREAT (the latest lease's end, when the set is empty again);
  release and undo ZCARD, ZREM, and return true when they freed a slot of
  a full set (waiters of a queue policy may take it: policy_run.lua).
  An id admitted twice holds one slot (ZADD moves its lease). ]]
  local function cc_release(k, now, w, p)
    local full = redis.call('ZCARD', k) >= p[1]
    return redis.call('ZREM', k, p.id) == 1 and full
  end

  POL.concurrency = {
    check = function(k, now, w, p)
      local L, B = p[1], p[2]
      redis.call('ZREMRANGEBYSCORE', k, '-inf', fmt(now))
      local n = redis.call('ZCARD', k)
      if n < L then
        local reset = now + B
        local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
        if first[2] and first[2] + 0 < reset then reset = first[2] + 0 end
        return true, 0, L, L - n - 1, reset, 0
      end
      if L <= 0 then return false, -1, L, 0, now, 0 end
      -- a slot comes back when the (n-L+1)th earliest lease ends (the
      -- first, unless the limit was lowered under the leases held)
      local at = redis.call('ZRANGE', k, n - L, n - L, 'WITHSCORES')[2] + 0
      return false, at - now, L, 0, at, 0
    end,
    commit = function(k, now, w, p)
      redis.call('ZADD', k, fmt(now + p[2]), p.id)
      local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
      redis.call('PEXPIREAT', k, pxat(now, top[2] + 0))
    end,
    undo = cc_release,
    release = cc_release,
  }
end
