local typedefs = require "kong.db.schema.typedefs"

return {
  name = "api-clients",
  fields = {
    { protocols = typedefs.protocols_http },
    { config = {
        type = "record",
        fields = {
          { header_name = { type = "string", default = "x-client" } },
        },
    } },
  },
}
