-- idempotency_get: read the live record with its remaining time and lease.
--
-- KEYS[1]  the record hash: "{<qualified key>}"
--
-- Returns nil when there is no live record, else
-- {status, owner, attempt, fingerprint, metadata, pttl, lease ms}.
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner', 'attempt', 'fingerprint', 'metadata', 'lease_until')
if not rec[1] then
    return nil
end
local remaining = 0
if rec[1] == 'pending' then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    remaining = math.max((tonumber(rec[6]) or 0) - now, 0)
end
return {rec[1], rec[2], tonumber(rec[3]), rec[4], rec[5], redis.call('PTTL', KEYS[1]), remaining}
