-- Looks the caller's client up in the plugin's own entity (kong.db, through kong.cache as
-- Kong's credential plugins do) and tells the upstream its tier.
local ApiClients = {
  PRIORITY = 990,
  VERSION = "1.0.0",
}

local function load_client(name)
  return kong.db.api_clients:select_by_client_name(name)
end

function ApiClients:access(conf)
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
  local ok, write_err = pcall(dao.insert, dao, { client_name = "x" })
  kong.service.request.set_header("X-Write", (tostring(write_err):gsub("\n.*", "")))
end

return ApiClients
