//! `ngx.re`: OpenResty's regular expressions (`match`, `find`, `gmatch`, `sub`, `gsub`) and
//! lua-resty-core's `require "ngx.re"` (`split`), over the `regex` crate's byte regexes.
//!
//! PCRE's options as OpenResty reads them: `i` (caseless), `m` (multi-line), `s` (dot matches
//! newline), `x` (extended), `u`/`U` (UTF-8: classes such as `\w` then know Unicode), `a`
//! (anchored at the start position); `j`, `o`, `d`, `D` and `J` change nothing here. Subjects
//! are bytes, as in nginx. Compiled expressions are kept per worker thread, at most
//! `CACHE_MAX` of them (nginx's `lua_regex_cache_max_entries`). What PCRE has and the `regex`
//! crate does not (look-around, back-references, atomic groups) is a compile error returned
//! as OpenResty returns one: `nil` and the message.

use std::cell::RefCell;
use std::rc::Rc;

use regex::bytes::{Captures, Regex, RegexBuilder};
use rustc_hash::FxHashMap;

use super::*;

/// nginx's `lua_regex_cache_max_entries` default.
const CACHE_MAX: usize = 1024;

/// Compiled expressions by pattern and options.
type Cache = FxHashMap<(Vec<u8>, String), Rc<Compiled>>;

thread_local! {
    /// This worker thread's compiled expressions (as each nginx worker's PCRE cache).
    static CACHE: RefCell<Cache> = RefCell::new(FxHashMap::default());
}

struct Compiled {
    re: Regex,
    anchored: bool,
    /// Group names by index (`None` for an unnamed group), index 0 the whole match.
    names: Vec<Option<String>>,
}

fn compile(pattern: &[u8], options: &str) -> Result<Rc<Compiled>, String> {
    let key = (pattern.to_vec(), options.to_string());
    if let Some(c) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(c);
    }
    let text = std::str::from_utf8(pattern)
        .map_err(|_| "failed to compile regex: the pattern is not UTF-8".to_string())?;
    let mut b = RegexBuilder::new(text);
    let mut anchored = false;
    let mut unicode = false;
    for o in options.chars() {
        match o {
            'i' => {
                b.case_insensitive(true);
            }
            'm' => {
                b.multi_line(true);
            }
            's' => {
                b.dot_matches_new_line(true);
            }
            'x' => {
                b.ignore_whitespace(true);
            }
            'u' | 'U' => unicode = true,
            'a' => anchored = true,
            'j' | 'o' | 'd' | 'D' | 'J' => {}
            other => return Err(format!("unknown flag \"{other}\" (flags \"{options}\")")),
        }
    }
    b.unicode(unicode);
    let re = b
        .build()
        .map_err(|e| format!("pcre_compile() failed: {}", first_line(&e.to_string())))?;
    let names = re.capture_names().map(|n| n.map(str::to_string)).collect();
    let compiled = Rc::new(Compiled {
        re,
        anchored,
        names,
    });
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CACHE_MAX {
            c.clear();
        }
        c.insert(key, compiled.clone());
    });
    Ok(compiled)
}

fn first_line(s: &str) -> &str {
    s.lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or(s.lines().next().unwrap_or(s))
}

impl Compiled {
    /// The first match at or after byte `from` (only at `from` when anchored).
    fn captures_at<'s>(&self, subject: &'s [u8], from: usize) -> Option<Captures<'s>> {
        if from > subject.len() {
            return None;
        }
        let caps = self.re.captures_at(subject, from)?;
        if self.anchored && caps.get(0).map(|m| m.start()) != Some(from) {
            return None;
        }
        Some(caps)
    }

    /// The captures as OpenResty returns them: `[0]` the match, `[n]` each group (`false`
    /// when it took no part), and each named group by its name too.
    fn table(&self, lua: &Lua, caps: &Captures<'_>, into: Option<Table>) -> mlua::Result<Table> {
        let t = match into {
            Some(t) => t,
            None => lua.create_table()?,
        };
        for (i, name) in self.names.iter().enumerate() {
            let v = match caps.get(i) {
                Some(m) => Value::String(lua.create_string(m.as_bytes())?),
                None => Value::Boolean(false),
            };
            if let Some(n) = name {
                t.raw_set(n.as_str(), v.clone())?;
            }
            t.raw_set(i, v)?;
        }
        Ok(t)
    }
}

