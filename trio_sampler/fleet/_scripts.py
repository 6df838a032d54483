"""The Lua scripts that change a limiter's shared state: each one atomic, on Redis's clock.

Time is in microseconds from Redis's ``TIME``, so the processes' own clocks never enter a
decision. Each rate dimension is a GCRA cell: its value is the theoretical arrival time
(TAT) of the next unit; a cost of ``c`` units moves it by ``c * interval``, and a request
may start once ``TAT - tau <= start`` (``tau`` = the burst, as time). Admission looks at
every dimension and the in-flight leases first and changes nothing unless the request is
admitted in all of them, so a refused request costs nothing.

Lua numbers are doubles: microseconds since 1970 (~1.8e15) are exact below 2**53, and
values are written back with ``%.0f`` (``tostring`` would round to 14 digits).

Key layout for a limiter ``name`` (the hash tag keeps them in one cluster slot)::

    trio_sampler:{name}:inflight      sorted set: lease id -> expiry
    trio_sampler:{name}:retry_after   shared "do not retry before" time
    trio_sampler:{name}:retry_budget  retry tokens left
    trio_sampler:{name}:gcra:<dim>    TAT per rate dimension
    trio_sampler:{name}:returned:<id> a lease's rest was given back (for a day)
    trio_sampler:{name}:granted:<id>  what a lease refill granted (for lease_ttl, or until
                                      the process's next refill is answered)
"""

from __future__ import annotations

__all__ = [
    "ADMIT",
    "LEASE",
    "NOTE_RETRY_AFTER",
    "RECLAIM",
    "RENEW",
    "SETTLE",
    "SPEND_RETRY",
    "Status",
]


class Status:
    """The first element of ADMIT's reply."""

    REFUSED_WAIT = 0  #: admission would wait past ``max_wait`` (second element: the wait)
    ADMITTED = 1  #: admitted; start after the second element (microseconds)
    IN_FLIGHT_FULL = 2  #: every in-flight slot is taken
    RETRY_AFTER = 3  #: inside a shared Retry-After window (second element: time left)
    TOO_LARGE = 4  #: the cost exceeds a dimension's burst (second element: its index)
    #: Every status a well-formed reply has.
    ALL = frozenset({0, 1, 2, 3, 4})


# KEYS: inflight, retry_after, retry_budget, gcra x4 (DIMENSIONS order)
# ARGV: max_wait (-1: none), lease id, lease ttl, max in flight (0: none),
#       budget ratio (0: none), budget capacity,
#       then per dimension: interval (0: unlimited), tau, cost
ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_wait = tonumber(ARGV[1])
local until_ = tonumber(redis.call('GET', KEYS[2]) or '0')
if until_ > now then
  return {3, until_ - now, now}
end
local tats = {}
local wait = 0
for i = 1, 4 do
  local base = 7 + (i - 1) * 3
  local interval = tonumber(ARGV[base])
  if interval > 0 then
    local tau = tonumber(ARGV[base + 1])
    local increment = interval * tonumber(ARGV[base + 2])
    if increment > tau then
      return {4, i, now}
    end
    local tat = tonumber(redis.call('GET', KEYS[3 + i]) or '0')
    if tat < now then tat = now end
    tats[i] = tat
    local w = tat + increment - tau - now
    if w > wait then wait = w end
  end
end
if max_wait >= 0 and wait > max_wait then
  return {0, wait, now}
end
local max_in_flight = tonumber(ARGV[4])
if max_in_flight > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= max_in_flight then
    return {2, 0, now}
  end
  local ttl = tonumber(ARGV[3])
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[2])
  redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000) * 2)
end
-- Every dimension is charged as of the request's real start, now + wait.
local start = now + wait
for i, tat in pairs(tats) do
  local base = 7 + (i - 1) * 3
  if tat < start then tat = start end
  local new_tat = tat + tonumber(ARGV[base]) * tonumber(ARGV[base + 2])
  redis.call('SET', KEYS[3 + i], string.format('%.0f', new_tat),
             'PX', math.ceil((new_tat - now) / 1000) + 1)
end
local ratio = tonumber(ARGV[5])
if ratio > 0 then
  local capacity = tonumber(ARGV[6])
  local tokens = tonumber(redis.call('GET', KEYS[3]) or ARGV[6])
  tokens = math.min(capacity, tokens + ratio)
  redis.call('SET', KEYS[3], string.format('%.6f', tokens), 'EX', 86400)
