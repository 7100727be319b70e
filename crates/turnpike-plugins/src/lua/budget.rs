//! The time budget of a call into Lua: code that runs on without giving its worker back (an
//! endless loop, a runaway pattern) is stopped once it has run for its budget (`lua_time_budget`, [`DEFAULT`]), with a Lua
//! error the phase reports as any other (Kong's 500 for a request, a log line naming the
//! plugin). Kong has no such bound: a loop there holds its nginx worker for good.
//!
//! How: each worker's Lua state has a [`Slot`] counting its calls (odd while one runs: one
//! atomic add as a call begins and one as it ends, no clock read). One watchdog thread per
//! node looks at the slots every [`TICK`]; for a call it has seen running for the budget it
//! sets a count hook on that state from its own thread (Lua's `lua_sethook` is made to be
//! called asynchronously). The hook runs on the worker's thread at the next instructions,
//! checks that the call it finds is still the late one, and raises the error; it stays set
//! until the call returns and the worker clears it. `pcall`, `xpcall` and `coroutine.resume`
//! hand a late call's error on instead of catching it ([`guard_catchers`]), so code that
//! catches errors in its loop is stopped too. LuaJIT's compiled loops never look at hooks, so the states run with the
//! JIT compiler off (`jit.off()`): plugin code is short, mostly calls into the PDK, and the
//! interpreter runs it (see BENCHMARKS.md for what it costs a plugin).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use mlua::ffi;

/// How long one call into Lua may run before it is stopped, unless `lua_time_budget` says.
pub const DEFAULT: Duration = Duration::from_secs(2);
/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(100);
/// Instructions between two hook calls once a call is late.
const HOOK_EVERY: i32 = 100;

/// The node's watchdog: the slots of its workers' Lua states, with what it last saw of each
/// (the call count, and for how many ticks it stood).
#[derive(Default)]
pub struct Watchdog {
    slots: Mutex<Vec<Watched>>,
    /// The budget, set by the first state registered.
    started: OnceLock<Duration>,
}

struct Watched {
    slot: Arc<Slot>,
    seen: u64,
    ticks: u32,
}

/// One Lua state: its raw pointer (0 once it is gone) and its calls, counted twice each (odd
/// while one runs).
pub(super) struct Slot {
    state: AtomicUsize,
    calls: AtomicU64,
    /// The count of the call the hook was set for.
    hooked: AtomicU64,
}

thread_local! {
    /// The slot of this thread's Lua state, for the hook (set once, when the state is made).
    static HERE: RefCell<Option<Arc<Slot>>> = const { RefCell::new(None) };
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watchdog")
    }
}

impl Watchdog {
    /// A slot for a new state (its raw pointer), made on the thread that will run it; the
    /// watchdog's thread starts with the first.
    pub(super) fn register(self: &Arc<Self>, lua: &mlua::Lua, budget: Duration) -> Arc<Slot> {
        let mut raw = 0usize;
        // SAFETY: only reads the state's pointer.
        let _ = unsafe { lua.exec_raw::<()>((), |s| raw = s as usize) };
        let slot = Arc::new(Slot {
            state: AtomicUsize::new(raw),
            calls: AtomicU64::new(0),
            hooked: AtomicU64::new(u64::MAX),
        });
        HERE.with(|h| *h.borrow_mut() = Some(slot.clone()));
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Watched {
                slot: slot.clone(),
                seen: 0,
                ticks: 0,
            });
        let mut first = false;
        self.started.get_or_init(|| {
            first = true;
            budget
        });
        if first {
            let me = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("turnpike-lua-watchdog".into())
                .spawn(move || watch(me, budget));
            if let Err(e) = spawned {
                tracing::error!("cannot start the Lua watchdog: {e}");
            }
        }
        slot
    }

    /// The state is about to be freed: the watchdog must not touch it any more.
    pub(super) fn forget(&self, slot: &Arc<Slot>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slot.state.store(0, Ordering::SeqCst);
        slots.retain(|w| !Arc::ptr_eq(&w.slot, slot));
    }
}