/// `ctx.pos` (1-based) as a byte offset.
fn start_of(ctx: &Option<Table>) -> mlua::Result<usize> {
    Ok(match ctx {
        Some(t) => match t.get::<Option<i64>>("pos")? {
            Some(p) if p > 1 => (p - 1) as usize,
            _ => 0,
        },
        None => 0,
    })
}

/// Moves `ctx.pos` past a match (1-based), as OpenResty does.
fn advance(ctx: &Option<Table>, end: usize) -> mlua::Result<()> {
    if let Some(t) = ctx {
        t.set("pos", end as i64 + 1)?;
    }
    Ok(())
}

type Failed = (Value, Value);

fn failed(lua: &Lua, e: String) -> mlua::Result<Failed> {
    Ok((Value::Nil, Value::String(lua.create_string(e)?)))
}

pub(super) fn install(lua: &Lua, ngx: &Table) -> mlua::Result<()> {
    let re = lua.create_table()?;
    set_fn(
        lua,
        &re,
        "match",
        |lua,
         (subject, pattern, options, ctx, res): (
            LuaString,
            LuaString,
            Option<String>,
            Option<Table>,
            Option<Table>,
        )| {
            let c = match compile(&pattern.as_bytes(), options.as_deref().unwrap_or("")) {
                Ok(c) => c,
                Err(e) => return failed(lua, e),
            };
            let subject = subject.as_bytes();
            let Some(caps) = c.captures_at(&subject, start_of(&ctx)?) else {
                return Ok((Value::Nil, Value::Nil));
            };
            advance(&ctx, caps.get(0).map_or(0, |m| m.end()))?;
            Ok((Value::Table(c.table(lua, &caps, res)?), Value::Nil))
        },
    )?;
    set_fn(
        lua,
        &re,
        "find",
        |lua,
         (subject, pattern, options, ctx, nth): (
            LuaString,
            LuaString,
            Option<String>,
            Option<Table>,
            Option<usize>,
        )| {
            let c = match compile(&pattern.as_bytes(), options.as_deref().unwrap_or("")) {
                Ok(c) => c,
                Err(e) => return Ok((Value::Nil, Value::String(lua.create_string(e)?))),
            };
            let subject = subject.as_bytes();
            let Some(caps) = c.captures_at(&subject, start_of(&ctx)?) else {
                return Ok((Value::Nil, Value::Nil));
            };
            advance(&ctx, caps.get(0).map_or(0, |m| m.end()))?;
            match caps.get(nth.unwrap_or(0)) {
                Some(m) => Ok((
                    Value::Integer(m.start() as i64 + 1),
                    Value::Integer(m.end() as i64),
                )),
                None => Ok((Value::Nil, Value::Nil)),
            }
        },
    )?;
    set_fn(
        lua,
        &re,
        "gmatch",
        |lua, (subject, pattern, options): (LuaString, LuaString, Option<String>)| {
            let c = match compile(&pattern.as_bytes(), options.as_deref().unwrap_or("")) {
                Ok(c) => c,
                Err(e) => return Ok((Value::Nil, Value::String(lua.create_string(e)?))),
            };
            let subject = subject.as_bytes().to_vec();
            let mut pos = Some(0usize);
            let iter = lua.create_function_mut(move |lua, ()| {
                let Some(from) = pos else {
                    return Ok(Value::Nil);
                };
                let Some(caps) = c.captures_at(&subject, from) else {
                    pos = None;
                    return Ok(Value::Nil);
                };
                let m = caps.get(0).expect("group 0");
                // An empty match moves on by one byte, or the iterator would stand still.
                pos = Some(if m.end() == m.start() {
                    m.end() + 1
                } else {
                    m.end()
                });
                Ok(Value::Table(c.table(lua, &caps, None)?))
            })?;
            Ok((Value::Function(iter), Value::Nil))
        },
    )?;
    for (name, global) in [("sub", false), ("gsub", true)] {
        set_fn(
            lua,
            &re,
            name,
            move |lua,
                  (subject, pattern, replace, options): (
                LuaString,
                LuaString,
                Value,
                Option<String>,
            )| {
                let c = match compile(&pattern.as_bytes(), options.as_deref().unwrap_or("")) {
                    Ok(c) => c,
                    Err(e) => {
                        return Ok((Value::Nil, Value::Nil, Value::String(lua.create_string(e)?)))
                    }
                };
                let subject = subject.as_bytes();
                let mut out = Vec::with_capacity(subject.len());
                let mut last = 0;
                let mut from = 0;
                let mut n = 0i64;
                while let Some(caps) = c.captures_at(&subject, from) {
                    let m = caps.get(0).expect("group 0");
                    out.extend_from_slice(&subject[last..m.start()]);
                    match &replace {
                        Value::Function(f) => {
                            let r: LuaString = f.call(c.table(lua, &caps, None)?)?;
                            out.extend_from_slice(&r.as_bytes());
                        }
                        Value::String(template) => {
                            if let Err(e) = expand(&template.as_bytes(), &caps, &c, &mut out) {
                                return Ok((
                                    Value::Nil,
                                    Value::Nil,
                                    Value::String(lua.create_string(e)?),
                                ));
                            }
                        }
                        _ => {
                            return Err(mlua::Error::runtime(
                                "bad argument #3 (string or function expected)",
                            ))
                        }
                    }
                    n += 1;
                    last = m.end();
                    if !global || c.anchored {
                        break;
                    }
                    if m.end() == m.start() {
                        // An empty match: copy one byte and move on.
                        if m.end() >= subject.len() {
                            break;
                        }
                        out.push(subject[m.end()]);
                        last = m.end() + 1;
                        from = m.end() + 1;
                    } else {
                        from = m.end();
                    }
                }
                out.extend_from_slice(&subject[last.min(subject.len())..]);
                Ok((
                    Value::String(lua.create_string(out)?),
                    Value::Integer(n),
                    Value::Nil,
                ))
            },
        )?;
    }
    ngx.set("re", re)?;
    // lua-resty-core's `ngx.re` module: `split` (and the `opt` no-op).
    let package: Table = lua.globals().get("package")?;
    let preload: Table = package.get("preload")?;
    preload.set(
        "ngx.re",
        lua.load(SPLIT).set_name("=ngx.re").into_function()?,
    )?;
    Ok(())
}

