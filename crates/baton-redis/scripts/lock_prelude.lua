-- lock_prelude.lua: the helpers of the lock scripts. scripts.rs puts this text in front of
-- claim.lua, renew.lua, release.lua, inspect.lua and pass.lua, so each is still one
-- self-contained script (one SHA, one EVALSHA).
--
-- The grant of qualified key Q is one string at "{Q}", with a PX expiry of the grant's TTL:
--     "<fence>:<holder>"             when the reason is empty (every lock)
--     "<fence>:<holder>\n<reason>"   otherwise (a lease claimed with a reason)
-- preceded by "*" once some store has queued for the key during this grant: its release
-- then hands the key on instead of deleting it. A fence is digits and neither holders nor
-- reasons contain control characters, so the first ':' and the first newline after it split
-- the value.
--
-- Each store instance listens on a channel of its own, "baton:wake:<db>:<random id>", and
-- that channel name is also its name in the scripts ("store" below). On a Redis Cluster a
-- store listens on one sharded channel per slot it waits in, "baton:wake:{<tag>}:<random id>",
-- whose hash tag puts it in the slot of the key it is named for: a channel with a hash tag is
-- sent to with SPUBLISH (which reaches the subscribers of the key's shard, and counts them),
-- any other with PUBLISH (publish() in helpers()). Three messages:
--     "g<fence>\n<holder>\n<Q>"  Q is granted to your waiting holder, with that fence
--                                (hand-over; holders and keys contain no control characters)
--     "h<Q>"         it is your turn: Q is reserved for you (handoff)
--     "w<ms>:<Q>"    you are next: if nothing else wakes you, look at Q again in <ms> ms (watch)
--
-- A handoff reservation is the string "handoff:<store>" at "{Q}", with a short PX expiry: the
-- key is free, but only a claim from that store may take it until the reservation ends.
--
-- The queue of stores waiting for Q is the sorted set "{Q}:queue": member = store, score = the
-- server time (microseconds) it joined, so its first member is the store that waited longest.
-- Beside it, the hash "{Q}:who" names, for a queued store, the holder that waits and its TTL
-- (field = store, value = "<ttl ms>:<holder>"), kept and expired with the queue and removed
-- with the store's queue entry. A release hands the key to a store with such an entry by
-- granting it to that holder (a hand-over); one without (an older baton, or a store with
-- min_replicas, whose grants must be confirmed by replicas before anyone relies on them, which
-- a message cannot wait for) gets a reservation. "{Q}:who" is named from "{Q}" in the scripts
-- that hand on (release, pass), so the uncontended release carries no more keys than it needs:
-- it shares the grant's hash tag, as "{Q}:fence", which hand-overs also name that way.
--
-- The helpers are made by calling helpers(), only on the paths that need them: every function
-- definition runs on every call that reaches it (and becomes garbage), so the uncontended claim
-- and release, which need none of this, make only the one closure `helpers` itself (and the
-- claim that grants, `next_fence` by helpers(true)). Nothing at the top level is captured by
-- a closure, so making it allocates nothing else. helpers() returns the functions themselves,
-- in this order, not a table of them (a table of ten fields costs more than all the closures):
--
--     local read, grant_value, mark, watch_head, enqueue, hand_off = helpers()
--
-- The protocol's durations, in milliseconds. A unit test in scripts.rs checks that they
-- equal the Rust constants of the same names (store.rs, pubsub.rs).

local function helpers(fence_only)
    -- The next fence of the key whose counter is `counter_key`, for a grant of `ttl` ms (a string
    -- of digits): the larger of the counter plus one and the server's TIME in microseconds,
    -- written back to the counter. So a fence is above every fence this server handed out, and
    -- not below its clock: a counter that is missing (new key, expired, evicted, lost in a
    -- restart without persistence) or stale (a promoted replica that missed the last grants) is
    -- overtaken by the clock. Written as SET ... GET, the common case (the clock is ahead of the
    -- counter) is two calls, TIME and SET; a counter at or above the clock (a clock that stepped
    -- back, more than one grant of the key per microsecond) costs a second SET. Returns the fence,
    -- or nil and the error reply for a counter that is not baton's. Every claim that grants uses
    -- it: helpers(true) makes it alone, first, and returns it. A caller that has read TIME
    -- already (a permit claim) passes its answer as `time`, and this reads it no second time.
    local function next_fence(counter_key, ttl, time)
        local FENCE_RETENTION_MS = 3600000 -- the fence counter lives this long beyond the grant's TTL
        time = time or redis.call('TIME')
        local counter = tonumber(time[1]) * 1000000 + tonumber(time[2])
        local keep = string.format('%d', tonumber(ttl) + FENCE_RETENTION_MS)
        local last = redis.pcall('SET', counter_key, string.format('%d', counter), 'PX', keep, 'GET')
        if last then
            if type(last) == 'table' then
                -- A counter of another type (WRONGTYPE): nothing was written.
                return nil, last
            end
            local n = string.find(last, '^%d+$') and tonumber(last)
            if not n then
                redis.call('SET', counter_key, last)
                return nil, redis.error_reply('BATONCORRUPT fence counter ' .. counter_key .. ' is not a number')
            end
            if n >= counter then
                counter = n + 1
                redis.call('SET', counter_key, string.format('%d', counter), 'PX', keep)
            end
        end
        return counter
    end
    if fence_only then
        return next_fence
    end

    local QUEUE_GRACE_MS = 5000 -- a queue outlives the holder's remaining time by this much
    local HANDOFF_RESERVATION_MS = 250 -- a released key waits this long for the next store

    -- Sends `message` to the store whose channel is `channel`; answers how many subscribers
    -- it reached. A sharded channel (it has a hash tag, so it is in the slot of the key this
    -- script runs for) takes SPUBLISH: on a cluster, PUBLISH would count only the
    -- subscribers of this node, not the shard's.
    local function publish(channel, message)
        if string.find(channel, '{', 1, true) then
            return redis.call('SPUBLISH', channel, message)
        end
        return redis.call('PUBLISH', channel, message)
    end

    -- Splits a stored value: fence, holder, reason, marked for a grant; or false, nil, nil,
    -- false, store for a handoff reservation. Anything else is not baton's: an error.
    local function read(key, value)
        if string.byte(value, 1) == 104 and string.sub(value, 1, 8) == 'handoff:' then -- 'h'
            return false, nil, nil, false, string.sub(value, 9)
        end
        local marked = string.byte(value, 1) == 42 -- '*'
        local from = marked and 2 or 1
        local colon = string.find(value, ':', from, true)
        local fence = colon and string.sub(value, from, colon - 1)
        if not fence or not string.find(fence, '^%d+$') then
            error({ err = 'BATONCORRUPT ' .. key .. ' does not hold a baton grant' })
        end
        local newline = string.find(value, '\n', colon + 1, true)
        if newline then
            return fence, string.sub(value, colon + 1, newline - 1), string.sub(value, newline + 1),
                marked
        end
        return fence, string.sub(value, colon + 1), '', marked
    end

    -- The stored string of a grant.
    local function grant_value(fence, holder, reason, marked)
        local value = fence .. ':' .. holder
        if reason ~= '' then
            value = value .. '\n' .. reason
        end
        if marked then
            value = '*' .. value
        end
        return value
    end

    -- Marks the unmarked grant `value` at `grant`: a store is queued, so its release hands on.
    local function mark(grant, value)
        redis.call('SET', grant, '*' .. value, 'KEEPTTL')
    end

    -- Tells the store at the head of the queue of `grant` to look at the key again in `ms`
    -- milliseconds (a string of digits) if nothing wakes it before: the head's waiters may be
    -- asleep on a timer set for an earlier holder, so after every change of holder the head
    -- keeps a timer that ends no later than the current one. Returns whether anybody is queued.
    local function watch_head(grant, queue, ms)
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if not head then
            return false
        end
        -- The payload names the qualified key Q of the grant's Redis key "{Q}".
        publish(head, 'w' .. ms .. ':' .. string.sub(grant, 2, -2))
        return true
    end

    -- Puts `store` at the end of the queue unless it is already in it (ZADD NX), and keeps the
    -- queue for at least `remaining` (the holder's remaining time, in milliseconds) plus a grace:
    -- waiters look again by then. With `who` (the "{Q}:who" hash), also records that `holder`
    -- waits, with TTL `ttl` (a string of digits): the release hands the key to it.
    local function enqueue(queue, store, remaining, who, holder, ttl)
        local time = redis.call('TIME')
        redis.call('ZADD', queue, 'NX', time[1] .. string.format('%06d', tonumber(time[2])), store)
        local keep_ms = remaining + QUEUE_GRACE_MS
        local keep = string.format('%d', keep_ms)
        if redis.call('PTTL', queue) < keep_ms then
            redis.call('PEXPIRE', queue, keep)
        end
        if who then
            redis.call('HSET', who, store, ttl .. ':' .. holder)
            if redis.call('PTTL', who) < keep_ms then
                redis.call('PEXPIRE', who, keep)
            end
        end
    end

    -- Hands the key, which the caller is freeing, to the store that waited longest and can
    -- still be reached. A store with a "{Q}:who" entry gets a grant: the key is granted to the
    -- holder named there, with the next fence and that holder's TTL, marked (others usually
    -- still wait; its release finds out), and the store is sent the grant in a message. A store
    -- without one gets a reservation: the key is reserved for it and it is told so. A store
    -- whose pub/sub connection is gone (PUBLISH reaches nobody: the process died or lost its
    -- connection) is dropped from the queue and the next one is tried. `me` is the calling
    -- store, reached without a message when `me_waiting` is '1' (one of its waiters waits for
    -- the key now).
    -- `who` and `counter` are the "{Q}:who" hash and the "{Q}:fence" counter when the caller
    -- declared them as keys (a Redis Cluster store, so that every key a script touches is
    -- declared); without them they are named from `grant`, in the same slot.
    -- Returns the store the key went to, with the fence and holder when it was granted; or
    -- false when nobody can take it (the caller then deletes the key).
    --
    -- The store after the one whose turn it is gets its watch message first: Redis writes the
    -- output of the clients a command reached last in, first out, so the turn, published
    -- second, leaves first (right after the caller's own reply) and the watch does not delay
    -- the handoff. If the turn reaches nobody, the watched store is the next one tried, and a
    -- watch followed by a turn is just a turn.
    local function hand_off(grant, queue, me, me_waiting, who, counter)
        local name = string.sub(grant, 2, -2)
        who = who or grant .. ':who'
        counter = counter or grant .. ':fence'
        local reservation_ms = string.format('%d', HANDOFF_RESERVATION_MS)
        -- The first two stores in line: the one whose turn it is, and the one told to watch.
        local line = redis.call('ZRANGE', queue, 0, 1)
        local i = 1
        while line[i] do
            local store = line[i]
            redis.call('ZREM', queue, store)
            local entry = redis.call('HGET', who, store)
            local ttl, holder
            if entry then
                redis.call('HDEL', who, store)
                local colon = string.find(entry, ':', 1, true)
                ttl = colon and string.sub(entry, 1, colon - 1)
                if ttl and string.find(ttl, '^%d+$') then
                    holder = string.sub(entry, colon + 1)
                end
            end
            -- The next store in line looks again when this store's grant or reservation
            -- ends: if the store whose turn it is stalls (paused, partitioned), it finds the
            -- key free; if a grant outlasts the reservation, its waiter sets its timer by it.
            local ms = holder and ttl or reservation_ms
            local next = line[i + 1]
            if next then
                publish(next, 'w' .. ms .. ':' .. name)
            end
            local reached, fence
            if holder then
                local err
                fence, err = next_fence(counter, ttl)
                if not fence then
                    error(err)
                end
            end
            if store == me then
                reached = me_waiting == '1'
            elseif holder then
                reached = publish(store,
                    'g' .. string.format('%d', fence) .. '\n' .. holder .. '\n' .. name) > 0
            else
                reached = publish(store, 'h' .. name) > 0
            end
            if reached then
                if holder then
                    redis.call('SET', grant, '*' .. string.format('%d', fence) .. ':' .. holder,
                        'PX', ttl)
                else
                    redis.call('SET', grant, 'handoff:' .. store, 'PX', reservation_ms)
                end
                if not next and #line == 2 then
                    watch_head(grant, queue, ms)
                end
                return store, fence, holder
            end
            i = i + 1
            if not line[i] and #line == 2 then
                -- Both were gone; more may wait behind them.
                line = redis.call('ZRANGE', queue, 0, 1)
                i = 1
            end
        end
        return false
    end

    return read, grant_value, mark, watch_head, enqueue, hand_off
end
