--[[ pending_fields.lua: the prelude of the scripts that read the pending
usage a v2 state hash holds (claim.lua, pending.lua, restore.lua), so that
one function knows its fields (state.lua documents them).
]]

-- each_pending calls f(name, count) for every pending usage count in h, the
-- flat HGETALL of a v2 state hash: its "p" fields, under the v1 pending
-- hash's names ("<hour start, unix s>|<meter>|<u|r|x|o>"); a packed
-- "units,requests" field of an hour id gives its two counts.
local function each_pending(h, f)
  for i = 1, #h, 2 do
    local k = h[i]
    if string.byte(k, 1) == 112 then -- 'p'
      k = string.sub(k, 2)
      if string.sub(k, -1) == '|' then
        local hour, rest = string.match(k, '^(%d+)(|.*)$')
        k = string.format('%d', tonumber(hour) * 3600) .. rest
        local u, r = string.match(h[i + 1], '^(%-?%d+),(%-?%d+)$')
        f(k .. 'u', tonumber(u))
        f(k .. 'r', tonumber(r))
      else
        f(k, tonumber(h[i + 1]))
      end
    end
  end
end

-- ---------------------------------------------------------------------------
