-- For the tests: `x-user: <name>` authenticates the request as that consumer (and says so
-- in the log entry).
local HeaderAuth = { PRIORITY = 1250, VERSION = "1.0.0" }

function HeaderAuth:access(conf)
  local user = kong.request.get_header(conf.header)
  if not user then
    return kong.response.exit(401, { message = "Unauthorized" })
  end
  kong.client.authenticate({ id = "id-" .. user, username = user }, { id = "cred-" .. user })
  local who = kong.client.get_consumer()
  kong.service.request.set_header("x-seen-consumer", who.username)
  -- The serialized log entry every log plugin after this one sends.
  kong.log.set_serialize_value("auth.user", user)
  kong.log.set_serialize_value("request.size", -1, { mode = "add" })
  kong.log.set_serialize_value("request.method", "REDACTED", { mode = "replace" })
  kong.log.set_serialize_value("upstream_uri", nil)
end

return HeaderAuth
