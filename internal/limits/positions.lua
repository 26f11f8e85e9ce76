-- positions.lua: the KEYS, ARGV and answer positions of the admission
-- library's functions, generated from internal/limits (positions.go) by
-- go generate; do not edit. One local, so that it costs the library's
-- chunk one of Lua's 200.
local POS = {
  admit = {
    keys = { state = 1, meters = 2, idem = 3 },
    args = { now = 1, mode = 2, list = 3, cost = 4, meter = 5, request_id = 6, fingerprint = 7, lease = 8, calendar = 9, prepaid = 10, outside = 11, policies = 12 },
    results = { allowed = 1, mask = 2, retry = 3, overage = 4, now = 5, idem = 6, burst_active = 7, burst_limit = 8, burst_remaining = 9, burst_reset = 10, bucket_active = 11, bucket_limit = 12, bucket_remaining = 13, bucket_reset = 14, daily_active = 15, daily_limit = 16, daily_remaining = 17, daily_reset = 18, monthly_active = 19, monthly_limit = 20, monthly_remaining = 21, monthly_reset = 22, meter_daily_active = 23, meter_daily_limit = 24, meter_daily_remaining = 25, meter_daily_reset = 26, meter_monthly_active = 27, meter_monthly_limit = 28, meter_monthly_remaining = 29, meter_monthly_reset = 30, meter_overage = 31 },
    each = { policy_outcome = 1, policy_limit = 2, policy_remaining = 3, policy_reset = 4, policy_retry = 5, policy_delay = 6, policy_how = 7 },
  },
  adjust = {
    keys = { state = 1, meters = 2, entry = 3 },
    args = { list = 1, units = 2, cost = 3, overage = 4, meter_overage = 5, day = 6, month = 7, hour = 8, meter = 9 },
    results = { status = 1, delta = 2, overage_delta = 3 },
  },
  grant = {
    keys = { state = 1 },
    args = { now = 1, period = 2, units = 3, id = 4, period_id = 5, calendar = 6 },
    results = { period_id = 1, used = 2, grant = 3, overage = 4, reset = 5, now = 6, applied = 7 },
  },
  reset = {
    keys = { state = 1, meters = 2 },
    args = { now = 1, stamp = 2, day = 3, month = 4 },
    results = { applied = 1, day_used = 2, month_used = 3, month_overage = 4 },
  },
}
