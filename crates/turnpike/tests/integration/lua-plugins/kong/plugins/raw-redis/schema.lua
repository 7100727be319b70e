local typedefs = require "kong.db.schema.typedefs"

return {
  name = "raw-redis",
  fields = {
    { protocols = typedefs.protocols_http },
    { config = {
        type = "record",
        fields = {
          { host = { type = "string", default = "127.0.0.1" } },
          { port = typedefs.port { required = true } },
          { ssl = { type = "boolean", default = false } },
        },
    } },
  },
}
