-- Speaks Redis's protocol itself over ngx.socket.tcp (no client library): every cosocket call
-- a plugin makes, and their answers, handed to the upstream as headers.
local RawRedis = {
  PRIORITY = 900,
  VERSION = "1.0.0",
}

local function fail(what, err)
  return kong.response.exit(502, { message = what .. ": " .. tostring(err) })
end

function RawRedis:access(conf)
  local sock = ngx.socket.tcp()
  sock:settimeouts(1000, 1000, 1000)
  local ok, err = sock:connect(conf.host, conf.port, { pool = "raw-redis:" .. conf.port })
  if not ok then
    return fail("connect", err)
  end
  if conf.ssl then
    ok, err = sock:sslhandshake(nil, "localhost", false)
    if not ok then
      return fail("handshake", err)
    end
  end
  local reused = sock:getreusedtimes()
  -- A table of pieces is sent as one buffer.
  local sent
  sent, err = sock:send({ "*2\r\n", { "$4\r\nINCR\r\n" }, "$7\r\ncounter\r\n" })
  if not sent then
    return fail("send", err)
  end
  local function got(what, v, e)
    if v == nil then
      fail(what, e)
    end
    return v
  end
  local line = got("incr", sock:receive("*l"))  -- ":<n>"
  sock:send("PING\r\n")
  local pong = got("ping", sock:receive())      -- "+PONG"
  sock:send("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
  local set = got("set", sock:receive())        -- "+OK"
  local size = got("size", sock:receive())      -- "$5"
  local value = got("value", sock:receive(5))   -- by count
  local crlf = got("rest", sock:receiveany(10)) -- what is there
  ok, err = sock:setkeepalive(10000, 4)
  if not ok then
    return fail("keepalive", err)
  end
  kong.service.request.set_header("X-Incr", line)
  kong.service.request.set_header("X-Pong", pong)
  kong.service.request.set_header("X-Set", set)
  kong.service.request.set_header("X-Get", size .. " " .. value .. " " .. #crlf)
  kong.service.request.set_header("X-Reused", tostring(reused))
  kong.service.request.set_header("X-Sent", tostring(sent))
  -- Closed after keepalive: the calls say so.
  local _, closed = sock:send("PING\r\n")
  kong.service.request.set_header("X-After", tostring(closed))
end

return RawRedis
