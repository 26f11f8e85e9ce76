--[[ calendar.lua: a tenant's billing calendar (its days and billing months in
its time zone, from its anchor day), shared by the library's functions that
count its quotas by them (admit, grant). It stands alone as well (the
calendar tests run it with EVAL).

Lua knows no time zones, and the functions take the time from Redis TIME,
not from Go, so Go cannot tell them which day it is. Instead Go
(quota.Calendar.Boundaries) passes the calendar around its own now: four
consecutive local days and three consecutive billing months, with their
starts, and the function picks those of its now. Its argument, decimal
integers in ASCII:

  <d0>,<s0>,<s1>,<s2>,<s3>,<s4>|<p0>,<q0>,<p1>,<q1>,<p2>,<q2>,<q3>

  d0          day id (local date as days since 1970-01-01) of the first day,
              the day before Go's; days d0..d0+3 follow
  s0..s3      their starts, s4 the end of the last: Unix seconds; a date the
              zone's clock skipped (Pacific/Apia's 2011-12-30) starts where
              the next date does, and so is never picked
  p0, p1, p2  period ids (year*100+month of the anchor day starting it) of
              the period before Go's, Go's and the next
  q0..q2      their starts, q3 the end of the last: Unix seconds

The days reach from the start of the day before Go's to the end of the
second day after it, at least 23 hours either side of Go's now (less only
around a day that a zone change shortened to less than 23 hours, such as
the day after a skipped date): a Redis clock that far from Go's still
finds its day; the periods span more. Seconds suffice: every UTC offset
and transition is a whole number of seconds. Every value here is an
integer exact in a double: seconds times 10^6 stay below 2^53 until 2255.
]]

-- cal_at returns, for time now_us (integer microseconds since the Unix
-- epoch, as state.lua's clock gives) and an argument arg in the format
-- above: the day id, the day's start and the next day's start (us), the
-- period id, the period's start and the next period's start (us); or nil
-- when now_us is outside the days arg covers (Go's clock and Redis's too
-- far apart). A malformed arg raises an error: it is a bug, not a state.
-- Each bound is converted from its string once, and only when a
-- comparison needs it.
local function cal_at(arg, now_us)
  local d0, s0, s1, s2, s3, s4, p0, q0, p1, q1, p2, q2, q3 = string.match(arg,
    '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)|(%d+),(%-?%d+),(%d+),(%-?%d+),(%d+),(%-?%d+),(%-?%d+)$')
  if not d0 then
    error('calendar: malformed boundaries: ' .. tostring(arg))
  end
  local lo, hi = s0 * 1000000, s4 * 1000000
  if now_us < lo or now_us >= hi then
    return nil
  end
  local d, ds, dn = d0 + 0, lo, s1 * 1000000
  if now_us >= dn then
    d, ds, dn = d + 1, dn, s2 * 1000000
    if now_us >= dn then
      d, ds, dn = d + 1, dn, s3 * 1000000
      if now_us >= dn then
        d, ds, dn = d + 1, dn, hi
      end
    end
  end
  local p, ps, pn = p0, q0 * 1000000, q1 * 1000000
  if now_us < ps or now_us >= q3 * 1000000 then
    return nil -- (not from Go's Boundaries: its periods span its days)
  end
  if now_us >= pn then
    p, ps, pn = p1, pn, q2 * 1000000
    if now_us >= pn then
      p, ps, pn = p2, pn, q3 * 1000000
    end
  end
  return d, ds, dn, p + 0, ps, pn
end