end
return {1, wait, now}
"""

#: Lua shared by the scripts that write a rate dimension's TAT back (SETTLE, LEASE,
#: RECLAIM): kept while it is in the future, expiring with it, and dropped once past.
_WRITE_TAT = """
local function write_tat(key, tat, now)
  if tat > now then
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  else
    redis.call('DEL', key)
  end
end
"""

# KEYS: inflight, gcra x4.  ARGV: lease id ('' for none), then per dimension the change of
# its TAT in microseconds (positive: used more than reserved; negative: a refund), then per
# dimension the header clamp: the least TAT the provider's report allows, as an offset
# from now in microseconds ('x': no report). A clamp only ever raises a TAT (tightens).
# With a lease, the changes apply only if the lease was still held: a settlement sent
# again (its first reply was lost) changes nothing twice.
# Returns {now, the number of dimensions the clamp tightened}.
SETTLE = (
    _WRITE_TAT
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local owned = true
if ARGV[1] ~= '' then
  owned = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
end
local clamped = 0
for i = 1, 4 do
  local change = tonumber(ARGV[1 + i])
  if not owned then change = 0 end
  local floor = ARGV[5 + i]
  if change ~= 0 or (floor ~= nil and floor ~= 'x') then
    local tat = tonumber(redis.call('GET', KEYS[1 + i]) or '0')
    if change ~= 0 then
      if change > 0 and tat < now then tat = now end
      tat = tat + change
    end
    if floor ~= nil and floor ~= 'x' then
      local least = now + tonumber(floor)
      if least > tat and least > now then
        tat = least
        clamped = clamped + 1
      end
    end
    write_tat(KEYS[1 + i], tat, now)
  end
end
return {now, clamped}
"""
)

# KEYS: inflight.  ARGV: lease ttl, lease ids...  Only leases still held are extended.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[1])
local expiry = string.format('%.0f', now + ttl)
local renewed = 0
for i = 2, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000) * 2)
return renewed
"""

# KEYS: retry_budget.  ARGV: capacity.  Returns {1 or 0, tokens left * 1000}.
SPEND_RETRY = """
local tokens = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if tokens >= 1 then
  tokens = tokens - 1
  redis.call('SET', KEYS[1], string.format('%.6f', tokens), 'EX', 86400)
  return {1, math.floor(tokens * 1000)}
end
return {0, math.floor(tokens * 1000)}
"""

# KEYS: retry_after.  ARGV: delay in microseconds.  The window only ever grows.
# Returns the time left in the window (microseconds).
NOTE_RETRY_AFTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_ = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if until_ > current then
  redis.call('SET', KEYS[1], string.format('%.0f', until_),
             'PX', math.ceil((until_ - now) / 1000) + 1)
  return until_ - now
end
return current - now
"""

