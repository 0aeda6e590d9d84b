//! The async layer: completion channels and CM event channels as tokio futures (feature
//! `tokio`, on by default).
//!
//! Both channels are eventfds, so [`tokio::io::unix::AsyncFd`] watches them with no thread
//! of its own; the device's progress thread makes the progress. The standard pattern for a
//! completion, arm, poll once, then await, never loses one:
//!
//! ```no_run
//! # async fn demo(ctx: softrdma::Context) -> softrdma::Result<()> {
//! use softrdma::asynch::{AsyncCompChannel, wait_completion};
//!
//! let channel = AsyncCompChannel::new(ctx.create_comp_channel()?)?;
//! let cq = ctx.create_cq(64, Some(channel.channel()))?;
//! // ... create a QP on `cq`, post work ...
//! let wc = wait_completion(&cq, &channel).await?;
//! println!("{:?} finished with {:?}", wc.wr_id, wc.status);
//! # Ok(()) }
//! ```

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use crate::{CmEvent, CompChannel, Cq, Error, EventChannel, Result, Wc};

/// A descriptor tokio can watch: the channel's eventfd.
struct Watched<T: AsFd>(T);

impl<T: AsFd> AsRawFd for Watched<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Registers a channel's eventfd with the current tokio runtime.
///
/// Tokio's contract (I/O safety, tokio-rs/tokio#8587) is that the descriptor stays open and
/// the same while registered. `T` is a channel handle that shares ownership of its eventfd
/// (an `Arc` inside): the `AsyncFd` owns one handle, so the descriptor closes only after it
/// is dropped, and `as_raw_fd` always returns that one descriptor.
#[allow(unsafe_code)]
fn register<T: AsFd>(t: T) -> Result<AsyncFd<Watched<T>>> {
    // SAFETY: see above: the watched handle keeps its eventfd open and unchanged for the
    // whole life of the AsyncFd that owns it.
    unsafe { AsyncFd::register(Watched(t)) }
        .map_err(|e| Error::io("registering a channel with tokio (inside a runtime?)", io::Error::from(e)))
}

/// A [`CompChannel`] whose events can be awaited.
pub struct AsyncCompChannel {
    fd: AsyncFd<Watched<CompChannel>>,
}

impl std::fmt::Debug for AsyncCompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCompChannel").finish_non_exhaustive()
    }
}

impl AsyncCompChannel {
    /// Watches `channel` from the current tokio runtime (call it inside one).
    pub fn new(channel: CompChannel) -> Result<Self> {
        Ok(Self { fd: register(channel)? })
    }

    /// The channel, to create CQs on.
    pub fn channel(&self) -> &CompChannel {
        &self.fd.get_ref().0
    }

    /// The CQ of the next completion event (`ibv_get_cq_event`, awaited).
    pub async fn next_event(&self) -> Result<Cq> {
        loop {
            if let Some(cq) = self.channel().get_cq_event(Some(Duration::ZERO))? {
                return Ok(cq);
            }
            let mut ready = self.fd.readable().await.map_err(|e| Error::io("waiting for a completion event", e))?;
            ready.clear_ready();
        }
    }
}

/// The next completion of `cq`, whose events go to `channel`: poll; else arm the CQ, poll
/// once more (a completion that came before the arming raises no event), and await the
/// event.
pub async fn wait_completion(cq: &Cq, channel: &AsyncCompChannel) -> Result<Wc> {
    loop {
        if let Some(wc) = cq.poll_one() {
            return Ok(wc);
        }
        cq.req_notify(false)?;
        if let Some(wc) = cq.poll_one() {
            return Ok(wc);
        }
        channel.next_event().await?;
    }
}

/// An [`EventChannel`] whose CM events can be awaited.
pub struct AsyncEventChannel {
    fd: AsyncFd<Watched<EventChannel>>,
}

impl std::fmt::Debug for AsyncEventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEventChannel").finish_non_exhaustive()
    }
}

impl AsyncEventChannel {
    /// Watches `channel` from the current tokio runtime.
    pub fn new(channel: EventChannel) -> Result<Self> {
        Ok(Self { fd: register(channel)? })
    }

    /// The channel, to create CM IDs on.
    pub fn channel(&self) -> &EventChannel {
        &self.fd.get_ref().0
    }

    /// The next CM event (`rdma_get_cm_event`, awaited).
    pub async fn next_event(&self) -> Result<CmEvent> {
        loop {
            if let Some(event) = self.channel().get_cm_event(Some(Duration::ZERO))? {
                return Ok(event);
            }
            let mut ready = self.fd.readable().await.map_err(|e| Error::io("waiting for a CM event", e))?;
            ready.clear_ready();
        }
    }
}
