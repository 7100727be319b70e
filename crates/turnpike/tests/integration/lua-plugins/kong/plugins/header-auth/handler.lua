-- For the tests: `x-user: <name>` authenticates the request as that consumer (and says so
-- in the log entry).
local HeaderAuth = { PRIORITY = 1250, VERSION = "1.0.0" }

function HeaderAuth:access(conf)
  local user = kong.request.get_header(conf.header)
  if not user then
    return kong.response.exit(401, { message = "Unauthorized" })
  end
  if conf.lookup then
    -- The consumer of that username (or id), from the gateway's consumers.
    local consumer = kong.client.load_consumer(user, true)
    if not consumer then
      return kong.response.exit(403, { message = "unknown consumer " .. user })
    end
    local by_id = kong.client.load_consumer(consumer.id)
    kong.service.request.set_header("x-found-by-id", tostring(by_id and by_id.username))
    kong.service.request.set_header("x-not-by-username",
      tostring(kong.client.load_consumer(user) == nil))
    local by_db = kong.db.consumers:select({ id = consumer.id })
    local by_name = kong.db.consumers:select_by_username(user)
    kong.service.request.set_header("x-db-consumer",
      tostring(by_db and by_db.username) .. "," .. tostring(by_name and by_name.id))
    kong.client.authenticate(consumer, nil)
  else
    kong.client.authenticate({ id = "id-" .. user, username = user }, { id = "cred-" .. user })
  end
  local who = kong.client.get_consumer()
  kong.service.request.set_header("x-seen-consumer", who.username)
  -- The serialized log entry every log plugin after this one sends.
  kong.log.set_serialize_value("auth.user", user)
  kong.log.set_serialize_value("request.size", -1, { mode = "add" })
  kong.log.set_serialize_value("request.method", "REDACTED", { mode = "replace" })
  kong.log.set_serialize_value("upstream_uri", nil)
end

return HeaderAuth
