-- permit_renew: restart the TTL of a holder's permit, only if it is live. An ended or
-- released permit is never revived, and another holder's permit is never touched.
-- (Runs after lock_prelude.lua and permit_prelude.lua.)
--
-- KEYS[1]  the permits: "{<qualified key>}:permits"
-- KEYS[2]  their fences: "{<qualified key>}:fences"
-- ARGV[1]  holder
-- ARGV[2]  ttl, milliseconds
--
-- Returns 1 renewed, 0 not held (nothing changed).
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends then
    return 0
end
local ttl = tonumber(ARGV[2])
local now = now_ms()
if tonumber(ends) <= now then
    return 0
end
redis.call('ZADD', KEYS[1], 'XX', ms(now + ttl), ARGV[1])
keep_permits(KEYS[1], KEYS[2], ttl, now)
return 1
