-- idempotency_finalize: set the outcome and metadata of the owner's pending record.
--
-- KEYS[1]  the record hash: "{<qualified key>}"
-- ARGV[1]  the owner token
-- ARGV[2]  'completed' or 'failed'
-- ARGV[3]  metadata (bytes)
--
-- Returns {1} when ARGV[1] does not own a live record (nothing changed); otherwise
-- {0, changed, status, attempt, fingerprint, pttl, metadata}: changed 1 when this call
-- finalized the record (metadata is then '' : the caller has it), 0 when the owner had
-- finalized it already (the first finalize stands, and its metadata is returned).
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner', 'attempt', 'fingerprint')
if not rec[1] or rec[2] ~= ARGV[1] then
    return {1}
end
if rec[1] == 'pending' then
    redis.call('HSET', KEYS[1], 'status', ARGV[2], 'metadata', ARGV[3])
    return {0, 1, ARGV[2], tonumber(rec[3]), rec[4], redis.call('PTTL', KEYS[1]), ''}
end
return {0, 0, rec[1], tonumber(rec[3]), rec[4], redis.call('PTTL', KEYS[1]),
    redis.call('HGET', KEYS[1], 'metadata')}
