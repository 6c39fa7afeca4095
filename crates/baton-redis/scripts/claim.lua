-- claim: grant a key to a holder if it is free (or reserved for this store), with the next
-- fence; extend it if the holder already holds it; otherwise report who holds it and for how
-- long, and queue this store if one of its waiters waits for the key.
-- (Runs after lock_prelude.lua: constants, qualified() and helpers().)
--
-- KEYS[1]  the grant: "{<qualified key>}"
-- KEYS[2]  the fence counter, a string: "{<qualified key>}:fence"
-- KEYS[3]  the queue of waiting stores: "{<qualified key>}:queue"
-- ARGV[1]  holder
-- ARGV[2]  ttl, milliseconds
-- ARGV[3]  this store: its wake-up channel
-- ARGV[4]  '1' when a waiter of this store waits for the key, else '0'
-- ARGV[5]  reason; absent when empty (every lock)
--
-- Returns the fence (an integer) when granted; {1, fence} extended; {2, holder, remaining ms}
-- held (holder is "handoff:<store>" while the key is reserved for another store's waiter).
--
-- Expiry is Redis's: an expired grant reads as absent. Fences come from INCR on the counter,
-- taken first so that the uncontended grant is one SET NX (a claim that does not grant skips
-- a number, which fences allow). A missing counter (new key, expired, evicted, lost in a
-- restart without persistence) is seeded from the server's TIME in microseconds. The counter
-- advances by one per claim, and claims of one key run one at a time, each for more than a
-- microsecond, so it never overtakes TIME: a re-seeded counter starts above every fence
-- handed out before, unless the server clock stepped back.
local counter = redis.pcall('INCR', KEYS[2])
if type(counter) ~= 'number' then
    return redis.error_reply('BATONCORRUPT fence counter ' .. KEYS[2] .. ' is not a number')
end
if counter == 1 then
    local time = redis.call('TIME')
    counter = tonumber(time[1]) * 1000000 + tonumber(time[2])
    redis.call('SET', KEYS[2], string.format('%d', counter), 'PX',
        tonumber(ARGV[2]) + FENCE_RETENTION_MS)
end
local reason = ARGV[5] or ''
local value = string.format('%d', counter) .. ':' .. ARGV[1]
if reason ~= '' then
    value = value .. '\n' .. reason
end
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
    if ARGV[4] == '1' and redis.call('ZREM', KEYS[3], ARGV[3]) == 1 then
        -- A queued waiter took a free key (after a reservation lapsed or a grant expired): the
        -- new head watches this grant, and its release hands on.
        local lib = helpers()
        if lib.watch_head(KEYS[1], KEYS[3], tonumber(ARGV[2])) then
            lib.mark(KEYS[1], value)
        end
    end
    return counter
end
local lib = helpers()
local current = redis.call('GET', KEYS[1])
local held, holder, _, marked, reserved_for = lib.read(KEYS[1], current)
if held and holder == ARGV[1] then
    redis.call('SET', KEYS[1], lib.grant_value(held, holder, reason, marked), 'PX', ARGV[2])
    return {1, held}
end
if not held and reserved_for == ARGV[3] then
    -- This store's turn: take the reservation. The next store in the queue already has a
    -- watch from the release that made it (if this grant outlasts it, that store's waiter
    -- looks again and sets its timer by this grant).
    if ARGV[4] == '1' then
        redis.call('ZREM', KEYS[3], ARGV[3])
    end
    if redis.call('ZCARD', KEYS[3]) > 0 then
        value = '*' .. value
    end
    redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
    return counter
end
local remaining = redis.call('PTTL', KEYS[1])
if ARGV[4] == '1' then
    lib.enqueue(KEYS[3], ARGV[3], remaining + QUEUE_GRACE_MS)
    if held and not marked then
        lib.mark(KEYS[1], current)
    end
end
return {2, holder or current, remaining}
