-- The plugin's own entity, as Kong's daos.lua declares one: a client of a consumer, found by
-- its name; in the database and in declarative files, at /api-clients and
-- /consumers/{consumer}/api-client.
local typedefs = require "kong.db.schema.typedefs"

return {
  {
    name = "api_clients",
    primary_key = { "id" },
    endpoint_key = "client_name",
    cache_key = { "client_name" },
    admin_api_name = "api-clients",
    admin_api_nested_name = "api-client",
    fields = {
      { id = typedefs.uuid },
      { created_at = typedefs.auto_timestamp_s },
      { consumer = { type = "foreign", reference = "consumers", required = true, on_delete = "cascade" } },
      { client_name = { type = "string", required = true, unique = true } },
      { tier = { type = "string", default = "free", one_of = { "free", "gold" } } },
      { tags = typedefs.tags },
    },
  },
}
