//! What the `cm` and `nic` targets' network does to the datagrams in flight, picked by an
//! index the fuzzer chose (any index picks one, modulo how many there are).

/// Takes the one at `index` out of the flight (delivered or lost).
pub(crate) fn take<T>(flight: &mut Vec<T>, index: usize) -> Option<T> {
    (!flight.is_empty()).then(|| flight.remove(index % flight.len()))
}

/// A copy of the one at `index`, which stays in flight (duplicated, or changed on the way).
pub(crate) fn copy<T: Clone>(flight: &[T], index: usize) -> Option<T> {
    (!flight.is_empty()).then(|| flight[index % flight.len()].clone())
}
