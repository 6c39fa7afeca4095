-- permit_claim: take a permit of a semaphore for a holder. Extends the holder's own live
-- permit (same fence); grants a new one, with the next fence and a record of N, while fewer
-- than N live permits are held, counting the permits reserved for other stores (a permit
-- reserved for this store is taken); otherwise reports the live permit or reservation that
-- ends soonest, and queues this store if one of its waiters waits for a permit.
-- (Runs after lock_prelude.lua and permit_prelude.lua.)
--
-- KEYS[1]  the permits: "{<qualified key>}:permits"
-- KEYS[2]  their fences: "{<qualified key>}:fences"
-- KEYS[3]  the fence counter: "{<qualified key>}:fence"
-- KEYS[4]  the queue of waiting stores: "{<qualified key>}:queue"; only with ARGV[4]
-- ARGV[1]  holder
-- ARGV[2]  ttl, milliseconds
-- ARGV[3]  N, the permits this client allows
-- ARGV[4]  this store (its wake-up channel), when a waiter of this store waits for a permit;
--          absent otherwise, and then the claim does not queue the store
--
-- Returns the fence (an integer) when granted; {1, fence} extended; {2, holder, remaining ms}
-- held (of the permit that ends soonest).
local ttl = tonumber(ARGV[2])
local now, time = now_ms()
local ends = ms(now + ttl)
local had = redis.call('ZADD', KEYS[1], 'NX', ends, ARGV[1]) == 0
if had then
    -- The holder has a permit: extend it if it is live (an ended one is taken again below,
    -- with a new fence).
    if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) > now then
        redis.call('ZADD', KEYS[1], 'XX', ends, ARGV[1])
        keep_permits(KEYS[1], KEYS[2], ttl, now)
        return {1, redis.call('HGET', KEYS[2], ARGV[1])}
    end
    redis.call('ZADD', KEYS[1], 'XX', ends, ARGV[1])
end
if ARGV[4] then
    -- A permit a release reserved for this store (and woke it for) is its waiters' to take:
    -- the reservation gives way to this claim's permit.
    redis.call('ZREM', KEYS[1], reservation(ARGV[4]))
end
-- Added: keep it if the live permits, this one included, are at most N.
local live = '(' .. ms(now)
if redis.call('ZCOUNT', KEYS[1], live, '+inf') <= tonumber(ARGV[3]) then
    local fence, err = helpers(true)(KEYS[3], ARGV[2], time)
    if not fence then
        redis.call('ZREM', KEYS[1], ARGV[1])
        return err
    end
    redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', fence), n_field(ARGV[1]), ARGV[3])
    keep_permits(KEYS[1], KEYS[2], ttl, now)
    if ARGV[4] then
        -- A queued store whose waiter took a permit leaves the queue; its next waiter, if
        -- any, claims next and queues again if it must.
        redis.call('ZREM', KEYS[4], ARGV[4])
    end
    return fence
end
-- Full: take the permit out again (and the fence of an ended one it replaced), and drop
-- ended permits while here.
redis.call('ZREM', KEYS[1], ARGV[1])
if had then
    redis.call('HDEL', KEYS[2], ARGV[1], n_field(ARGV[1]))
end
drop_ended(KEYS[1], KEYS[2], now)
local soonest = redis.call('ZRANGEBYSCORE', KEYS[1], live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local remaining = math.max(tonumber(soonest[2]) - now, 0)
if ARGV[4] then
    local _, _, _, _, enqueue = helpers()
    enqueue(KEYS[4], ARGV[4], remaining)
end
return {2, soonest[1], remaining}
