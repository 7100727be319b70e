-- A plugin with Kong's response phase: the upstream's response is read whole first, then
-- wrapped in an envelope (a JSON answer), or passed on with its size and a changed status.
local cjson = require "cjson.safe"

local Envelope = {
  PRIORITY = 800,
  VERSION = "0.1.0",
}

function Envelope:response(conf)
  local status = kong.service.response.get_status()
  local raw = kong.service.response.get_raw_body()
  kong.response.set_header("X-Upstream-Bytes", tostring(#raw))
  if status >= 500 and conf.hide_errors then
    -- An upstream error becomes the plugin's own answer.
    return kong.response.exit(502, { message = "upstream failed", upstream_status = status })
  end
  if conf.wrap then
    local body, err, mime = kong.service.response.get_body()
    if body == nil then
      return kong.response.exit(200, { envelope = conf.name, raw_length = #raw, error = err })
    end
    return kong.response.exit(status, { envelope = conf.name, data = body, mime = mime },
                              { ["X-Enveloped"] = "yes" })
  end
  if conf.status then
    kong.response.set_status(conf.status)
  end
end

function Envelope:header_filter(conf)
  -- The buffered body is still there for the header_filter phase.
  local ok, raw = pcall(kong.service.response.get_raw_body)
  kong.response.set_header("X-Seen-In-Header-Filter", ok and tostring(#raw) or "error")
end

return Envelope
