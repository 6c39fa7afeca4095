-- permit_list: the live permits of a semaphore, read atomically with their remaining times.
-- (Runs after lock_prelude.lua and permit_prelude.lua.)
--
-- KEYS[1]  the permits: "{<qualified key>}:permits"
-- KEYS[2]  their fences: "{<qualified key>}:fences"
--
-- Returns a flat array: holder, fence, remaining ms, for each live permit (in no particular
-- order: the caller sorts by fence).
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ms(now), '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
    local fence = redis.call('HGET', KEYS[2], live[i])
    if fence then
        out[#out + 1] = live[i]
        out[#out + 1] = fence
        out[#out + 1] = math.max(tonumber(live[i + 1]) - now, 0)
    end
end
return out