/// Marks a call into the state running until dropped; then clears a hook set for it.
pub(super) struct Running(Arc<Slot>);

pub(super) fn begin(slot: &Arc<Slot>) -> Running {
    slot.calls.fetch_add(1, Ordering::Relaxed);
    Running(slot.clone())
}

impl Drop for Running {
    fn drop(&mut self) {
        let call = self.0.calls.fetch_add(1, Ordering::Relaxed);
        if self.0.hooked.load(Ordering::Relaxed) == call {
            let raw = self.0.state.load(Ordering::Relaxed);
            if raw != 0 {
                // SAFETY: this thread owns the state, which is alive (state != 0).
                unsafe { ffi::lua_sethook(raw as *mut ffi::lua_State, None, 0, 0) };
            }
        }
    }
}

fn watch(dog: Weak<Watchdog>, budget: Duration) {
    let ticks_late = (budget.as_millis() / TICK.as_millis()).max(1) as u32;
    loop {
        std::thread::sleep(TICK);
        let Some(dog) = dog.upgrade() else {
            return; // the node is gone
        };
        let mut slots = dog.slots.lock().unwrap_or_else(|e| e.into_inner());
        for w in slots.iter_mut() {
            let calls = w.slot.calls.load(Ordering::Relaxed);
            if calls % 2 == 0 || calls != w.seen {
                // Idle, or another call than last time.
                w.seen = calls;
                w.ticks = 0;
                continue;
            }
            w.ticks += 1;
            let raw = w.slot.state.load(Ordering::SeqCst);
            if w.ticks < ticks_late || raw == 0 || w.slot.hooked.load(Ordering::SeqCst) == calls {
                continue;
            }
            w.slot.hooked.store(calls, Ordering::SeqCst);
            // SAFETY: the state lives while its slot's pointer is set (`forget` clears it under
            // the lock held here); `lua_sethook` may be called while the state runs elsewhere.
            unsafe {
                ffi::lua_sethook(
                    raw as *mut ffi::lua_State,
                    Some(hook),
                    ffi::LUA_MASKCOUNT,
                    HOOK_EVERY,
                )
            };
        }
    }
}

/// Whether the call running on this thread is the one the watchdog found late.
fn late_here() -> bool {
    HERE.with(|h| {
        h.borrow().as_ref().is_some_and(|s| {
            let calls = s.calls.load(Ordering::Relaxed);
            calls % 2 == 1 && s.hooked.load(Ordering::Relaxed) == calls
        })
    })
}

/// Makes `pcall`, `xpcall` and `coroutine.resume` pass a late call's error on rather than
/// catch it (else `while true do pcall(f) end` would outlive the budget). Run on a new state,
/// before anything copies those functions.
pub(super) fn guard_catchers(lua: &mlua::Lua) -> mlua::Result<()> {
    let late = lua.create_function(|_, ()| Ok(late_here()))?;
    lua.load(GUARD).set_name("=budget").call::<()>(late)
}

const GUARD: &str = r#"
local late = ...
local error, pcall_, xpcall_, resume_ = error, pcall, xpcall, coroutine.resume
local function pass(ok, ...)
  if not ok and late() then error((...), 0) end
  return ok, ...
end
pcall = function(...) return pass(pcall_(...)) end
xpcall = function(...) return pass(xpcall_(...)) end
coroutine.resume = function(...) return pass(resume_(...)) end
"#;

/// Runs on the state's own thread. Raises the error when the running call is the late one;
/// otherwise (it ended meanwhile) removes itself.
unsafe extern "C-unwind" fn hook(l: *mut ffi::lua_State, _ar: *mut ffi::lua_Debug) {
    if !late_here() {
        // SAFETY: on the state's own thread.
        unsafe { ffi::lua_sethook(l, None, 0, 0) };
        return;
    }
    // SAFETY: raising a Lua error from a hook is allowed; nothing of ours is left to drop.
    unsafe {
        ffi::luaL_error(
            l,
            c"the plugin's code ran past its time budget (lua_time_budget) without giving the worker back"
                .as_ptr(),
        )
    };
}
