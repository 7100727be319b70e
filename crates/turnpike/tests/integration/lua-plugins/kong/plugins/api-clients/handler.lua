-- Looks the caller's client up in the plugin's own entity (kong.db, through kong.cache as
-- Kong's credential plugins do) and tells the upstream its tier.
local ApiClients = {
  PRIORITY = 990,
  VERSION = "1.0.0",
}

local function load_client(name)
  return kong.db.api_clients:select_by_client_name(name)
end

-- Writes through kong.db: register a client, promote one, drop one (headers name them).
local function manage()
  local dao = kong.db.api_clients
  local register = kong.request.get_header("x-register")
  if register then
    local entity, err = dao:insert({
      client_name = register,
      consumer = { id = kong.request.get_header("x-consumer-id") },
    })
    if not entity then
      return kong.response.exit(400, { message = err })
    end
    return kong.response.exit(201, { id = entity.id, tier = entity.tier })
  end
  local promote = kong.request.get_header("x-promote")
  if promote then
    local entity, err = dao:update_by_client_name(promote, { tier = "gold" })
    return kong.response.exit(entity and 200 or 400, entity or { message = err })
  end
  local drop = kong.request.get_header("x-drop")
  if drop then
    local ok, err = dao:delete_by_client_name(drop)
    return kong.response.exit(ok and 204 or 400, not ok and { message = err } or nil)
  end
end

function ApiClients:access(conf)
  manage()
  local name = kong.request.get_header(conf.header_name)
  if not name then
    return kong.response.exit(401, { message = "no client" })
  end
  local dao = kong.db.api_clients
  local client, err = kong.cache:get(dao:cache_key(name), nil, load_client, name)
  if err then
    return kong.response.exit(500, { message = err })
  end
  if not client then
    return kong.response.exit(403, { message = "unknown client" })
  end
  kong.service.request.set_header("X-Client-Tier", client.tier)
  kong.service.request.set_header("X-Client-Consumer", client.consumer.id)
  local n = 0
  for _ in dao:each(1) do
    n = n + 1
  end
  kong.service.request.set_header("X-Clients", tostring(n))
  local same = dao:select({ id = client.id })
  kong.service.request.set_header("X-Same", tostring(same ~= nil and same.id == client.id))
  local ok, write_err = pcall(dao.upsert, dao, { id = client.id }, { tier = "free" })
  kong.service.request.set_header("X-Write", (tostring(write_err):gsub("\n.*", "")))
end

return ApiClients
