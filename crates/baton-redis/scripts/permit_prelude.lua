-- permit_prelude.lua: what the permit scripts share. scripts.rs puts lock_prelude.lua and then
-- this text in front of permit_claim.lua, permit_renew.lua, permit_release.lua,
-- permit_list.lua and permit_pass.lua, so each is one self-contained script (one SHA, one
-- EVALSHA), and the permits take their fences from the lock's next_fence and queue their
-- waiting stores with the lock's enqueue.
--
-- The permits of the semaphore with qualified key Q live in two keys under the hash tag {Q}:
--     "{Q}:permits"  sorted set: member = holder, score = when its permit ends, in
--                    milliseconds of the server's TIME (a permit whose score is not above now
--                    has ended and counts for nothing)
--     "{Q}:fences"   hash: holder -> the fence of its permit, and n_field(holder) -> the N
--                    its claim was made with (for listings; a permit granted by a baton
--                    that did not record N has no such field)
-- both with a PX expiry at least as long as the longest permit in them, so a key nobody uses
-- any more leaves nothing behind. Fences come from the counter "{Q}:fence", as a lock's do
-- (next_fence in lock_prelude.lua: never below the server clock, so they keep increasing after
-- a restart without persistence or the promotion of a replica that missed the last grants).
-- The stores whose waiters wait for a permit are queued in "{Q}:queue", as for a lock; a
-- release that frees a permit reserves it for the store that waited longest and tells that
-- store, and only it, with the message "p<Q>" on its channel ("a permit of Q is yours: claim
-- it"). The reservation is the member "handoff:<store>" of "{Q}:permits", ending
-- HANDOFF_RESERVATION_MS after the release: it counts as a live permit (so no other claim
-- takes its place) but has no fence and is never listed; only a claim of that store, made
-- while one of its waiters waits, takes it (permit_claim.lua). A store that does not claim in
-- time (paused, killed after the message) loses its turn when the reservation ends. So
-- waiting stores take permits in the order they queued, and a releaser that asks again at
-- once queues behind them. (No holder starts with "handoff:": permit holders are baton's
-- random tokens.)

-- The server's clock, in milliseconds, and the TIME it was read from (for next_fence).
local function now_ms()
    local time = redis.call('TIME')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000), time
end

-- A number of milliseconds as Redis arguments take it: digits, never an exponent.
local function ms(n)
    return string.format('%d', n)
end

-- The field of "{Q}:fences" that holds the N of `holder`'s permit: the holder, a newline and
-- "n". No holder contains a control character, so it never names a holder's fence.
local function n_field(holder)
    return holder .. '\nn'
end

-- Drops the permits of `permits` that ended by `now`, and their fences, a few at a time (a
-- later call drops the rest). The scripts count and read only live permits (scores above
-- now), so this only keeps the keys small: ended permits are those of holders that stopped
-- without a release.
local function drop_ended(permits, fences, now)
    local ended = redis.call('ZRANGEBYSCORE', permits, '-inf', ms(now), 'LIMIT', 0, 64)
    if #ended > 0 then
        redis.call('ZREM', permits, unpack(ended))
        local fields = {}
        for i, holder in ipairs(ended) do
            fields[2 * i - 1] = holder
            fields[2 * i] = n_field(holder)
        end
        redis.call('HDEL', fences, unpack(fields))
    end
end

-- Keeps the permit keys for at least `ttl` milliseconds (a number) from now: twice that when
-- they would end sooner, so that a run of permits with one TTL extends them only about once
-- per TTL. That is also when the ended permits are dropped, so a key in constant use holds
-- at most the permits that ended unreleased since, and the common claim pays for neither.
local function keep_permits(permits, fences, ttl, now)
    if redis.call('PTTL', permits) < ttl then
        local keep = ms(2 * ttl)
        redis.call('PEXPIRE', permits, keep)
        redis.call('PEXPIRE', fences, keep)
        drop_ended(permits, fences, now)
    end
end

-- How long a permit released to a waiting store stays reserved for it (the lock's
-- HANDOFF_RESERVATION_MS in lock_prelude.lua; a unit test checks both against the Rust constant).
local PERMIT_RESERVATION_MS = 250 -- a released permit waits this long for the next store

-- The member of "{Q}:permits" that reserves a permit for `store`.
local function reservation(store)
    return 'handoff:' .. store
end

-- Reserves the permit the caller is freeing for the store that waited longest in `queue`
-- ("{Q}:queue"), tells it, and takes it from the queue: its waiter claims the reservation
-- (and queues again if it no longer can). A store that PUBLISH reaches nowhere (its process
-- died or lost its connection) is dropped and the next one tried. `me` is the calling store,
-- which is not sent a message: when `me_waiting` is '1' (one of its waiters waits for the
-- key), the permit is reserved for it, the caller wakes it and this answers true; otherwise
-- it is dropped from the queue like a store with nobody waiting. `permits` is
-- "{Q}:permits" and `now` the server's clock in milliseconds. Answers whether the store told
-- is the caller's.
local function wake_next(permits, queue, me, me_waiting, now)
    local name
    while true do
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if not head then
            return false
        end
        redis.call('ZREM', queue, head)
        local reached = false
        if head == me then
            reached = me_waiting == '1'
        else
            -- The queue's key is "{Q}:queue".
            name = name or string.sub(queue, 2, -8)
            -- A sharded channel (a cluster store's, with a hash tag) takes SPUBLISH, as in
            -- publish() of lock_prelude.lua.
            local command = string.find(head, '{', 1, true) and 'SPUBLISH' or 'PUBLISH'
            reached = redis.call(command, head, 'p' .. name) > 0
        end
        if reached then
            redis.call('ZADD', permits, ms(now + PERMIT_RESERVATION_MS), reservation(head))
            return head == me
        end
    end
end
