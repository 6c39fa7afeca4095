-- permit_release: give back a holder's permit. If it was live, it is reserved for the store
-- that waited longest for a permit of the key, which is told (see wake_next in
-- permit_prelude.lua); with nobody queued, nothing is reserved or published.
-- (Runs after lock_prelude.lua and permit_prelude.lua.)
--
-- KEYS[1]  the permits: "{<qualified key>}:permits"
-- KEYS[2]  their fences: "{<qualified key>}:fences"
-- KEYS[3]  the queue of waiting stores: "{<qualified key>}:queue"
-- ARGV[1]  holder
-- ARGV[2]  this store: '1' when a waiter of this store waits for a permit of the key, else
--          '0', followed by the store's wake-up channel
--
-- Returns 0 removed, 1 removed and this store's own waiter is next (the caller wakes it),
-- 2 the holder had no live permit (an ended one is removed all the same).
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends then
    return 2
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1], n_field(ARGV[1]))
local now = now_ms()
if tonumber(ends) <= now then
    return 2
end
if wake_next(KEYS[1], KEYS[3], string.sub(ARGV[2], 2), string.sub(ARGV[2], 1, 1), now) then
    return 1
end
return 0
