//! The one table from softrdma's errors to `errno` values, and from work completion
//! statuses to `enum ibv_wc_status`.

use std::ffi::{CStr, c_int};

use softrdma::{Error, PostErrorKind, VerbsError, WcStatus};

/// Sets the calling thread's `errno`.
pub fn set(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The `errno` value for `e`.
pub fn of(e: &Error) -> c_int {
    match e {
        Error::NoDevice { .. } => libc::ENODEV,
        Error::Verbs(v) => match v {
            VerbsError::NoResources(_) => libc::ENOMEM,
            VerbsError::Busy(_) => libc::EBUSY,
            VerbsError::NotFound { .. } | VerbsError::Invalid(_) | VerbsError::ModifyQp(_) => libc::EINVAL,
        },
        Error::Post { kind: PostErrorKind::QueueFull { .. }, .. } => libc::ENOMEM,
        Error::Post { kind: PostErrorKind::Invalid(_), .. } => libc::EINVAL,
        Error::NoMemory(_) => libc::ENOMEM,
        Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        Error::Timeout(..) => libc::ETIMEDOUT,
        Error::OutOfRange { .. } | Error::WrongContext(_) => libc::EINVAL,
        _ => libc::EINVAL,
    }
}

/// Sets `errno` to `n` and returns it, as the verbs that return an error number do.
pub fn fail_with(n: c_int) -> c_int {
    set(n);
    n
}

/// Sets `errno` for `e` and returns it, as the verbs that return an error number do.
pub fn fail(e: &Error) -> c_int {
    let n = of(e);
    set(n);
    n
}

/// What a verb that makes an object returns: `ok`'s pointer, or NULL with `errno` set
/// for the error.
pub fn or_null<T, P>(r: Result<T, Error>, ok: impl FnOnce(T) -> *mut P) -> *mut P {
    match r {
        Ok(v) => ok(v),
        Err(e) => {
            fail(&e);
            std::ptr::null_mut()
        }
    }
}

/// `enum ibv_wc_status` for `s`.
pub fn wc_status(s: WcStatus) -> u32 {
    match s {
        WcStatus::Success => 0,
        WcStatus::LocLenErr => 1,
        WcStatus::LocQpOpErr => 2,
        WcStatus::LocProtErr => 4,
        WcStatus::WrFlushErr => 5,
        WcStatus::MwBindErr => 6,
        WcStatus::BadRespErr => 7,
        WcStatus::LocAccessErr => 8,
        WcStatus::RemInvReqErr => 9,
        WcStatus::RemAccessErr => 10,
        WcStatus::RemOpErr => 11,
        WcStatus::RetryExcErr => 12,
        WcStatus::RnrRetryExcErr => 13,
        WcStatus::FatalErr => 19,
        WcStatus::GeneralErr => 21,
    }
}

/// `ibv_wc_status_str`'s strings, indexed by `enum ibv_wc_status` (rdma-core's wording).
pub const WC_STATUS_STR: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_string() {
        assert_eq!(WC_STATUS_STR[wc_status(WcStatus::RetryExcErr) as usize], c"transport retry counter exceeded");
        assert_eq!(WC_STATUS_STR[wc_status(WcStatus::WrFlushErr) as usize], c"Work Request Flushed Error");
    }

    #[test]
    fn errors_map_to_errno() {
        let full = Error::Post { index: 3, kind: PostErrorKind::QueueFull { depth: 1 } };
        assert_eq!(of(&full), libc::ENOMEM);
        assert_eq!(of(&Error::Verbs(VerbsError::Busy("x".into()))), libc::EBUSY);
    }
}
