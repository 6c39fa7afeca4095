-- idempotency_acquire: insert a pending record, take over a lapsed or (when asked) failed
-- one with the same fingerprint, or report the live record.
--
-- KEYS[1]  the record, a hash with a PX expiry: "{<qualified key>}", fields
--          status, owner, attempt, fingerprint, metadata, lease_until, previous
-- ARGV[1]  the new attempt's owner token
-- ARGV[2]  fingerprint (may be empty)
-- ARGV[3]  ttl of the record, milliseconds
-- ARGV[4]  the owner's lease, milliseconds
-- ARGV[5]  '1' to take over a failed record, '0' not to
--
-- Returns {kind, previous, status, owner, attempt, fingerprint, metadata, pttl, lease ms}:
-- kind 0 acquired (previous '' for a new record, else the status taken over), 2 duplicate.
--
-- Time is Redis's: the record expires by PEXPIRE, and lease_until is TIME in milliseconds.
-- A record already owned by ARGV[1] can only be this attempt's own, from a first try whose
-- answer was lost with the connection: it is answered as acquired again.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lease_until = string.format('%.0f', now + tonumber(ARGV[4]))
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner', 'attempt', 'fingerprint', 'lease_until', 'previous')
local status = rec[1]
if not status then
    redis.call('HSET', KEYS[1], 'status', 'pending', 'owner', ARGV[1], 'attempt', '1',
        'fingerprint', ARGV[2], 'metadata', '', 'lease_until', lease_until, 'previous', '')
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {0, '', 'pending', ARGV[1], 1, ARGV[2], '', tonumber(ARGV[3]), tonumber(ARGV[4])}
end
local attempt = tonumber(rec[3])
local until_ms = tonumber(rec[5])
if not attempt or not until_ms then
    return redis.error_reply('BATONCORRUPT idempotency record ' .. KEYS[1] .. ' has a bad attempt or lease')
end
if rec[2] == ARGV[1] and status == 'pending' then
    return {0, rec[6] or '', 'pending', ARGV[1], attempt, rec[4], '', redis.call('PTTL', KEYS[1]),
        math.max(until_ms - now, 0)}
end
local lapsed = status == 'pending' and until_ms <= now
local retry = status == 'failed' and ARGV[5] == '1'
if rec[4] == ARGV[2] and (lapsed or retry) then
    attempt = attempt + 1
    redis.call('HSET', KEYS[1], 'status', 'pending', 'owner', ARGV[1], 'attempt', tostring(attempt),
        'fingerprint', ARGV[2], 'metadata', '', 'lease_until', lease_until, 'previous', status)
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {0, status, 'pending', ARGV[1], attempt, ARGV[2], '', tonumber(ARGV[3]), tonumber(ARGV[4])}
end
local remaining = 0
if status == 'pending' then
    remaining = math.max(until_ms - now, 0)
end
return {2, '', status, rec[2], attempt, rec[4], redis.call('HGET', KEYS[1], 'metadata'),
    redis.call('PTTL', KEYS[1]), remaining}
