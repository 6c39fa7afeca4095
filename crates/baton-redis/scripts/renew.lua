-- renew: restart the TTL of a grant, only if the holder still holds it. An expired or
-- released grant is never revived, and another holder's grant is never touched.
-- (Runs after lock_prelude.lua, which defines helpers().)
--
-- KEYS[1]  the grant: "{<qualified key>}"
-- ARGV[1]  holder
-- ARGV[2]  ttl, milliseconds
--
-- Returns 1 renewed, 0 not the holder (nothing changed).
local value = redis.call('GET', KEYS[1])
if value then
    local read = helpers()
    local fence, holder = read(KEYS[1], value)
    if fence and holder == ARGV[1] then
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return 1
    end
end
return 0
