//! Errors of the safe API: each says what was wrong and how to fix it.

use std::io;

use softrdma_engine::{PostErrorKind, VerbsError};

/// Why a call failed. New kinds may come: a `match` needs an arm for the others.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No device has that name.
    #[error("no RDMA device named {name:?}; the devices are: {available}")]
    NoDevice {
        /// What was asked for.
        name: String,
        /// The devices that exist.
        available: String,
    },
    /// The device refused a verb (bad argument, limit, object still in use, QP state).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A work request of a list was not posted (`*bad_wr`): every one before `index` was,
    /// none from `index` on.
    #[error("work request {index} was not posted: {kind}")]
    Post {
        /// The position of the first WR not posted.
        index: usize,
        /// What was wrong with it.
        kind: PostErrorKind,
    },
    /// A memory region is too small for the access asked of it.
    #[error("{what}: bytes {start}..{end} are outside the memory region's {len} bytes")]
    OutOfRange {
        /// The call.
        what: &'static str,
        /// First byte asked for.
        start: usize,
        /// One past the last byte asked for.
        end: usize,
        /// The region's length.
        len: usize,
    },
    /// An object of another device (context) was passed.
    #[error("{0} belongs to another device context; use objects of one context together")]
    WrongContext(&'static str),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The memory allocation for a memory region failed.
    #[error("cannot allocate {0} bytes for a memory region")]
    NoMemory(usize),
    /// The connection manager refused the call; the message says why.
    #[error("connection manager: {0}")]
    Cm(softrdma_cm::CmError),
    /// A CM ID is not bound to a device yet.
    #[error("{0}: the CM ID is not bound to a device")]
    Unbound(&'static str),
    /// `bind_addr` on a CM ID that is bound already.
    #[error("bind_addr: the CM ID is bound already (bind once, before resolve_addr or listen)")]
    AlreadyBound,
    /// A CM ID has no QP attached.
    #[error("{0}: the CM ID has no QP; call create_qp on it first")]
    NoQp(&'static str),
    /// A different CM event came than the one waited for.
    #[error("expected the CM event {expected:?}, got {got:?} ({status:?})")]
    UnexpectedEvent {
        /// What was expected.
        expected: softrdma_cm::CmEventKind,
        /// What came.
        got: softrdma_cm::CmEventKind,
        /// Its status.
        status: softrdma_cm::CmStatus,
    },
    /// A setting (an environment variable) has a value softrdma cannot use.
    #[error("{name}={value:?}: {problem}; for example {name}={example}")]
    BadSetting {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        problem: String,
        /// A value that works.
        example: &'static str,
    },
    /// A wait ended without the event.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(std::time::Duration, &'static str),
}

impl From<softrdma_engine::PostError> for Error {
    fn from(e: softrdma_engine::PostError) -> Self {
        Error::Post { index: e.index, kind: e.kind }
    }
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io { what: what.into(), source }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
