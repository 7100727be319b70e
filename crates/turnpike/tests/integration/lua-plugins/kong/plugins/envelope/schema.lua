local typedefs = require "kong.db.schema.typedefs"

return {
  name = "envelope",
  fields = {
    { protocols = typedefs.protocols_http },
    { config = {
        type = "record",
        fields = {
          { name = { type = "string", default = "v1" } },
          { wrap = { type = "boolean", default = true } },
          { hide_errors = { type = "boolean", default = false } },
          { status = { type = "integer", between = { 200, 599 } } },
        },
    } },
  },
}
