-- For the tests: the token in Authorization is checked by POSTing it to an introspection
-- endpoint; its answer (JSON) is cached per token, and its subject goes upstream.
local http = require "resty.http"
local cjson = require "cjson.safe"

local TokenIntrospect = {
  PRIORITY = 1500,
  VERSION = "1.0.0",
}

local function introspect(conf, token)
  local httpc = http.new()
  httpc:set_timeout(conf.timeout)
  local res, err = httpc:request_uri(conf.introspection_url, {
    method = "POST",
    body = "token=" .. ngx.escape_uri(token),
    headers = { ["Content-Type"] = "application/x-www-form-urlencoded" },
  })
  if not res then
    return nil, err
  end
  if res.status ~= 200 then
    return nil, "introspection answered " .. res.status
  end
  local body = cjson.decode(res.body)
  if not body or not body.active then
    return nil -- a miss: cached as one
  end
  body.via = res.headers["X-Introspected-By"]
  return body
end

function TokenIntrospect:access(conf)
  local auth = kong.request.get_header("authorization")
  local token = auth and auth:match("^[Bb]earer%s+(.+)$")
  if not token then
    return kong.response.exit(401, { message = "no token" })
  end
  if conf.pause > 0 then
    ngx.sleep(conf.pause)
  end
  local info, err = kong.cache:get("introspect:" .. conf.introspection_url .. ":" .. token, { ttl = conf.ttl }, introspect, conf, token)
  if err then
    kong.log.err("introspection failed: ", err)
    return kong.response.exit(502, { message = "introspection failed" })
  end
  if not info then
    return kong.response.exit(401, { message = "inactive token" })
  end
  kong.service.request.set_header("X-Subject", info.sub)
  kong.service.request.set_header("X-Introspected-By", info.via or "")
end

function TokenIntrospect:header_filter(conf)
  -- Cosockets are not there in header_filter, as in OpenResty.
  local _, err = http.new():request_uri(conf.introspection_url)
  kong.response.set_header("X-Header-Filter-Http", err or "allowed?")
end

-- The log phase cannot call out; a timer can (as Kong's own log plugins do).
local function ship(premature, url, entry)
  if premature then return end
  local res, err = http.new():request_uri(url, {
    method = "POST",
    body = cjson.encode(entry),
    headers = { ["Content-Type"] = "application/json" },
  })
  if not res then
    kong.log.err("could not ship the log entry: ", err)
  end
end

function TokenIntrospect:log(conf)
  if conf.log_url then
    local ok, err = ngx.timer.at(0, ship, conf.log_url, kong.log.serialize())
    if not ok then
      kong.log.err("could not start a timer: ", err)
    end
  end
end

return TokenIntrospect
