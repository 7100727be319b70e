-- The plugin's own Admin API endpoint, as Kong's api.lua declares one: a report of its
-- clients by tier, read through kong.db.
local endpoints = require "kong.api.endpoints"

local clients = kong.db.api_clients

return {
  ["/api-clients-report/:tier"] = {
    schema = clients.schema,
    methods = {
      before = function(self)
        if self.params.tier ~= "free" and self.params.tier ~= "gold" then
          return kong.response.exit(400, { message = "unknown tier " .. self.params.tier })
        end
      end,
      GET = function(self, db)
        local names = {}
        for c in db.api_clients:each() do
          if c.tier == self.params.tier then
            names[#names + 1] = c.client_name
          end
        end
        table.sort(names)
        return kong.response.exit(200, {
          tier = self.params.tier,
          clients = names,
          limit = tonumber(self.params.limit),
          asked_by = kong.request.get_header("x-operator"),
        })
      end,
      DELETE = endpoints.delete_entity_endpoint(clients.schema),
    },
  },
}
