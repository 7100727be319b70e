-- A custom plugin laid out as Kong's are (kong/plugins/<name>/schema.lua), for the tests.
local typedefs = require "kong.db.schema.typedefs"

return {
  name = "greeting",
  fields = {
    { consumer = typedefs.no_consumer },
    { protocols = typedefs.protocols_http },
    { config = {
        type = "record",
        fields = {
          { header_name = typedefs.header_name { required = true, default = "X-Greeting" } },
          { greeting = { type = "string", default = "hello" } },
          { times = { type = "integer", between = { 1, 5 }, default = 1 } },
          { deny_path = { type = "string" } },
          { mode = { type = "string", one_of = { "plain", "loud" }, default = "plain" } },
          { secret = { type = "string" } },
        },
        entity_checks = {},
      },
    },
  },
}
