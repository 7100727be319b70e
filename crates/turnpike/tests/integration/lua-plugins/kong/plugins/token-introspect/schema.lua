-- A custom plugin that asks an outside service about each request's token (with resty.http,
-- as many Kong sites' own plugins do) and keeps the answers in kong.cache. For the tests.
local typedefs = require "kong.db.schema.typedefs"

return {
  name = "token-introspect",
  fields = {
    { consumer = typedefs.no_consumer },
    { protocols = typedefs.protocols_http },
    { config = {
        type = "record",
        fields = {
          { introspection_url = typedefs.url { required = true } },
          { ttl = { type = "number", default = 60 } },
          { timeout = { type = "integer", default = 2000 } },
          { pause = { type = "number", default = 0 } },
          { log_url = typedefs.url },
        },
      },
    },
  },
}
