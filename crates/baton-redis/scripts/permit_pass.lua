-- permit_pass: a store told that a permit is free while none of its waiters wants one any
-- more gives its turn to the next store: it leaves the queue, and the store that waited
-- longest after it is told instead. Sent by the store's pub/sub task.
-- (Runs after lock_prelude.lua and permit_prelude.lua.)
--
-- KEYS[1]  the queue of waiting stores: "{<qualified key>}:queue"
-- ARGV[1]  this store: its wake-up channel
--
-- Returns 1.
redis.call('ZREM', KEYS[1], ARGV[1])
wake_next(KEYS[1], ARGV[1], '0')
return 1
