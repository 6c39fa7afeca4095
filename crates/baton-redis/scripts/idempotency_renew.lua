-- idempotency_renew: restart the lease of the owner's pending record.
--
-- KEYS[1]  the record hash: "{<qualified key>}"
-- ARGV[1]  the owner token
-- ARGV[2]  the lease, milliseconds
--
-- Returns 1 renewed, 0 when ARGV[1] does not own a live pending record (nothing changed).
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner')
if rec[1] ~= 'pending' or rec[2] ~= ARGV[1] then
    return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], 'lease_until', string.format('%.0f', now + tonumber(ARGV[2])))
return 1
