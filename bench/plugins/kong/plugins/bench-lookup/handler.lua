-- Reads a header, looks its value up in kong.cache (loaded once), sets an upstream header.
local BenchLookup = { PRIORITY = 1000, VERSION = "1.0.0" }

local function load(key)
  return { value = "v-" .. key }
end

function BenchLookup:access(conf)
  local key = kong.request.get_header(conf.header) or "none"
  local entry = kong.cache:get("bench:" .. key, nil, load, key)
  kong.service.request.set_header("x-up", entry.value)
end

return BenchLookup
