'use strict';
// A plugin written with Kong's JavaScript PDK (kong-pdk, from npm), served by the PDK's own
// kong-js-pluginserver from this folder, as Kong's documentation runs one. Written for
// Turnpike's tests.

class KongPlugin {
  constructor(config) {
    this.config = config
  }

  async access(kong) {
    if (await kong.request.getHeader("x-deny")) {
      return await kong.response.exit(451, JSON.stringify({message: "denied by js-greeter"}),
        {"content-type": "application/json", "x-js": "denied"})
    }
    const host = await kong.request.getHeader("host")
    await kong.service.request.setHeader("x-js-greeting", `${this.config.message} ${host}`)
    const query = await kong.request.getQuery()
    await kong.service.request.setHeader("x-js-query", JSON.stringify(query))
    await kong.response.setHeader("x-js-method", await kong.request.getMethod())
    try {
      await kong.node.getMemoryStats()
      await kong.service.request.setHeader("x-js-missing", "none")
    } catch (e) {
      await kong.service.request.setHeader("x-js-missing", String(e.message))
    }
  }
}

module.exports = {
  Plugin: KongPlugin,
  Schema: [
    { message: { type: "string", default: "hi" } },
  ],
  Version: '0.1.0',
  Priority: 800,
}
