--[[ pending_fields.lua: shared by the library's functions that read the
pending usage a state hash holds (claim.lua, pending.lua, restore.lua), so
that one function knows its fields (state.lua documents them).
]]

-- each_pending calls f(acc, name, count) for every pending usage count in
-- h, the flat HGETALL of a state hash: its "p" fields, under the pending
-- hash's names ("<hour start, unix s>|<meter>|<u|r|x|o|...>"); a packed
-- "units,requests" field of an hour id gives its two counts. acc is the
-- caller's, passed along (f is a function of the library, never a
-- closure made per call).
local function each_pending(h, f, acc)
  for i = 1, #h, 2 do
    local k = h[i]
    if string.byte(k, 1) == 112 then -- 'p'
      k = string.sub(k, 2)
      if string.sub(k, -1) == '|' then
        local hour, rest = string.match(k, '^(%d+)(|.*)$')
        k = string.format('%d', tonumber(hour) * 3600) .. rest
        local u, r = string.match(h[i + 1], '^(%-?%d+),(%-?%d+)$')
        f(acc, k .. 'u', tonumber(u))
        f(acc, k .. 'r', tonumber(r))
      else
        f(acc, k, tonumber(h[i + 1]))
      end
    end
  end
end
