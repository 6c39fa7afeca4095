-- permit_list: the live permits of a semaphore, read atomically with their remaining times.
-- (Runs after lock_prelude.lua and permit_prelude.lua.)
--
-- KEYS[1]  the permits: "{<qualified key>}:permits"
-- KEYS[2]  their fences: "{<qualified key>}:fences"
--
-- Returns a flat array: holder, fence, remaining ms, N of its claim (0 when not recorded),
-- for each live permit (in no particular order: the caller sorts by fence).
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ms(now), '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
    local got = redis.call('HMGET', KEYS[2], live[i], n_field(live[i]))
    if got[1] then
        out[#out + 1] = live[i]
        out[#out + 1] = got[1]
        out[#out + 1] = math.max(tonumber(live[i + 1]) - now, 0)
        out[#out + 1] = got[2] or '0'
    end
end
return out
