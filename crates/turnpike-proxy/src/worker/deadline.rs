//! Coarse per-worker timeouts for the request path, as nginx keeps its event timers: a slot in
//! a slab per waiting operation and one ticker per worker that wakes the expired ones. Arming
//! and disarming cost a few stores instead of a tokio timer-wheel entry per request (measured:
//! ~640 instructions per request saved, BENCHMARKS.md). Precision is the tick (`TICK`).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often expired deadlines are checked.
pub const TICK: Duration = Duration::from_millis(20);

struct Entry {
    deadline: Instant,
    waker: Option<Waker>,
    expired: bool,
    /// A connection waiting for its next request (see `arm_idle`).
    idle: bool,
}

pub struct Deadlines {
    slots: RefCell<Vec<Option<Entry>>>,
    free: RefCell<Vec<usize>>,
    /// The time at the last tick: a clock that costs a load to read.
    now: std::cell::Cell<Instant>,
    /// No armed deadline is earlier than this: the ticker skips its scan until then (idle
    /// keep-alive connections hold long deadlines; scanning them every tick would cost).
    earliest: std::cell::Cell<Option<Instant>>,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            slots: RefCell::default(),
            free: RefCell::default(),
            now: std::cell::Cell::new(Instant::now()),
            earliest: std::cell::Cell::new(None),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Elapsed;

impl Deadlines {
    pub fn new() -> Rc<Deadlines> {
        Rc::new(Deadlines::default())
    }

    fn insert(&self, deadline: Instant, idle: bool) -> usize {
        if self.earliest.get().is_none_or(|e| deadline < e) {
            self.earliest.set(Some(deadline));
        }
        let e = Entry {
            deadline,
            waker: None,
            expired: false,
            idle,
        };
        let mut slots = self.slots.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(i) => {
                slots[i] = Some(e);
                i
            }
            None => {
                slots.push(Some(e));
                slots.len() - 1
            }
        }
    }

    fn remove(&self, i: usize) {
        self.slots.borrow_mut()[i] = None;
        self.free.borrow_mut().push(i);
    }

    /// Marks and wakes every entry past its deadline; run by the worker's ticker.
    pub fn expire(&self, now: Instant) {
        let mut wake = Vec::new();
        let mut earliest: Option<Instant> = None;
        for e in self.slots.borrow_mut().iter_mut().flatten() {
            if e.expired {
                continue;
            }
            if e.deadline <= now {
                e.expired = true;
                if let Some(w) = e.waker.take() {
                    wake.push(w);
                }
            } else if earliest.is_none_or(|t| e.deadline < t) {
                earliest = Some(e.deadline);
            }
        }
        self.earliest.set(earliest);
        for w in wake {
            w.wake();
        }
    }

    /// Expires every idle-connection deadline now (the worker is shutting down: connections
    /// waiting for a request close; those serving one finish it first).
    pub fn expire_idle(&self) {
        let mut wake = Vec::new();
        for e in self.slots.borrow_mut().iter_mut().flatten() {
            if e.idle && !e.expired {
                e.expired = true;
                if let Some(w) = e.waker.take() {
                    wake.push(w);
                }
            }
        }
        for w in wake {
            w.wake();
        }
    }

    /// Arms a deadline for a hand-polled operation (see `Timeout` for futures): the slot to
    /// pass to `poll_expired` and `disarm`.
    pub fn arm(&self, after: Duration) -> usize {
        // From the coarse clock, which lags by up to a tick: one tick more never fires early,
        // and saves a clock read per armed deadline.
        self.insert(self.coarse_now() + after + TICK, false)
    }

    /// Arms the deadline of a connection waiting for its next request; `expire_idle` ends
    /// these early.
    pub fn arm_idle(&self, after: Duration) -> usize {
        self.insert(self.coarse_now() + after + TICK, true)
    }

    /// True once the slot's deadline has passed; otherwise registers the waker to be woken then.
    pub fn poll_expired(&self, slot: usize, cx: &Context<'_>) -> bool {
        let mut slots = self.slots.borrow_mut();
        let Some(e) = slots[slot].as_mut() else {
            return false;
        };
        if e.expired {
            return true;
        }
        match &e.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => e.waker = Some(cx.waker().clone()),
        }
        false
    }

    pub fn disarm(&self, slot: usize) {
        self.remove(slot);
    }

    /// The time at the last tick (at most `TICK` old).
    pub fn coarse_now(&self) -> Instant {
        self.now.get()
    }

    pub fn pending(&self) -> usize {
        self.slots.borrow().iter().flatten().count()
    }

    /// Runs `fut` until it completes or `after` has passed (to within one tick).
    pub fn timeout<F: Future>(self: &Rc<Self>, after: Duration, fut: F) -> Timeout<F> {
        Timeout {
            fut,
            deadlines: self.clone(),
            after,
            slot: None,
        }
    }

    /// Runs the ticker forever.
    pub async fn run(self: Rc<Self>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = Instant::now();
            self.now.set(now);
            if self.earliest.get().is_some_and(|e| e <= now) {
                self.expire(now);
            }
        }
    }
}

pin_project_lite::pin_project! {
    pub struct Timeout<F> {
        #[pin]
        fut: F,
        deadlines: Rc<Deadlines>,
        after: Duration,
        slot: Option<usize>,
    }

    impl<F> PinnedDrop for Timeout<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(i) = this.slot.take() {
                this.deadlines.remove(i);
            }
        }
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            if let Some(i) = this.slot.take() {
                this.deadlines.remove(i);
            }
            return Poll::Ready(Ok(v));
        }
        // Armed only when the operation actually has to wait.
        let i = *this
            .slot
            .get_or_insert_with(|| this.deadlines.arm(*this.after));
        if this.deadlines.poll_expired(i, cx) {
            this.deadlines.disarm(i);
            *this.slot = None;
            return Poll::Ready(Err(Elapsed));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn completes_or_expires_and_frees_its_slot() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let d = Deadlines::new();
                tokio::task::spawn_local(d.clone().run());
                assert_eq!(d.timeout(Duration::from_secs(5), async { 7 }).await, Ok(7));
                let slow = d.timeout(
                    Duration::from_millis(50),
                    tokio::time::sleep(Duration::from_secs(10)),
                );
                // Without the deadline the sleep would finish Ok after 10 s.
                assert_eq!(slow.await, Err(Elapsed));
                let quick = d.timeout(
                    Duration::from_secs(5),
                    tokio::time::sleep(Duration::from_millis(30)),
                );
                assert_eq!(quick.await, Ok(()));
                assert_eq!(d.pending(), 0, "every slot is freed");
            })
            .await;
    }
}
