-- inspect: the live grant of a key, read atomically with its remaining time.
-- (Runs after lock_prelude.lua, which defines helpers().)
--
-- KEYS[1]  the grant: "{<qualified key>}"
--
-- Returns {holder, fence, reason, remaining ms}, or nil when nobody holds the key (also while
-- it is reserved for a waiter).
local value = redis.call('GET', KEYS[1])
if not value then
    return false
end
local read = helpers()
local fence, holder, reason = read(KEYS[1], value)
if not fence then
    return false
end
return {holder, fence, reason, redis.call('PTTL', KEYS[1])}
