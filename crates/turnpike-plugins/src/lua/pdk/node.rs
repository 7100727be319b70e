//! `kong.node` and `kong.table`: the node's identity, and Kong's table helpers.

use super::*;

const NODE_AND_TABLE: &str = r##"
local kong, node_id, hostname = ...
local ok_new, new_tab = pcall(require, "table.new")
local ok_clear, clear_tab = pcall(require, "table.clear")

kong.node = {
  get_id = function() return node_id end,
  get_hostname = function() return hostname end,
  get_memory_stats = function()
    error("kong.node.get_memory_stats is not implemented by Turnpike", 2)
  end,
}

kong.table = {
  new = ok_new and new_tab or function() return {} end,
  clear = ok_clear and clear_tab or function(t) for k in pairs(t) do t[k] = nil end end,
  merge = function(t1, t2)
    local res = {}
    if t1 then for k, v in pairs(t1) do res[k] = v end end
    if t2 then for k, v in pairs(t2) do res[k] = v end end
    return res
  end,
}
"##;

/// Installs `kong.ip` (`is_trusted`, over the node's `trusted_ips`) on `kong`.
pub(in crate::lua) fn install_ip(
    lua: &Lua,
    kong: &Table,
    trusted: Vec<(std::net::IpAddr, u8)>,
) -> mlua::Result<()> {
    let ip = lua.create_table()?;
    set_fn(lua, &ip, "is_trusted", move |_, address: String| {
        let addr: std::net::IpAddr = address
            .trim_matches(['[', ']'])
            .parse()
            .map_err(|_| mlua::Error::runtime("address must be a valid IP address"))?;
        Ok(trusted
            .iter()
            .any(|(net, len)| turnpike_config::conf::cidr_contains(*net, *len, addr)))
    })?;
    kong.set("ip", ip)
}

/// Installs `kong.node` (with the node's id and host name) and `kong.table` on `kong`.
pub(in crate::lua) fn install_node(lua: &Lua, kong: &Table, node_id: &str) -> mlua::Result<()> {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    lua.load(NODE_AND_TABLE).set_name("=kong.node").call::<()>((
        kong.clone(),
        node_id.to_string(),
        hostname,
    ))
}
