//! The connections of a backend's transactions: at most `max` open at
//! once (`--pg-connections`), however many threads want one
//! (`docs/design.md` §8f). A caller finding all of them in use waits for
//! one to come back; a thread that already holds one is never made to wait
//! for a second (a read started inside a write's closure, say), so nested
//! use cannot deadlock on the bound: it may pass it, by one connection a
//! nesting level.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use postgres::Client;

use super::prepared::Prepared;

/// The connections a backend opens for transactions when not told.
pub const DEFAULT_CONNECTIONS: usize = crate::store::DEFAULT_PG_CONNECTIONS;

thread_local! {
    /// Pool connections this thread holds (of any backend).
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// What the pool has: idle connections and how many are open in all.
#[derive(Default)]
struct Slots {
    idle: Vec<(Client, Prepared)>,
    /// Connections open: idle, lent out, or being opened.
    open: usize,
}

/// A bounded pool of connections.
pub(super) struct Pool {
    slots: Mutex<Slots>,
    freed: Condvar,
    max: usize,
}

/// A connection lent by a [`Pool`]: given back with [`Pool::give_back`],
/// or closed (and its slot freed) when dropped.
pub(super) struct Conn {
    client: Option<Client>,
    /// The statements its session has prepared.
    pub(super) prepared: Prepared,
    pool: Arc<Pool>,
    /// The thread that took it (the only one whose count it changes).
    taker: std::thread::ThreadId,
}

impl Deref for Conn {
    type Target = Client;
    fn deref(&self) -> &Client {
        // Only `give_back` takes the client out, consuming the `Conn`.
        self.client.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Given back already: nothing to do.
        if self.client.take().is_some() {
            self.unheld();
            self.pool.closed();
        }
    }
}

impl Conn {
    fn unheld(&self) {
        if std::thread::current().id() == self.taker {
            HELD.with(|h| h.set(h.get().saturating_sub(1)));
        }
    }
}

/// What [`Pool::take`] gives: a connection to reuse, or leave to open one.
pub(super) enum Slot {
    Idle(Box<Conn>),
    /// A slot is reserved: open a connection and [`Pool::lend`] it (or
    /// [`Pool::closed`] if opening fails).
    Open,
}

impl Pool {
    pub(super) fn new(max: usize) -> Arc<Pool> {
        Arc::new(Pool {
            slots: Mutex::new(Slots::default()),
            freed: Condvar::new(),
            max: max.max(1),
        })
    }

    /// The most connections open at once (nesting aside).
    pub(super) fn max(&self) -> usize {
        self.max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn conn(self: &Arc<Self>, (client, prepared): (Client, Prepared)) -> Conn {
        HELD.with(|h| h.set(h.get() + 1));
        Conn {
            client: Some(client),
            prepared,
            pool: Arc::clone(self),
            taker: std::thread::current().id(),
        }
    }

    /// An idle connection, or a reserved slot to open one in; waits while
    /// every connection is in use (unless this thread holds one already),
    /// up to `patience`. `None`: none came back in that time.
    pub(super) fn take(self: &Arc<Self>, patience: Duration) -> Option<Slot> {
        let nested = HELD.with(Cell::get) > 0;
        let deadline = Instant::now() + patience;
        let mut slots = self.lock();
        loop {
            while let Some(client) = slots.idle.pop() {
                if client.0.is_closed() {
                    slots.open = slots.open.saturating_sub(1);
                    continue;
                }
                drop(slots);
                return Some(Slot::Idle(Box::new(self.conn(client))));
            }
            if slots.open < self.max || nested {
                slots.open += 1;
                return Some(Slot::Open);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            slots = self
                .freed
                .wait_timeout(slots, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A connection opened in a slot [`Pool::take`] reserved, lent.
    pub(super) fn lend(self: &Arc<Self>, client: Client) -> Conn {
        self.conn((client, Prepared::default()))
    }

    /// An idle connection, if one is there now (no slot reserved).
    pub(super) fn idle(self: &Arc<Self>) -> Option<Conn> {
        let mut slots = self.lock();
        while let Some(client) = slots.idle.pop() {
            if !client.0.is_closed() {
                drop(slots);
                return Some(self.conn(client));
            }
            slots.open = slots.open.saturating_sub(1);
        }
        None
    }

    /// A slot is free again (its connection closed, or never opened).
    pub(super) fn closed(&self) {
        let mut slots = self.lock();
        slots.open = slots.open.saturating_sub(1);
        drop(slots);
        self.freed.notify_one();
    }

    /// Takes a connection back for reuse (only one outside any
    /// transaction); one past the bound (a nested one) is closed.
    pub(super) fn give_back(&self, mut conn: Conn) {
        conn.unheld();
        let Some(client) = conn.client.take() else {
            return;
        };
        let mut slots = self.lock();
        if client.is_closed() || slots.open > self.max {
            slots.open = slots.open.saturating_sub(1);
        } else {
            slots
                .idle
                .push((client, std::mem::take(&mut conn.prepared)));
        }
        drop(slots);
        self.freed.notify_one();
    }

    /// Closes every idle connection (what cut one has likely cut them all).
    pub(super) fn clear_idle(&self) {
        let mut slots = self.lock();
        let n = slots.idle.len();
        slots.idle.clear();
        slots.open = slots.open.saturating_sub(n);
        drop(slots);
        self.freed.notify_all();
    }

    /// Runs `f` on each idle connection and its record of prepared
    /// statements (for tests; the pool is locked meanwhile).
    pub(super) fn each_idle(&self, mut f: impl FnMut(&mut Client, &mut Prepared)) {
        let mut slots = self.lock();
        for (client, prepared) in &mut slots.idle {
            f(client, prepared);
        }
    }

    /// Connections open now (idle or lent).
    pub(super) fn open(&self) -> usize {
        self.lock().open
    }
}
