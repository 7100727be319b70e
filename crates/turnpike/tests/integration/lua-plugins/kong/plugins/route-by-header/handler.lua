-- For the tests: `x-target: host:port` sends the request there (kong.service.set_target).
local RouteByHeader = { PRIORITY = 900, VERSION = "1.0.0" }

function RouteByHeader:access(conf)
  local target = kong.request.get_header(conf.header)
  if not target then
    return
  end
  local host, port = target:match("^([^:]+):(%d+)$")
  if not host then
    return kong.response.exit(400, { message = "bad target" })
  end
  local ok, err = pcall(kong.service.set_target, host, tonumber(port))
  if not ok then
    return kong.response.exit(400, { message = tostring(err):match("port must[^\n]*") })
  end
  local _, uerr = pcall(kong.service.set_upstream, "elsewhere")
  kong.service.request.set_header("x-set-upstream", tostring(uerr):match("kong%.service%.set_upstream[^\n]*"))
end

return RouteByHeader
