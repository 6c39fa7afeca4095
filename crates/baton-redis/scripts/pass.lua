-- pass: a store with nobody waiting for the key any more gives up its place, so the stores
-- behind it are not kept waiting: it leaves the queue (and "{Q}:who", named from KEYS[1]), and a reservation made for it goes to
-- the next store that can be reached. Sent by the store's pub/sub task when it is told it is
-- its turn (or its watch timer ends) and none of its waiters wants the key.
-- (Runs after lock_prelude.lua, which defines helpers().)
--
-- KEYS[1]  the grant: "{<qualified key>}"
-- KEYS[2]  the queue of waiting stores: "{<qualified key>}:queue"
-- KEYS[3]  the waiting holders of the queued stores: "{<qualified key>}:who"; optional
-- KEYS[4]  the fence counter: "{<qualified key>}:fence"; optional. Without them both are
--          named from KEYS[1] (the same slot); a Redis Cluster store declares them, as it does
--          for release.lua
-- ARGV[1]  this store: its wake-up channel
--
-- Returns 1 when the key was handed on or freed, 0 when it is held or reserved for another
-- store (whose release or claim moves the queue on; the new head watches in this store's
-- place, and the grant is marked so that its release hands on).
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3] or KEYS[1] .. ':who', ARGV[1])
local read, _, mark, watch_head, _, hand_off = helpers()
local value = redis.call('GET', KEYS[1])
if value then
    local fence, _, _, marked, reserved_for = read(KEYS[1], value)
    if fence or reserved_for ~= ARGV[1] then
        local queued = watch_head(KEYS[1], KEYS[2],
            string.format('%d', redis.call('PTTL', KEYS[1])))
        if queued and fence and not marked then
            mark(KEYS[1], value)
        end
        return 0
    end
end
if not hand_off(KEYS[1], KEYS[2], ARGV[1], '0', KEYS[3], KEYS[4]) and value then
    redis.call('DEL', KEYS[1])
end
return 1
