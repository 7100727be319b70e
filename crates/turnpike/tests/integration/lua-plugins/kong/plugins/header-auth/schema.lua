-- A custom authentication plugin (the header names the user). For the tests.
local typedefs = require "kong.db.schema.typedefs"
return {
  name = "header-auth",
  fields = {
    { consumer = typedefs.no_consumer },
    { config = { type = "record", fields = {
        { header = { type = "string", default = "x-user" } },
        { lookup = { type = "boolean", default = false } },
    } } },
  },
}
