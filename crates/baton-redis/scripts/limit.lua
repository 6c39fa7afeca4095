-- limit: one step of the rate limiter's sliding log (baton_core::limit::window), line for
-- line: forget the entries that left the window, then admit `cost` units if they fit, or
-- say when they would.
--
-- KEYS[1]  the log, a list of "<slot end µs>:<units>", oldest first: "{<qualified key>}"
-- KEYS[2]  the units in the log, a string: "{<qualified key>}:units"
-- ARGV[1]  cost (1 <= cost <= max, checked by the caller)
-- ARGV[2]  max
-- ARGV[3]  window, microseconds
-- ARGV[4]  slot length, microseconds (baton_core::limit::window::resolution)
--
-- Returns {allowed (1 or 0), remaining units, retry_after µs}.
--
-- Time is the server's (TIME). Both keys expire when the newest entry has left the window.
-- Numbers stay below 2^53, so Lua's doubles hold them exactly; they are written with
-- %.0f, never tostring (which would print 1.7e+15).
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local cost = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local slot = tonumber(ARGV[4])

local function parse(entry)
    local sep = string.find(entry, ':', 1, true)
    local slot_end = sep and tonumber(string.sub(entry, 1, sep - 1))
    local units = sep and tonumber(string.sub(entry, sep + 1))
    if not slot_end or not units or units < 1 then
        return nil
    end
    return slot_end, units
end

local function corrupt()
    return redis.error_reply('BATONCORRUPT rate-limit log ' .. KEYS[1] .. ' is malformed')
end

local total = tonumber(redis.call('GET', KEYS[2]) or '0')
if not total then
    return corrupt()
end

-- 1. Forget the entries whose slot end + window <= now.
local forgot = false
while true do
    local head = redis.call('LINDEX', KEYS[1], 0)
    if not head then
        total = 0
        break
    end
    local head_end, head_units = parse(head)
    if not head_end then
        return corrupt()
    end
    if head_end + window > now then
        break
    end
    redis.call('LPOP', KEYS[1])
    total = total - head_units
    forgot = true
end

-- Keeps the units key and both expiries in step with the log.
local function persist()
    local tail = redis.call('LINDEX', KEYS[1], -1)
    if not tail then
        redis.call('DEL', KEYS[1], KEYS[2])
        return
    end
    local tail_end = parse(tail)
    local ttl_ms = math.floor((tail_end + window - now) / 1000) + 1
    redis.call('SET', KEYS[2], string.format('%.0f', total), 'PX', ttl_ms)
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
end

-- 2. Admit when the units fit.
if total + cost <= max then
    local slot_end = math.ceil(now / slot) * slot
    local tail = redis.call('LINDEX', KEYS[1], -1)
    local tail_end, tail_units
    if tail then
        tail_end, tail_units = parse(tail)
        if not tail_end then
            return corrupt()
        end
    end
    if tail_end and tail_end >= slot_end then
        -- The same slot, or the clock stepped back: join the newest entry.
        redis.call('LSET', KEYS[1], -1, string.format('%.0f:%.0f', tail_end, tail_units + cost))
    else
        redis.call('RPUSH', KEYS[1], string.format('%.0f:%.0f', slot_end, cost))
    end
    total = total + cost
    persist()
    return {1, max - total, 0}
end

-- 3. Deny: the oldest units must leave until `need` of them have.
if forgot then
    persist()
end
local need = total + cost - max
local freed = 0
local free_at = now
local from = 0
while freed < need do
    local batch = redis.call('LRANGE', KEYS[1], from, from + 31)
    if #batch == 0 then
        return corrupt()
    end
    for _, entry in ipairs(batch) do
        local entry_end, entry_units = parse(entry)
        if not entry_end then
            return corrupt()
        end
        freed = freed + entry_units
        if freed >= need then
            free_at = entry_end + window
            break
        end
    end
    from = from + 32
end
local remaining = max - total
if remaining < 0 then
    remaining = 0
end
return {0, remaining, free_at - now}