/// OpenResty's replacement template: `$0`..`$99` and `${name}`/`${n}`, `$$` for a dollar.
fn expand(
    template: &[u8],
    caps: &Captures<'_>,
    c: &Compiled,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let mut i = 0;
    while i < template.len() {
        let ch = template[i];
        if ch != b'$' {
            out.push(ch);
            i += 1;
            continue;
        }
        let rest = &template[i + 1..];
        let group = |name: &[u8]| -> Option<usize> {
            let name = std::str::from_utf8(name).ok()?;
            name.parse::<usize>()
                .ok()
                .or_else(|| c.names.iter().position(|n| n.as_deref() == Some(name)))
        };
        match rest.first() {
            Some(b'$') => {
                out.push(b'$');
                i += 2;
            }
            Some(b'{') => {
                let Some(end) = rest.iter().position(|&b| b == b'}') else {
                    return Err("failed to compile the replacement template".into());
                };
                let g = group(&rest[1..end]).ok_or("failed to compile the replacement template")?;
                if let Some(m) = caps.get(g) {
                    out.extend_from_slice(m.as_bytes());
                }
                i += end + 2;
            }
            Some(d) if d.is_ascii_digit() => {
                let len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
                let g = group(&rest[..len]).unwrap_or(usize::MAX);
                if let Some(m) = caps.get(g) {
                    out.extend_from_slice(m.as_bytes());
                }
                i += 1 + len;
            }
            _ => return Err("failed to compile the replacement template".into()),
        }
    }
    Ok(())
}