# A process's lease: give back the rest of its last one, then take a batch of units per
# dimension and of in-flight slots, to spend locally without a round trip each.
# KEYS: inflight, retry_after, retry_budget, gcra x4, the give-back's marker, this
#       refill's record (what it grants, kept lease ttl: RECLAIM gives it back if the
#       reply is lost), the record of the last refill answered (dropped: not lost).
# ARGV: [1] lease ttl, [2] max in flight (0: none), [3] slot id prefix, [4] slots wanted,
#       [5] slots needed (0 or 1), [6] retry-budget deposit, [7] budget capacity,
#       [8] the largest share of the room left one batch takes, [9] '1': give back (once:
#       the marker key makes a give-back sent twice count once),
#       then per dimension (6 each, from 10): interval (0: unlimited), tau, units wanted,
#       units needed (all or nothing), units given back (< 0: used beyond the last
#       lease, charged), header clamp ('x': none, see SETTLE);
#       then the slots given back (lease ids).
# Returns {status, value, now, slots granted, units granted x4}: status as ADMIT's
# (ADMITTED: granted; else nothing granted, the give-back applied all the same).
LEASE = (
    _WRITE_TAT
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function write(i, tat) write_tat(KEYS[3 + i], tat, now) end
redis.call('DEL', KEYS[10])
if ARGV[9] == '1' and redis.call('SET', KEYS[8], '1', 'NX', 'EX', 86400) then
  for i = 1, 4 do
    local base = 10 + (i - 1) * 6
    local interval = tonumber(ARGV[base])
    local back = tonumber(ARGV[base + 4])
    if interval > 0 and back ~= 0 then
      local tat = tonumber(redis.call('GET', KEYS[3 + i]) or '0')
      if back < 0 and tat < now then tat = now end
      write(i, tat - back * interval)
    end
  end
  for j = 34, #ARGV do redis.call('ZREM', KEYS[1], ARGV[j]) end
end
local deposit = tonumber(ARGV[6])
if deposit > 0 then
  local capacity = tonumber(ARGV[7])
  local tokens = tonumber(redis.call('GET', KEYS[3]) or ARGV[7])
  tokens = math.min(capacity, tokens + deposit)
  redis.call('SET', KEYS[3], string.format('%.6f', tokens), 'EX', 86400)
end
local tats = {}
local wait = 0
for i = 1, 4 do
  local base = 10 + (i - 1) * 6
  local interval = tonumber(ARGV[base])
  if interval > 0 then
    local tau = tonumber(ARGV[base + 1])
    local tat = tonumber(redis.call('GET', KEYS[3 + i]) or '0')
    local floor = ARGV[base + 5]
    if floor ~= 'x' and now + tonumber(floor) > tat then
      tat = now + tonumber(floor)
      write(i, tat)
    end
    if tat < now then tat = now end
    local need = tonumber(ARGV[base + 3])
    if need * interval > tau then
      return {4, i, now, 0, 0, 0, 0, 0}
    end
    local w = tat + need * interval - tau - now
    if w > wait then wait = w end
    tats[i] = tat
  end
end
local until_ = tonumber(redis.call('GET', KEYS[2]) or '0')
if until_ > now then
  return {3, until_ - now, now, 0, 0, 0, 0, 0}
end
if wait > 0 then
  return {0, wait, now, 0, 0, 0, 0, 0}
end
local slots = 0
local max_in_flight = tonumber(ARGV[2])
if max_in_flight > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  slots = math.min(tonumber(ARGV[4]), max_in_flight - redis.call('ZCARD', KEYS[1]))
  if slots < 0 then slots = 0 end
  if slots < tonumber(ARGV[5]) then
    return {2, 0, now, 0, 0, 0, 0, 0}
  end
  local ttl = tonumber(ARGV[1])
  for j = 1, slots do
    redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[3] .. ':' .. j)
  end
  redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000) * 2)
end
local reply = {1, 0, now, slots, 0, 0, 0, 0}
local share = tonumber(ARGV[8])
for i, tat in pairs(tats) do
  local base = 10 + (i - 1) * 6
  local interval = tonumber(ARGV[base])
  local room = math.floor((tonumber(ARGV[base + 1]) - (tat - now)) / interval)
  local need = tonumber(ARGV[base + 3])
  local units = math.min(tonumber(ARGV[base + 2]), math.max(need, math.floor(room * share)))
  if units > 0 then write(i, tat + units * interval) end
  reply[4 + i] = units
end
if slots + reply[5] + reply[6] + reply[7] + reply[8] > 0 then
  redis.call('SET', KEYS[9], string.format('%d %d %d %d %d', slots, reply[5], reply[6],
             reply[7], reply[8]), 'PX', math.ceil(tonumber(ARGV[1]) / 1000))
end
return reply
"""
)

# Give back what a lease refill granted when its reply was lost (the connection, or a
# garbled reply): its record says what (nothing: the refill never ran, or was given back
# already; the record goes with the first reclaim, so a reclaim sent twice counts once).
# KEYS: inflight, gcra x4, the refill's record. ARGV: interval x4, the refill's slot id
# prefix. Returns 1: given back, 0: nothing recorded.
RECLAIM = (
    _WRITE_TAT
    + """
local record = redis.call('GET', KEYS[6])
if not record then return 0 end
redis.call('DEL', KEYS[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local granted = {}
for word in string.gmatch(record, '%S+') do granted[#granted + 1] = tonumber(word) end
for j = 1, granted[1] do redis.call('ZREM', KEYS[1], ARGV[5] .. ':' .. j) end
for i = 1, 4 do
  local interval = tonumber(ARGV[i])
  local units = granted[1 + i]
  if interval > 0 and units > 0 then
    local tat = tonumber(redis.call('GET', KEYS[1 + i]) or '0') - units * interval
    write_tat(KEYS[1 + i], tat, now)
  end
end
return 1
"""
)
