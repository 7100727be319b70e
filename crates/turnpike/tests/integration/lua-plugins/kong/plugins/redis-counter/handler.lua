-- Counts each user's calls in Redis with OpenResty's resty.redis (cosockets: connect, TLS,
-- send, receive, keepalive), and refuses past the limit.
local redis = require "resty.redis"

local RedisCounter = {
  PRIORITY = 900,
  VERSION = "1.0.0",
}

function RedisCounter:access(conf)
  local red = redis:new()
  red:set_timeouts(1000, 1000, 1000)
  local ok, err
  if conf.ssl then
    ok, err = red:connect(conf.host, conf.port,
      { ssl = true, ssl_verify = false, server_name = "localhost" })
  else
    ok, err = red:connect(conf.host, conf.port)
  end
  if not ok then
    return kong.response.exit(500, { message = "redis: " .. tostring(err) })
  end
  local key = "hits:" .. (kong.request.get_header("x-user") or "anonymous")
  local count, incr_err = red:incr(key)
  if not count then
    return kong.response.exit(500, { message = "incr: " .. tostring(incr_err) })
  end
  red:init_pipeline()
  red:expire(key, 60)
  red:get(key)
  local results = red:commit_pipeline()
  local reused = red:get_reused_times()
  red:set_keepalive(10000, 10)
  if count > conf.limit then
    return kong.response.exit(429, { message = "over " .. conf.limit })
  end
  kong.service.request.set_header("X-Hits", tostring(count))
  kong.service.request.set_header("X-Pipelined", tostring(results and results[2]))
  kong.service.request.set_header("X-Reused", tostring(reused))
end

return RedisCounter
