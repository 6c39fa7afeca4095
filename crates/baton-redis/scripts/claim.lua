-- claim: grant a key to a holder if it is free (or reserved for this store), with the next
-- fence; extend it if the holder already holds it; otherwise report who holds it and for how
-- long, and queue this store if one of its waiters waits for the key.
-- (Runs after lock_prelude.lua, which defines helpers().)
--
-- KEYS[1]  the grant: "{<qualified key>}"
-- KEYS[2]  the fence counter, a string: "{<qualified key>}:fence"
-- KEYS[3]  the queue of waiting stores: "{<qualified key>}:queue"; only with ARGV[3]
-- KEYS[4]  the waiting holders of the queued stores: "{<qualified key>}:who"; only with
--          ARGV[3], and only when a release may grant the key to this holder by hand-over
--          (the store listens, the claim has no reason, and min_replicas is 0)
-- ARGV[1]  holder
-- ARGV[2]  ttl, milliseconds
-- ARGV[3]  this store (its wake-up channel), when a waiter of this store waits for the key;
--          '' or absent otherwise, and then the claim neither queues the store nor takes a
--          reservation made for it
-- ARGV[4]  reason; absent when empty (every lock)
--
-- Returns the fence (an integer) when granted; {1, fence} extended; {2, holder, remaining ms}
-- held (holder is "handoff:<store>" while the key is reserved for a store's waiter).
--
-- Without a store in ARGV[3] (a lock nobody here waits for, a lease) the claim first takes a
-- fence (TIME, SET ... GET of the counter) and tries SET NX: the uncontended claim is those
-- three calls and one string, with nothing else made. With one (a waiter, which usually finds the key held or reserved for it)
-- it reads the key first, so that finding it held takes no fence and writes no grant.
--
-- Expiry is Redis's: an expired grant reads as absent. Each fence is next_fence's (see
-- lock_prelude.lua, helpers(true)); a claim that does not grant may skip a number, which fences allow.
local store = ARGV[3]
if store == '' then
    store = nil
end
local reason = ARGV[4] or ''
local read, grant_value, mark, watch_head, enqueue
local current, held, holder, _, marked, reserved_for
if store then
    current = redis.call('GET', KEYS[1])
    if current then
        read, grant_value, mark, watch_head, enqueue = helpers()
        held, holder, _, marked, reserved_for = read(KEYS[1], current)
        if (held and holder ~= ARGV[1]) or (not held and reserved_for ~= store) then
            -- Held by another holder, or reserved for another store: queue this store.
            local remaining = redis.call('PTTL', KEYS[1])
            enqueue(KEYS[3], store, remaining, KEYS[4], ARGV[1], ARGV[2])
            if held and not marked then
                mark(KEYS[1], current)
            end
            return {2, holder or current, remaining}
        end
    end
end
if not held then
    local counter, err = helpers(true)(KEYS[2], ARGV[2])
    if not counter then
        return err
    end
    local value
    if reason == '' then
        value = string.format('%d:%s', counter, ARGV[1])
    else
        value = string.format('%d:%s\n%s', counter, ARGV[1], reason)
    end
    if current then
        -- Reserved for this store: its turn. The release that made the reservation took the
        -- store from the queue and told the next store to watch. The grant is marked without
        -- looking whether others still wait (they usually do): its release hands on, or finds
        -- the queue empty and deletes it.
        redis.call('SET', KEYS[1], '*' .. value, 'PX', ARGV[2])
        return counter
    end
    if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
        if store and redis.call('ZREM', KEYS[3], store) == 1 then
            -- A queued waiter took a free key (after a reservation lapsed or a grant
            -- expired): the new head watches this grant, and its release hands on.
            if KEYS[4] then
                redis.call('HDEL', KEYS[4], store)
            end
            _, _, mark, watch_head = helpers()
            if watch_head(KEYS[1], KEYS[3], ARGV[2]) then
                mark(KEYS[1], value)
            end
        end
        return counter
    end
    -- Held (a claim without a store only: a claim with one read the key first).
    read, grant_value = helpers()
    current = redis.call('GET', KEYS[1])
    held, holder, _, marked = read(KEYS[1], current)
    if not held or holder ~= ARGV[1] then
        return {2, holder or current, redis.call('PTTL', KEYS[1])}
    end
end
-- The holder's own grant: extend it (new TTL, same fence).
redis.call('SET', KEYS[1], grant_value(held, holder, reason, marked), 'PX', ARGV[2])
return {1, held}