const SPLIT: &str = r#"
local M = {}
function M.opt() end
-- lua-resty-core's ngx.re.split: the pieces between matches (empty trailing ones dropped);
-- with `max`, at most that many pieces, the last holding the rest.
function M.split(subj, regex, opts, ctx, max, res)
  res = res or {}
  local n, pos, len = 0, (ctx and ctx.pos) or 1, #subj
  local start = pos
  if regex == "" then
    for i = pos, len do
      n = n + 1
      if max and max > 0 and n == max then res[n] = subj:sub(i); return res end
      res[n] = subj:sub(i, i)
    end
    for i = n + 1, #res do res[i] = nil end
    return res
  end
  local c = { pos = pos }
  while true do
    if max and max > 0 and n == max - 1 then break end
    local from, to, err = ngx.re.find(subj, regex, opts, c)
    if err then return nil, err end
    if not from then break end
    if to < from then
      -- an empty match: step over one byte
      if from > len then break end
      c.pos = from + 1
      if from > start then n = n + 1; res[n] = subj:sub(start, from - 1); start = from end
    else
      n = n + 1
      res[n] = subj:sub(start, from - 1)
      start = to + 1
      c.pos = to + 1
    end
  end
  n = n + 1
  res[n] = subj:sub(start)
  if not max or max <= 0 then
    while n > 0 and res[n] == "" do res[n] = nil; n = n - 1 end
  end
  for i = n + 1, #res do res[i] = nil end
  return res
end
return M
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn run(code: &str) -> String {
        let lua = Lua::new();
        let ngx = lua.create_table().unwrap();
        install(&lua, &ngx).unwrap();
        lua.globals().set("ngx", ngx).unwrap();
        lua.load(code).eval::<String>().unwrap()
    }

    #[test]
    fn match_find_and_gmatch_read_as_openresty_answers() {
        assert_eq!(
            run(r#"local m = ngx.re.match("hello, 1234", "([0-9])[0-9]+")
                   return m[0] .. "|" .. m[1]"#),
            "1234|1"
        );
        assert_eq!(
            run(
                r#"local m = ngx.re.match("hello, 1234", "(?<first>[a-z]+), (x)?", "jo")
                   return m.first .. "|" .. tostring(m[2])"#
            ),
            "hello|false"
        );
        assert_eq!(
            run(
                r#"return tostring(ngx.re.match("HELLO", "hello", "i") ~= nil)
                   .. tostring(ngx.re.match("hello", "hello", "", { pos = 2 }))"#
            ),
            "truenil"
        );
        assert_eq!(
            run(
                r#"local from, to = ngx.re.find("hello, 1234", "([0-9]+)", "jo", nil, 1)
                   return from .. "-" .. to"#
            ),
            "8-11"
        );
        assert_eq!(
            run(r#"local out = {}
                   for m in ngx.re.gmatch("a=1, b=2", "(\\w)=(\\d)") do out[#out+1] = m[1] .. m[2] end
                   return table.concat(out, ",")"#),
            "a1,b2"
        );
        assert_eq!(
            run(r#"local m, err = ngx.re.match("x", "(?=x)")
                   return tostring(m) .. " " .. err:sub(1, 21)"#),
            "nil pcre_compile() failed"
        );
        // Anchored: only at the start position.
        assert_eq!(
            run(
                r#"return tostring(ngx.re.match("ab", "b", "a")) .. tostring(ngx.re.find("ab", "a", "a"))"#
            ),
            "nil1"
        );
    }

    #[test]
    fn sub_and_gsub_expand_templates_and_call_functions() {
        assert_eq!(
            run(
                r#"local s, n = ngx.re.gsub("hello, world", "([a-z])[a-z]+", "[$0,$1]")
                   return s .. " " .. n"#
            ),
            "[hello,h], [world,w] 2"
        );
        assert_eq!(
            run(
                r#"local s, n = ngx.re.sub("hello, world", "(?<w>[a-z]+)", "${w}$$")
                   return s .. " " .. n"#
            ),
            "hello$, world 1"
        );
        assert_eq!(
            run(
                r#"return (ngx.re.gsub("a1b22", "[0-9]+", function(m) return "<" .. m[0] .. ">" end))"#
            ),
            "a<1>b<22>"
        );
        assert_eq!(run(r#"return (ngx.re.gsub("abc", "", "-"))"#), "-a-b-c-");
    }

    #[test]
    fn split_is_lua_resty_cores() {
        assert_eq!(
            run(r#"local re = require "ngx.re"
                   local t = re.split("a,b,,c,,", ",")
                   return #t .. ":" .. table.concat(t, "|")"#),
            "4:a|b||c"
        );
        assert_eq!(
            run(
                r#"local t = require("ngx.re").split("a, b, c", ", *", nil, nil, 2)
                   return table.concat(t, "|")"#
            ),
            "a|b, c"
        );
    }
}
