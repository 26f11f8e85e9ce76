--[[ policy_none.lua: the prelude of admit.lua's plain variant, in place of
policy.lua and the algorithms, for requests no Redis policy matches: the
names admit.lua refers to, never called there (np is 0), so that the plain
variant pays nothing for policies.
]]
local POLICY_ARGS, policies_check, policies_commit, policies_report
