//! softrdma-sim: being written.
