-- A custom plugin's handler as Kong calls it: PRIORITY, VERSION and phase methods taking
-- (self, conf), the PDK as the `kong` global, modules of its own through lua_package_path.
local words = require "kong.plugins.greeting.words"

local Greeting = {
  PRIORITY = 950,
  VERSION = "1.2.3",
}

-- Once per worker, before its first request: module state the phases then read.
function Greeting:init_worker()
  words.inits = (words.inits or 0) + 1
end

-- Kong's configure: every config of the plugin, when the configuration changes.
function Greeting:configure(configs)
  local greetings = {}
  for _, c in ipairs(configs or {}) do
    greetings[#greetings + 1] = c.greeting
  end
  table.sort(greetings)
  words.configured = table.concat(greetings, ",")
end

function Greeting:access(conf)
  if conf.deny_path and kong.request.get_path() == conf.deny_path then
    return kong.response.exit(403, { message = "denied by greeting" })
  end
  if kong.request.get_method() == "POST" then
    -- The body the client sent, read in access (the proxy reads it ahead for this plugin).
    kong.service.request.set_header("X-Body-Length", #(kong.request.get_raw_body() or ""))
  end
  local text = words.repeated(conf.greeting, conf.times)
  if conf.mode == "loud" then
    text = text:upper()
  end
  kong.service.request.set_header(conf.header_name, text)
  kong.service.request.set_header("X-Worker-Inits", tostring(words.inits))
  kong.service.request.set_header("X-Configured", words.configured or "never")
  kong.service.request.set_header("X-Plugin-Id", kong.plugin.get_id())
  -- A count shared by every worker (lua_shared_dict), per route.
  local seen = ngx.shared.kong_rate_limiting_counters:incr("greeting:" .. conf.header_name, 1, 0)
  kong.service.request.set_header("X-Seen", tostring(seen))
  kong.ctx.plugin.greeted = text
  -- A secret named by a vault reference (kong.vault), told to the upstream by its length only.
  if conf.secret then
    local secret, err = kong.vault.get(conf.secret)
    kong.service.request.set_header("X-Secret-Length", secret and #secret or err)
  end
end

function Greeting:header_filter(conf)
  kong.response.set_header("X-Greeted", kong.ctx.plugin.greeted or "no")
end

function Greeting:log(conf)
  kong.log.notice("greeting logged ", kong.response.get_status())
end

return Greeting
