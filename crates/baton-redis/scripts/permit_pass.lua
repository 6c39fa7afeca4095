-- permit_pass: a store told that a permit is reserved for it while none of its waiters wants
-- one any more gives its turn to the next store: it leaves the queue, its reservation ends,
-- and the permit is reserved for the store that waited longest after it, which is told
-- instead. Sent by the store's pub/sub task.
-- (Runs after lock_prelude.lua and permit_prelude.lua.)
--
-- KEYS[1]  the queue of waiting stores: "{<qualified key>}:queue"
-- KEYS[2]  the permits: "{<qualified key>}:permits"
-- ARGV[1]  this store: its wake-up channel
--
-- Returns 1.
redis.call('ZREM', KEYS[1], ARGV[1])
local now = now_ms()
local ends = redis.call('ZSCORE', KEYS[2], reservation(ARGV[1]))
redis.call('ZREM', KEYS[2], reservation(ARGV[1]))
if ends and tonumber(ends) > now then
    wake_next(KEYS[2], KEYS[1], ARGV[1], '0', now)
end
return 1
