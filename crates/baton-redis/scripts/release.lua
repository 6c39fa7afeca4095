-- release: free a grant, only if the holder still holds it. If stores queued for the key
-- during the grant (it is marked), the key is not deleted but handed to the store that
-- waited longest (granted to its waiting holder, or reserved for it; see hand_off in
-- lock_prelude.lua), and only that store is told; otherwise nothing is published.
-- (Runs after lock_prelude.lua, which defines helpers().)
--
-- KEYS[1]  the grant: "{<qualified key>}"
-- KEYS[2]  the queue of waiting stores: "{<qualified key>}:queue"
-- KEYS[3]  the waiting holders of the queued stores: "{<qualified key>}:who"; optional
-- KEYS[4]  the fence counter: "{<qualified key>}:fence"; optional. Without them the handoff
--          names both from KEYS[1] (the same slot); a Redis Cluster store declares them, so
--          that the script touches no key it did not declare
-- ARGV[1]  holder
-- ARGV[2]  this store: '1' when a waiter of this store waits for the key, else '0', followed
--          by the store's wake-up channel (one argument: every argument costs each call)
--
-- Returns 0 removed, 1 removed and reserved for this store's own waiter (which the caller
-- wakes), {fence, holder} removed and granted to this store's waiting holder (which the
-- caller tells), 2 nobody holds it, or the holder (a string) when another holder holds it
-- (left alone). The fence counter is kept: the next grant must still see it.
local value = redis.call('GET', KEYS[1])
if not value then
    return 2
end
-- The uncontended case, without making the helpers: an unmarked "<fence>:<holder>" (it
-- starts with a digit) whose holder is ARGV[1].
local first = string.byte(value, 1)
local colon = string.find(value, ':', 1, true)
if first >= 48 and first <= 57 and colon and #value == colon + #ARGV[1]
    and string.find(value, ARGV[1], colon + 1, true) then
    redis.call('DEL', KEYS[1])
    return 0
end
local read, _, _, _, _, hand_off = helpers()
local fence, holder, _, marked = read(KEYS[1], value)
if not fence then
    -- Reserved for a waiter after an earlier release: nobody holds it.
    return 2
end
if holder ~= ARGV[1] then
    return holder
end
local me = string.sub(ARGV[2], 2)
local to, handed, to_holder
if marked then
    to, handed, to_holder = hand_off(KEYS[1], KEYS[2], me, string.sub(ARGV[2], 1, 1), KEYS[3],
        KEYS[4])
end
if not to then
    redis.call('DEL', KEYS[1])
    return 0
end
if to == me then
    if handed then
        return {handed, to_holder}
    end
    return 1
end
return 0
